"""Run untrusted Python in a bubblewrap sandbox with rlimits, a wall clock and capped output.

Isolation layers, outermost first:

* ``bwrap --unshare-all`` (user, pid, net, ipc, uts, cgroup and mount namespaces): no network
  interfaces but a dead loopback, its own process tree, and a file system built from nothing but a
  read-only ``/usr`` (plus the ``/bin``, ``/lib*`` links), a fresh ``/proc``, a minimal read-only
  ``/dev`` and one size-limited tmpfs at ``/tmp`` — the only writable place. No ``/etc``, no home,
  no project directory. ``--clearenv``, ``--new-session`` (no terminal injection) and
  ``--die-with-parent`` (the sandbox dies with the verifier process).
* When we run as root, bwrap itself is started under a fresh random unprivileged uid for every run
  (``setpriv``, or ``Popen(user=...)``): the sandbox then holds no capabilities, and
  ``RLIMIT_NPROC`` — which the kernel never enforces for root — counts only that run's processes. As an ordinary user the
  sandbox runs under that user's uid and ``nproc`` is added on top of the processes the user already
  has (measured once per process; the kernel counts per uid).
* rlimits (address space, CPU, processes, file size, open files, core dumps) are set by the trusted
  harness (``domains.verify.sandbox_harness``) as its first act inside the sandbox, before it reads the untrusted
  code. Doing it there rather than in a ``preexec_fn`` keeps ``Popen`` safe to call from threads.
* The parent enforces a wall-clock deadline and an output cap; on either it kills the sandbox's
  init (its pid comes from ``--info-fd``), which tears down the whole pid namespace, then bwrap's
  process group. ``--as-pid-1`` makes the harness the namespace's init so bwrap leaves no helper
  process behind that could outlive it as a zombie. Once a caller has every answer it needs,
  ``release()`` leaves the exit (namespace teardown, a few ms) to a background thread that still
  reaps the process and kills it at its deadline.

Why a sandbox start costs ~20 ms and not more: the harness is compiled once per process and sent as
a marshalled code object; requests are ``marshal`` frames, so nothing inside imports ``json`` (and
``re``); the exit is awaited on a pidfd instead of polling.

The interpreter inside is the system ``/usr/bin/python3`` started with ``-S -I -B`` (no site, no
environment, no user paths, no bytecode writes): it lives under the read-only ``/usr`` bind, starts
in ~8 ms, sees only the standard library and does not depend on the project's virtualenv. ``SandboxConfig.python`` may name another
interpreter; its installation prefix is then bound read-only too.

Departure from a container runtime: no seccomp filter and no cgroup memory/pid controller (cgroups
are usually not delegated to us); ``RLIMIT_AS`` and ``RLIMIT_NPROC`` stand in for them.

The limits (``SandboxConfig``) and the command line built from them live in
``domains.verify.sandbox_limits``; this module starts, drives and reaps the sandboxed processes.
"""
from __future__ import annotations

import _thread
import json
import logging
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domains.api import one_line
from domains.verify.sandbox_harness import BOOTSTRAP, compiled_harness, frame
from domains.verify.sandbox_limits import MiB, SandboxConfig, bwrap_argv, nproc_base, rlimits, unprivileged

