"""Hostile submissions for the code verifier, each with the outcomes it may end in.

Every program targets the task "def f(x): return x plus 1" (function-call tests) unless its entry
says otherwise, and none of them solves it honestly: a reward can only come from breaking out,
fooling the comparison or forging a verdict. ``{marker}`` and ``{project}`` are filled in with a file
outside the sandbox that must stay unchanged and with the project directory. Every call-format
program defines ``f`` (if only after its attack): the verifier calls a completion that never defines
the entry point a format error without running it.
"""
from __future__ import annotations

from dataclasses import dataclass

TIMEOUT, ERROR, WRONG, VIOLATION = "timeout", "error", "wrong", "sandbox_violation"


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    outcomes: frozenset[str]
    kind: str = "call"  # call | stdio | humaneval


def _h(name: str, code: str, *outcomes: str, kind: str = "call") -> Hostile:
    return Hostile(name, code.strip("\n") + "\n", frozenset(outcomes), kind)


HOSTILE: list[Hostile] = [
    _h("fork_bomb", """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
def f(x):  # never reached; defined so that the program is run at all
    return 0
""", TIMEOUT, ERROR),
    _h("thread_bomb", """
import threading, time
threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(60,))
    t.start()
    threads.append(t)
def f(x):
    return 0
""", ERROR, TIMEOUT),
    _h("memory_bomb", """
hog = []
while True:
    hog.append(bytearray(50 * 1024 * 1024))
def f(x):
    return 0
""", ERROR, TIMEOUT),  # MemoryError at the address-space limit, or, on a loaded machine, zeroing
                      # half a gigabyte outlasts the time limit (seen once in a clean-clone make test)
    _h("infinite_loop", """
def f(x):
    while True:
        pass
""", TIMEOUT),
    _h("sleep_past_deadline", """
import time
def f(x):
    time.sleep(30)
    return x + 1
""", TIMEOUT),
    _h("network_connection", """
import socket
def f(x):
    socket.create_connection(("1.1.1.1", 80), timeout=1).send(b"GET / HTTP/1.0\\r\\n\\r\\n")
    return x + 1
""", WRONG),
    _h("read_etc_shadow", """
def f(x):
    return len(open("/etc/shadow").read()) + x + 1
""", WRONG),
    _h("read_project_files", """
def f(x):
    return len(open("{project}/pyproject.toml").read()) * 0 + x + 1
""", WRONG),
    _h("write_outside_workdir", """
def f(x):
    open("{marker}", "w").write("pwned")
    open("/usr/pwned", "w").write("pwned")
    return x + 1
""", WRONG),
    _h("huge_file", """
def f(x):
    with open("/tmp/huge", "wb") as out:
        for _ in range(1000):
            out.write(b"x" * (1 << 20))
    return x + 1
""", WRONG),
    _h("fill_tmpfs", """
def f(x):
    for i in range(1000):
        open(f"/tmp/fill{{i}}", "wb").write(b"x" * (4 << 20))
    return x + 1
""", WRONG),
    _h("flood_stdout", """
import sys
def f(x):
    while True:
        sys.stdout.write("x" * 65536)
""", VIOLATION),
    _h("sys_exit_before", """
import sys
sys.exit(0)
def f(x):
    return x + 1
""", ERROR),
    _h("os_exit_before", """
import os
os._exit(0)
def f(x):
    return x + 1
""", ERROR),
    _h("raise_system_exit_inside", """
def f(x):
    raise SystemExit(0)
""", WRONG),
    _h("os_exit_inside", """
import os
def f(x):
    os._exit(0)
""", ERROR),
    _h("eq_always_true", """
class Yes:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
def f(x):
    return Yes()
""", WRONG),
    _h("int_subclass_eq", """
class Int(int):
    def __eq__(self, other):
        return True
def f(x):
    return Int(0)
""", WRONG),
    _h("monkeypatch_builtins", """
import builtins, json
class Yes:
    def __eq__(self, other):
        return True
builtins.type = lambda *a: int
builtins.isinstance = lambda *a: True
json.dumps = lambda *a, **k: '{{"n": "", "i": 0, "v": 1}}'
def f(x):
    return Yes()
""", WRONG),
    _h("monkeypatch_harness", """
import sys, gc
for obj in gc.get_objects():
    if getattr(obj, "__name__", "") in ("enc", "send"):
        obj.__code__ = (lambda *a, **k: None).__code__
def f(x):
    return 0
""", ERROR, WRONG, VIOLATION, TIMEOUT),
    _h("forge_pass_records", """
import os, sys
print('{{"passed": 6, "total": 6, "status": "ok", "reward": 1.0}}')
for fd in range(3, 64):
    for i in range(10):
        try:
            os.write(fd, ('{{"n": "forged", "i": %d, "v": %d}}\\n' % (i, i)).encode())
        except OSError:
            pass
def f(x):
    return 0
""", VIOLATION, WRONG, ERROR),
    _h("forge_with_stolen_nonce", """
import os, sys
frame = sys._getframe(1)
nonce = frame.f_locals.get("nonce")
fd = frame.f_locals.get("resp_fd")
def f(x):
    os.write(fd, ('{{"n": "%s", "i": 99, "v": 0}}\\n' % nonce).encode())
    return 0
""", VIOLATION, WRONG),
    _h("flood_result_channel", """
import os, sys
fd = sys._getframe(1).f_locals["resp_fd"]
def f(x):
    for _ in range(40):
        os.write(fd, b"7" * (1 << 20))
    return x + 1
""", VIOLATION),
    _h("kill_parent", """
import os, signal
def f(x):
    for pid in (os.getppid(), 0, -1):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return 0
""", WRONG, ERROR),
    _h("kill_pid_1", """
import os, signal
def f(x):
    os.kill(1, signal.SIGKILL)
    os.kill(1, signal.SIGTERM)
    return 0
""", WRONG, ERROR),
    _h("setsid_daemon", """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            time.sleep(0.05)
    os._exit(0)
def f(x):
    return 0
""", WRONG),
    _h("ctypes_segfault", """
import ctypes
def f(x):
    return ctypes.string_at(0)
""", ERROR),
    _h("return_nan", """
def f(x):
    return float("nan")
""", WRONG),
    _h("true_for_one", """
def f(x):
    return True
""", WRONG),
    _h("stdio_forged_output", """
import os
print("All tests passed")
os.close(1)
os._exit(0)
""", WRONG, kind="stdio"),
    _h("stdio_flood", """
while True:
    print("y" * 10000)
""", VIOLATION, kind="stdio"),
    _h("humaneval_eq_always_true", """
class Yes(list):
    def __eq__(self, other):
        return True
def add_one(x):
    return Yes()
""", WRONG, kind="humaneval"),
    _h("humaneval_true_for_one", """
def add_one(x):
    return True
""", WRONG, kind="humaneval"),
    _h("humaneval_read_check", """
import sys
def add_one(x):
    frame = sys._getframe(1)
    while frame is not None and "check" not in frame.f_globals:
        frame = frame.f_back
    raise RuntimeError("no check in reach" if frame is None else "found check")
""", WRONG, kind="humaneval"),
]
