"""The sandbox's limits and command line: ``SandboxConfig`` (the ``sandbox:`` options of a code
domain), the rlimits the harness sets inside, the ``bwrap`` argv, and how a run is started under a
fresh unprivileged uid when we are root. ``domains.verify.sandbox`` starts processes with these; see
its docstring for the isolation layers and why each is there.
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from domains.config import StrictModel

MiB = 1 << 20


class SandboxConfig(StrictModel):
    """Per-domain sandbox limits (nested under a code domain's options as ``sandbox:``)."""

    wall_timeout_s: float = Field(2.0, gt=0)  # per sandboxed process, enforced by the parent
    cpu_s: int = Field(1, ge=1)  # RLIMIT_CPU: SIGKILL once this much CPU time is used
    memory_mb: int = Field(512, ge=64)  # RLIMIT_AS (address space) per process
    nproc: int = Field(16, ge=1)  # RLIMIT_NPROC: processes + threads of the run
    file_size_mb: int = Field(8, ge=1)  # RLIMIT_FSIZE: largest file the program may write
    open_files: int = Field(64, ge=16)  # RLIMIT_NOFILE
    tmpfs_mb: int = Field(16, ge=1)  # size of /tmp, the only writable place
    output_bytes: int = Field(MiB, ge=1024)  # cap on stdout and on stderr, each
    python: str = "/usr/bin/python3"  # interpreter inside the sandbox
    bwrap: str = "bwrap"


# -- the sandbox command line ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _system_binds() -> tuple[str, ...]:
    """/usr read-only, and /bin, /lib* the same way the host has them (symlinks on merged-/usr)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    return tuple(args)


@functools.lru_cache(maxsize=None)
def _python_binds(python: str) -> tuple[str, ...]:
    """Bind the interpreter's installation prefix when it lives outside /usr."""
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return ()
    prefix = str(Path(real).parent.parent)
    return ("--ro-bind", prefix, prefix)


def rlimits(config: SandboxConfig, nproc_base: int = 0) -> list[int]:
    """AS, CPU, NPROC, FSIZE, NOFILE, CORE — the order the harness reads them in."""
    return [
        config.memory_mb * MiB,  # address space
        config.cpu_s,  # soft == hard: the kernel sends SIGKILL, which pid 1 cannot ignore
        nproc_base + config.nproc,
        config.file_size_mb * MiB,
        config.open_files,
        0,  # no core dumps
    ]


def bwrap_argv(config: SandboxConfig, info_fd: int) -> list[str]:
    # bwrap by its full path: it starts with an empty environment, so no PATH would find a bwrap
    # that lives outside /bin and /usr/bin (a conda or Nix install, say)
    return [
        _which(config.bwrap) or config.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LC_ALL", "C.UTF-8",
        *_system_binds(), *_python_binds(config.python),
        "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--size", str(config.tmpfs_mb * MiB), "--tmpfs", "/tmp", "--chdir", "/tmp",
        "--hostname", "sandbox", "--info-fd", str(info_fd),
    ]


def _fresh_uid() -> int:
    """A uid no account uses, fresh for every run (only used when we are root)."""
    return 1_500_000_000 + secrets.randbelow(500_000_000)


@functools.lru_cache(maxsize=None)
def _which(tool: str) -> str | None:
    return shutil.which(tool)


def unprivileged(argv: list[str]) -> tuple[list[str], dict[str, Any], int]:
    """As root, run ``argv`` under a fresh uid with no groups: through ``setpriv`` when it exists
    (Popen can then use vfork, ~1 ms cheaper per start than the fork that ``Popen(user=...)``
    needs), else through Popen's own ``user``/``group``. Otherwise unchanged."""
    if os.getuid() != 0:
        return argv, {}, os.getuid()
    uid = _fresh_uid()
    setpriv = _which("setpriv")
    if setpriv:
        return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], {}, uid
    return argv, {"user": uid, "group": uid, "extra_groups": []}, uid


_NPROC_BASE: dict[int, int] = {}


def nproc_base() -> int:
    """Processes (threads included) this uid already has: RLIMIT_NPROC counts them too."""
    uid = os.getuid()
    if uid == 0:
        return 0
    if uid not in _NPROC_BASE:
        count = 0
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            if f"\nUid:\t{uid}\t" in text:
                count += int(text.split("\nThreads:\t")[1].split()[0])
        _NPROC_BASE[uid] = count + 64  # headroom for the threads the caller may add later
    return _NPROC_BASE[uid]