log = logging.getLogger("palestra.sandbox")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot isolate code on this machine; the code verifier refuses to score."""


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False  # wall clock or CPU limit
    wall_s: float = 0.0
    signal: int | None = None
    answers_truncated: bool = False  # the result channel overflowed (16 MiB or the output cap)

    @property
    def output_limited(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated or self.answers_truncated


# -- one sandboxed harness process ----------------------------------------------------------------
@dataclass
class _Stream:
    fd: int
    cap: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    closed: bool = False


class SandboxProcess:
    """The harness running in a fresh sandbox, driven through pipes by the parent.

    ``unsafe=True`` runs the same harness without bwrap (still with rlimits and a temporary work
    directory): for machines where bwrap cannot work and the user explicitly accepts the risk.
    """

    def __init__(self, config: SandboxConfig, header: dict[str, Any], stdin: bytes = b"", unsafe: bool = False):
        self.config = config
        self.nonce = secrets.token_hex(16)
        self.start = time.monotonic()
        self.deadline = self.start + config.wall_timeout_s
        self.timed_out = False
        self._inner_pid: int | None = None
        self._workdir: str | None = None
        self._pending_stdin = bytearray(stdin)
        self._spawn(header, unsafe)

    # -- start ----------------------------------------------------------------------------------
    def _spawn(self, header: dict[str, Any], unsafe: bool) -> None:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        info_r, info_w = os.pipe()
        limits = ",".join(map(str, rlimits(self.config, nproc_base())))
        inner = [self.config.python, "-S", "-I", "-B", "-c", BOOTSTRAP, str(req_r), str(resp_w), limits]
        if unsafe:
            self._workdir = tempfile.mkdtemp(prefix="palestra-unsafe-")
            os.chmod(self._workdir, 0o777)
            argv, fds, env = inner, (req_r, resp_w), {"PATH": "/usr/bin:/bin"}
        else:
            argv, fds, env = bwrap_argv(self.config, info_w) + inner, (req_r, resp_w, info_w), {}
        argv, kwargs, self.uid = unprivileged(argv)
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=fds, start_new_session=True, env=env, cwd=self._workdir, **kwargs,
            )
        finally:
            for fd in (req_r, resp_w, info_w):
                os.close(fd)
        self._req = req_w
        self._resp = _Stream(resp_r, max(16 * MiB, self.config.output_bytes))  # answers can be big
        self._info = _Stream(-1 if unsafe else info_r, 4096, closed=unsafe)
        if unsafe:
            os.close(info_r)
        self._out = _Stream(self.proc.stdout.fileno(), self.config.output_bytes)
        self._err = _Stream(self.proc.stderr.fileno(), self.config.output_bytes)
        self._sel = selectors.DefaultSelector()
        for stream in (self._resp, self._out, self._err) + (() if unsafe else (self._info,)):
            os.set_blocking(stream.fd, False)
            self._sel.register(stream.fd, selectors.EVENT_READ, stream)
        self._exited = False
        self._pidfd = _pidfd(self.proc.pid)  # readable once bwrap exits: no polling with sleeps
        if self._pidfd is not None:
            self._sel.register(self._pidfd, selectors.EVENT_READ, "exit")
        self._stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self._stdin_fd, False)
        self._sel.register(self._stdin_fd, selectors.EVENT_WRITE, "stdin")
        os.set_blocking(self._req, False)
        self._pending_req = bytearray()
        self._req_registered = False
        self._pending_req += frame(compiled_harness(self.config.python))
        self.send({**header, "nonce": self.nonce})

    # -- talk -----------------------------------------------------------------------------------
    def send(self, message: Any) -> bool:
        """Queue one request frame and push it out; False when the harness is gone or time is up."""
        if self._req is None:
            return False
        self._pending_req += frame(marshal.dumps(message))
        if not self._req_registered:
            self._sel.register(self._req, selectors.EVENT_WRITE, "req")
            self._req_registered = True
        return self._pump(until=lambda: not self._pending_req) and self._req is not None

    def recv(self) -> dict[str, Any] | None:
        """The next response line from the harness; None on exit, deadline or output overflow."""
        self._pump(until=lambda: b"\n" in self._resp.data or self._resp.closed)
        if b"\n" not in self._resp.data:
            return None
        line, _, rest = bytes(self._resp.data).partition(b"\n")
        self._resp.data = bytearray(rest)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # e.g. a forged line nested 100 000 deep
            return {"malformed": True}
        return message if isinstance(message, dict) else {"malformed": True}

    def _pump(self, until) -> bool:
        """Move bytes until ``until()`` holds (True) or the deadline / the output cap hits (False)."""
        while not until():
            if self._over_limit():
                return False
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return False
            events = self._sel.select(timeout=min(remaining, 0.5 if self._pidfd is not None else 0.005))
            if not events and self._all_closed() and self.proc.poll() is not None:
                return until()  # nothing more can arrive
            for key, _ in events:
                if key.data == "exit":
                    self._exited = True
                    self._sel.unregister(self._pidfd)
                elif key.data == "stdin":
                    self._feed_stdin()
                elif key.data == "req":
                    self._feed_req()
                else:
                    self._read(key.data)
        return True

    def _feed_req(self) -> None:
        try:
            written = os.write(self._req, self._pending_req[:65536])
            del self._pending_req[:written]
        except BlockingIOError:
            return
        except OSError:  # the harness closed its end (script mode, or it died)
            self._pending_req.clear()
            self._close_fd("_req")
            return
        if not self._pending_req:
            self._sel.unregister(self._req)
            self._req_registered = False

    def _over_limit(self) -> bool:
        return self._out.truncated or self._err.truncated or self._resp.truncated

    def _all_closed(self) -> bool:
        return self._resp.closed and self._out.closed and self._err.closed

    def _read(self, stream: _Stream) -> None:
        try:
            chunk = os.read(stream.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            stream.closed = True
            self._sel.unregister(stream.fd)
            if stream is self._info:
                self._note_inner_pid()
            return
        room = stream.cap - len(stream.data)
        stream.data += chunk[:room]
        if len(chunk) > room:
            stream.truncated = True

    def _read_info(self, wait_s: float) -> None:
        end = time.monotonic() + wait_s
        while not self._info.closed and time.monotonic() < end:
            for key, _ in self._sel.select(timeout=0.05):
                if isinstance(key.data, _Stream):
                    self._read(key.data)

    def _note_inner_pid(self) -> None:
        try:
            self._inner_pid = int(json.loads(bytes(self._info.data))["child-pid"])
        except (ValueError, KeyError, TypeError):
            self._inner_pid = None

    def _feed_stdin(self) -> None:
        if self.proc.stdin.closed:
            return
        try:
            if self._pending_stdin:
                written = os.write(self._stdin_fd, self._pending_stdin[:65536])
                del self._pending_stdin[:written]
                if self._pending_stdin:
                    return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._sel.unregister(self._stdin_fd)
        self.proc.stdin.close()

    # -- finish ---------------------------------------------------------------------------------
    def finish(self) -> SandboxResult:
        """Close the request channel, let the harness exit (or kill it at the deadline), reap."""
        self._close_fd("_req")
        self._pump(until=lambda: self._out.closed and self._err.closed and self._stdin_done() and self._has_exited())
        self.kill()
        return self._result()

    def release(self) -> None:
        """The caller has every answer it needs: close the request channel and let a background
        thread wait for the exit (namespace teardown costs a few ms per run) and reap; the
        sandbox is still killed at its deadline if it lingers."""
        self._close_fd("_req")
        _thread.start_new_thread(self._finish_quietly, ())  # not threading.Thread: its start() waits ~1 ms

    def _finish_quietly(self) -> None:
        try:
            self.finish()
        except Exception:  # nobody waits for this thread: log rather than print to stderr
            log.exception("reaping a sandbox failed")

    def _has_exited(self) -> bool:
        return self._exited or (self._pidfd is None and self.proc.poll() is not None)

    def _stdin_done(self) -> bool:
        return self.proc.stdin.closed

    def kill(self) -> None:
        """Kill the sandbox's init (taking its whole pid namespace along), then bwrap; reap."""
        if self.proc.poll() is None:
            if self._inner_pid is None and not self._info.closed:
                self._read_info(wait_s=0.5)  # bwrap writes it right after clone
            if self._inner_pid is not None and _kill_if_child_of(self._inner_pid, self.proc.pid):
                try:  # let bwrap reap its child: killed first, it would leave a zombie to init
                    self.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self._close_fd("_req")
        for stream in (self._resp, self._info):
            self._close_stream(stream)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._sel.close()
        self.proc.stdout.close()
        self.proc.stderr.close()
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _close_fd(self, attr: str) -> None:
        fd = getattr(self, attr)
        if fd is not None:
            if attr == "_req" and self._req_registered:
                self._sel.unregister(fd)
                self._req_registered = False
            os.close(fd)
            setattr(self, attr, None)

    def _close_stream(self, stream: _Stream) -> None:
        if stream.fd >= 0:
            try:
                os.close(stream.fd)
            except OSError:
                pass
            stream.fd = -1

    def _result(self) -> SandboxResult:
        code = self.proc.returncode
        sig = -code if code is not None and code < 0 else (code - 128 if code and code > 128 else None)
        cpu_killed = sig == signal.SIGKILL and not self._over_limit() and not self.timed_out
        return SandboxResult(
            returncode=code, stdout=bytes(self._out.data), stderr=bytes(self._err.data),
            stdout_truncated=self._out.truncated, stderr_truncated=self._err.truncated,
            answers_truncated=self._resp.truncated,
            timed_out=self.timed_out or cpu_killed, wall_s=time.monotonic() - self.start, signal=sig,
        )

    def __enter__(self) -> "SandboxProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.kill()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python without it, or a kernel older than 5.3
        return None


