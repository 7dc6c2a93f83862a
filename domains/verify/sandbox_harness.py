"""The trusted program that runs first inside the sandbox, and the wire format it speaks.

The parent (``domains.verify.sandbox``) starts ``python -c BOOTSTRAP``, sends the harness as a marshalled
code object, then length-prefixed request frames; the harness answers with tagged JSON values that
``decode_value`` turns back into plain Python data.
"""
from __future__ import annotations

import functools
import subprocess
from typing import Any


# The trusted program that runs first inside the sandbox. argv: request fd, response fd, rlimits.
# It lowers its own rlimits, reads a header frame ({"mode", "code", "entry", "nonce"}) from the
# request fd, then either
#   mode "script": closes both channels and runs the code as __main__ on the real stdin/stdout, or
#   mode "call":   runs the code as a module, then answers one request frame (index, args, kwargs)
#                  at a time with a JSON line {"n": nonce, "i", "v": tagged value} or {"n", "i", "e"}.
# Requests are length-prefixed ``marshal`` frames: they come only from the parent, marshal keeps
# tuple/set/bool/int types exactly, and it is built in — importing json (and with it re) would add
# ~10 ms to every sandbox start. Answers go the other way as JSON, which the parent parses safely.
# Values are tagged (tuple/set/dict/non-finite float keep their type, bool stays distinct from
# int) and only exact plain types are accepted: a returned object with a custom __eq__ is refused
# before it can reach the comparison in the parent. Every helper is bound before the untrusted code
# runs, so rebinding builtins afterwards does not change what the harness does; and since the
# parent compares, a forged answer line is worth no more than returning that value from the function.
HARNESS = r'''
import sys, os, marshal, resource, _json
def _harness():
    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    for name, value in zip(("AS", "CPU", "NPROC", "FSIZE", "NOFILE", "CORE"), sys.argv[3].split(",")):
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(value), int(value)))
    reader = os.fdopen(req_fd, "rb")
    def frame():
        size = reader.read(4)
        return marshal.loads(reader.read(int.from_bytes(size, "big"))) if len(size) == 4 else None
    header = frame()
    nonce, code, mode = header["nonce"], header["code"], header["mode"]
    # From here on only captured references: the untrusted code may rebind builtins or modules.
    T, I, F, S, B, N = tuple, int, float, str, bool, type(None)
    L, D, ST, FS, typ = list, dict, set, frozenset, type
    esc, irepr, frepr, inf = _json.encode_basestring_ascii, I.__repr__, F.__repr__, F("inf")
    write, join, BaseExc = os.write, ",".join, BaseException
    def enc(x, depth=0):
        t = typ(x)
        if depth > 50: raise ValueError("value nested too deeply")
        if t is B or t is N or t is S: return x
        if t is I: return x if -2**53 < x < 2**53 else {"I": irepr(x)}
        if t is F: return x if x == x and x != inf and x != -inf else {"F": frepr(x)}
        if t is L: return [enc(v, depth + 1) for v in x]
        if t is T: return {"T": [enc(v, depth + 1) for v in x]}
        if t is ST or t is FS: return {"S": [enc(v, depth + 1) for v in x]}
        if t is D: return {"D": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]}
        raise TypeError("returned a " + S(t.__name__) + ", not plain data")
    def js(x):
        t = typ(x)
        if t is S: return esc(x)
        if t is B: return "true" if x else "false"
        if t is N: return "null"
        if t is I: return irepr(x)
        if t is F: return frepr(x)
        if t is L: return "[" + join([js(v) for v in x]) + "]"
        return "{" + join([esc(k) + ":" + js(v) for k, v in x.items()]) + "}"
    def describe(e):
        try:
            msg = S(e)[:300]
            return S(typ(e).__name__) + (": " + msg if msg else "")
        except BaseExc:
            return "exception"
    def send(obj):
        data = (js(obj) + "\n").encode()
        while data:
            data = data[write(resp_fd, data):]
    if mode == "script":
        reader.close(); os.close(resp_fd)
        del reader
        globs = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(code, "<solution>", "exec"), globs)
        return
    module = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<solution>", "exec"), module)
        entry = header["entry"]
        if entry in module:
            fn = module[entry]
        elif "Solution" in module:  # a LeetCode-style starter: the entry is a method
            fn = getattr(module["Solution"](), entry)
        else:
            raise NameError("name '" + entry + "' is not defined")
    except BaseExc as e:
        send({"n": nonce, "load": describe(e)}); return
    send({"n": nonce, "load": None})
    while True:
        request = frame()
        if request is None:
            return
        index, args, kwargs = request
        try:
            out = {"n": nonce, "i": index, "v": enc(fn(*args, **kwargs))}
        except BaseExc as e:
            out = {"n": nonce, "i": index, "e": describe(e)}
        try: send(out)
        except BaseExc as e: send({"n": nonce, "i": index, "e": describe(e)})
_harness()
'''


# What ``python -c`` runs: read the harness's code object, compiled once per process by the very
# interpreter of the sandbox (``compiled_harness``), as the first frame of the request pipe. This
# saves compiling the harness source on every start (~2 ms of CPU each).
BOOTSTRAP = """
import sys, os, marshal
def _read(n, fd=int(sys.argv[1])):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise SystemExit(3)
        data += chunk
    return data
exec(marshal.loads(_read(int.from_bytes(_read(4), "big"))))
"""


@functools.lru_cache(maxsize=None)
def compiled_harness(python: str) -> bytes:
    """HARNESS compiled and marshalled by ``python`` itself (code objects differ between versions)."""
    compile_it = "import sys, marshal; sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), '<harness>', 'exec')))"
    done = subprocess.run([python, "-S", "-I", "-B", "-c", compile_it], input=HARNESS.encode(),
                          capture_output=True, timeout=30, check=True)
    return done.stdout


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def decode_value(x: Any) -> Any:
    """Rebuild a value the harness sent back; anything malformed raises ValueError."""
    if isinstance(x, list):
        return [decode_value(v) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError("malformed tagged value")
    (tag, v), = x.items()
    if tag == "I":
        return int(v)
    if tag == "F":
        return float(v)
    if tag == "T":
        return tuple(decode_value(e) for e in v)
    if tag == "S":
        return frozenset(decode_value(e) for e in v)
    if tag == "D":
        return {_hashable(decode_value(k)): decode_value(w) for k, w in v}
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
