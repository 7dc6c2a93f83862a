"""The bubblewrap sandbox on its own: isolation, limits, output caps, the self-test and fail-closed."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from domains.api import Status, Task
from domains.code.verifier import CodeConfig, verify_code
from domains.verify.sandbox import SandboxConfig, SandboxProcess, SandboxUnavailable, _SELF_TEST, run_script, self_test
from domains.verify.sandbox_harness import decode_value

pytestmark = pytest.mark.sandbox  # every test here runs code under bubblewrap

FAST = SandboxConfig(wall_timeout_s=2.0, cpu_s=1)


@pytest.fixture(scope="module", autouse=True)
def sandbox_works():
    try:
        self_test(SandboxConfig())
    except SandboxUnavailable as exc:
        pytest.fail(f"the code sandbox does not work here ({exc}); `make system-deps` installs bubblewrap")


def run(code: str, config: SandboxConfig = FAST, stdin: bytes = b""):
    return run_script(config, code, stdin)


def probe(expr_code: str) -> object:
    """Run code that prints one JSON value; return it."""
    result = run(expr_code)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


# -- what the program sees ------------------------------------------------------------------------
def test_runs_code_with_stdin_and_captures_output():
    result = run("import sys; print(sys.stdin.read().upper(), end='')", stdin=b"hello")
    assert (result.returncode, result.stdout, result.timed_out, result.output_limited) == (0, b"HELLO", False, False)


def test_environment_is_cleared_and_uid_is_unprivileged():
    seen = probe("import os, json; print(json.dumps([dict(os.environ), os.getuid(), "
                 "open('/proc/self/status').read().split('CapEff:')[1].split()[0]]))")
    env, uid, cap_eff = seen
    assert set(env) <= {"PATH", "LC_ALL", "PWD", "LC_CTYPE"}
    assert uid != 0
    assert int(cap_eff, 16) == 0  # no capabilities at all


def test_only_system_directories_are_visible_and_read_only(tmp_path):
    (tmp_path / "secret").write_text("host file")
    seen = probe(
        "import os, json\n"
        "def writable(p):\n"
        "    try:\n        open(p, 'w').close(); return True\n    except OSError:\n        return False\n"
        f"print(json.dumps([sorted(os.listdir('/')), os.path.exists({str(tmp_path / 'secret')!r}),"
        " os.path.exists('/etc/shadow'), writable('/usr/x'), writable('/dev/x'), writable('/tmp/x')]))"
    )
    root, sees_host_file, sees_shadow, usr_w, dev_w, tmp_w = seen
    assert set(root) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "proc", "dev", "tmp"}
    assert not sees_host_file and not sees_shadow
    assert (usr_w, dev_w, tmp_w) == (False, False, True)


def test_no_network_interfaces_but_loopback():
    lines = probe("import json; print(json.dumps(open('/proc/net/dev').read().splitlines()[2:]))")
    assert [line.split(":")[0].strip() for line in lines] in ([], ["lo"])
    result = run("import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert result.returncode != 0 and b"unreachable" in result.stderr.lower()


def test_sees_only_its_own_processes():
    pids = probe("import os, json; print(json.dumps([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert pids == ["1"]


# -- limits ---------------------------------------------------------------------------------------
def test_wall_clock_timeout_kills_a_sleeper():
    start = time.monotonic()
    result = run("import time; time.sleep(30)", SandboxConfig(wall_timeout_s=0.5))
    assert result.timed_out and time.monotonic() - start < 10  # far from the 30 s sleep, on a busy machine too


def test_cpu_limit_kills_a_busy_loop():
    result = run("while True: pass", SandboxConfig(wall_timeout_s=60, cpu_s=1))
    assert result.timed_out and result.wall_s < 30  # one CPU second, long before the wall clock's 60


def test_stdout_is_capped_and_flagged():
    result = run("import sys\nwhile True: sys.stdout.write('x' * 4096)", SandboxConfig(output_bytes=10_000))
    assert result.stdout_truncated and len(result.stdout) == 10_000 and not result.stderr_truncated


def test_stderr_is_capped_separately():
    result = run("import sys; sys.stderr.write('e' * 50_000); print('fine')", SandboxConfig(output_bytes=4096))
    assert result.stderr_truncated and len(result.stderr) == 4096


def test_tmpfs_is_size_limited():
    result = run("open('/tmp/f', 'wb').write(b'x' * (3 << 20))", SandboxConfig(tmpfs_mb=2, file_size_mb=8))
    assert b"No space left" in result.stderr


def test_file_size_limit():
    result = run("open('/tmp/f', 'wb').write(b'x' * (3 << 20))", SandboxConfig(file_size_mb=1))
    assert b"File too large" in result.stderr


def test_memory_limit():
    result = run("x = bytearray(400 << 20)", SandboxConfig(memory_mb=128))
    assert result.returncode != 0 and b"MemoryError" in result.stderr


def test_process_limit_stops_thread_and_fork_bombs():
    code = (
        "import threading, time, os\nn = 0\n"
        "try:\n    while True:\n        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n    print(n, flush=True)\n    os._exit(0)\n"
    )
    result = run(code, SandboxConfig(nproc=8))
    assert result.returncode == 0 and int(result.stdout) < 8


def test_open_files_limit():
    code = "fs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError:\n    print(len(fs))"
    assert int(run(code, SandboxConfig(open_files=32)).stdout) < 32


def test_config_rejects_unknown_and_silly_limits():
    with pytest.raises(ValidationError):
        SandboxConfig(wall_timeout=3)
    with pytest.raises(ValidationError):
        SandboxConfig(memory_mb=1)
    assert CodeConfig(sandbox={"cpu_s": 3}).sandbox.cpu_s == 3
    with pytest.raises(ValidationError, match="below verify_timeout_s"):
        CodeConfig(sandbox={"wall_timeout_s": 30}, verify_timeout_s=20)


# -- value transport ------------------------------------------------------------------------------
def test_values_cross_the_channel_with_their_types():
    """Arguments in (marshal) and answers out (tagged JSON) keep tuple, set, bool and big int apart."""
    values = [1, True, None, 2.5, float("inf"), "s\u00e9\n", [1, (2, 3)], {1: "a", "b": [True]}, {4, 5}, 10**30]
    proc = SandboxProcess(FAST, {"mode": "call", "code": "def f(x):\n    return x", "entry": "f"})
    assert proc.recv()["load"] is None
    for index, value in enumerate(values):
        assert proc.send((index, (value,), {}))
        reply = proc.recv()
        assert reply["n"] == proc.nonce and reply["i"] == index
        back = decode_value(reply["v"])
        want = frozenset(value) if isinstance(value, set) else value
        assert back == want and type(back) is type(want)
    assert proc.finish().returncode == 0


def test_unplain_return_values_are_refused_inside():
    proc = SandboxProcess(FAST, {"mode": "call", "code": "class A(int): pass\ndef f():\n    return [A(1)]", "entry": "f"})
    proc.recv()
    proc.send((0, (), {}))
    assert proc.recv()["e"] == "TypeError: returned a A, not plain data"
    proc.finish()


# -- self-test and fail-closed --------------------------------------------------------------------
def test_self_test_is_cached_per_interpreter():
    self_test(SandboxConfig())
    assert _SELF_TEST[("bwrap", "/usr/bin/python3")] is None


def _task() -> Task:
    cases = [{"args": [1], "expected": 2}]
    return Task("code_functions", 1, [], {"format": "call", "entry_point": "f", "cases": cases})


def test_refuses_to_score_when_the_sandbox_cannot_work():
    broken = SandboxConfig(bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="not found"):
        self_test(broken)
    result = verify_code(CodeConfig(sandbox=broken), _task().payload, "def f(x):\n return x+1")
    assert result.status is Status.ERROR and result.reward == 0
    assert "refusing to score" in result.details["message"] and "unsafe_no_sandbox" in result.details["message"]


@pytest.fixture
def readable_dir():
    """A folder anyone may read: run as root, bwrap starts under an unprivileged uid."""
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_sandbox_that_cannot_start_says_why_and_the_log_says_it_once(readable_dir, caplog):
    # a bwrap that fails the way it does where user namespaces are not allowed
    fake = readable_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    config = CodeConfig(sandbox=SandboxConfig(bwrap=str(fake)))
    with pytest.raises(SandboxUnavailable, match="exit 1, no report from inside: bwrap: No permissions"):
        self_test(config.sandbox)
    with caplog.at_level(logging.ERROR, logger="palestra.code"):
        results = [verify_code(config, _task().payload, "def f(x):\n return x+1") for _ in range(3)]
    assert all(r.status is Status.ERROR and "No permissions" in r.details["message"] for r in results)
    assert sum("refusing to score" in r.message for r in caplog.records) == 1


def test_a_bwrap_found_on_path_outside_usr_bin_is_started_by_its_full_path(readable_dir, monkeypatch):
    # the sandbox starts with an empty environment, so a bare name would be looked up in /bin and
    # /usr/bin only (seen on a GPU machine whose bwrap came from an unpacked package)
    shutil.copy(shutil.which("bwrap"), readable_dir / "bwrap-elsewhere")
    monkeypatch.setenv("PATH", f"{readable_dir}{os.pathsep}{os.environ['PATH']}")
    result = run_script(SandboxConfig(bwrap="bwrap-elsewhere"), "print(6 * 7)")
    assert result.returncode == 0 and result.stdout == b"42\n"


def test_unsafe_mode_scores_without_bwrap_and_warns_every_call(caplog):
    config = CodeConfig(sandbox=SandboxConfig(bwrap="/nonexistent/bwrap"), unsafe_no_sandbox=True)
    with caplog.at_level(logging.WARNING, logger="palestra.code"):
        first = verify_code(config, _task().payload, "def f(x):\n return x+1")
        second = verify_code(config, _task().payload, "def f(x):\n return x")
    assert first.reward == 1.0 and first.details["unsafe_no_sandbox"] is True
    assert second.reward == 0.0
    assert sum("WITHOUT isolation" in r.message for r in caplog.records) == 2