def _kill_if_child_of(pid: int, parent: int) -> bool:
    """SIGKILL ``pid`` if it is still ``parent``'s child (guards against a recycled pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            os.kill(pid, signal.SIGKILL)
            return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def run_script(config: SandboxConfig, code: str, stdin: bytes = b"", unsafe: bool = False) -> SandboxResult:
    """Run ``code`` as a script on ``stdin`` in a fresh sandbox; the parent reads its stdout."""
    with SandboxProcess(config, {"mode": "script", "code": code}, stdin=stdin, unsafe=unsafe) as proc:
        return proc.finish()


# -- start-up self-test ---------------------------------------------------------------------------
_PROBE = r"""
import os, socket, json
checks = {"uid_not_root": os.getuid() != 0, "no_etc": not os.path.exists("/etc/passwd")}
checks["no_host_files"] = not any(os.path.exists(p) for p in %r)
try:
    socket.create_connection(("1.1.1.1", 53), timeout=0.5); checks["no_network"] = False
except OSError:
    checks["no_network"] = True
try:
    open("/usr/palestra-probe", "w"); checks["ro_usr"] = False
except OSError:
    checks["ro_usr"] = True
open("/tmp/probe", "w").write("ok")
checks["tmp_writable"] = open("/tmp/probe").read() == "ok"
print(json.dumps(checks))
"""

_SELF_TEST: dict[tuple[str, str], str | None] = {}


def self_test(config: SandboxConfig) -> None:
    """Check once per process (per interpreter) that the sandbox isolates; raise SandboxUnavailable."""
    key = (config.bwrap, config.python)
    if key not in _SELF_TEST:
        _SELF_TEST[key] = _probe(config)
    if _SELF_TEST[key]:
        raise SandboxUnavailable(_SELF_TEST[key])


def _probe(config: SandboxConfig) -> str | None:
    if shutil.which(config.bwrap) is None:
        return f"{config.bwrap!r} not found (install the 'bubblewrap' package)"
    if not os.access(config.python, os.X_OK):
        return f"sandbox interpreter {config.python!r} not found"
    probe_config = config.model_copy(update={"wall_timeout_s": 10.0, "cpu_s": max(config.cpu_s, 2)})
    host_dir = tempfile.mkdtemp(prefix="palestra-probe-")  # a host file the sandbox must not see
    Path(host_dir, "marker").write_text("host")
    hidden = [str(Path(host_dir, "marker")), *_project_paths()]
    try:
        result = run_script(probe_config, _PROBE % (hidden,))
    except Exception as exc:  # any failure to start means: not isolated
        return f"sandbox self-test could not run: {type(exc).__name__}: {one_line(exc)}"
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    err = " ".join(result.stderr.decode(errors="replace").split())[-300:]  # bwrap says why it could not start
    try:
        checks = json.loads(result.stdout)
    except ValueError:
        return f"sandbox self-test failed: exit {result.returncode}, no report from inside: {err or 'no error output'}"
    failed = [name for name, ok in checks.items() if not ok]
    if result.returncode != 0 or failed:
        return f"sandbox self-test failed: {failed or 'exit ' + str(result.returncode)} {err}".strip()
    return None


def _project_paths() -> list[str]:
    """This project's source files, unless installed under /usr (then visible read-only, as all of /usr)."""
    here = Path(__file__).resolve()
    return [] if str(here).startswith("/usr/") else [str(here)]


def python_version_inside(config: SandboxConfig) -> str:
    """Which Python runs the sandboxed code (for logs and the README)."""
    result = run_script(config, "import sys; print(sys.version.split()[0])")
    return result.stdout.decode().strip()


if __name__ == "__main__":  # python -m domains.verify.sandbox: run the self-test and say what it found
    cfg = SandboxConfig()
    try:
        self_test(cfg)
        print(f"sandbox ok (python {python_version_inside(cfg)} at {cfg.python})")
    except SandboxUnavailable as exc:
        print(f"sandbox unavailable: {exc}", file=sys.stderr)
        sys.exit(1)
