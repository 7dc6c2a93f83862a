"""What a training process needs around the recipe: seeding, CPU threads, how the C heap gives memory
back, how many compiled kernels the CPU's bf16 matrix products keep, stopping on a signal, the
library versions a run is stored with, and how to tell the user to go on after a stop."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import ContextManager, Iterator

import numpy as np
import torch

from trainer import distributed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def within_share(threads: int | None) -> int:
    """``threads``, but never more than this rank's share of the cores (None: the whole share):
    ranks (or a rank and its verifier workers) that oversubscribe them spin-wait on each other."""
    share = distributed.core_share()
    return share if threads is None else min(threads, share)


@contextlib.contextmanager
def phase_threads(device: torch.device, threads: int | None, back_to: int | None) -> Iterator[None]:
    """Torch's CPU threads set to ``threads`` for a phase (None: this rank's share of the cores),
    then back to ``back_to`` (the sampling count)."""
    if device.type != "cpu":
        yield
        return
    torch.set_num_threads(within_share(threads))
    try:
        yield
    finally:
        torch.set_num_threads(within_share(back_to))


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it has glibc's ``mallopt`` and ``malloc_trim``; None elsewhere (macOS, Windows, musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def release_freed_memory(threshold_kb: int | None) -> bool:
    """Have glibc serve every allocation of ``threshold_kb`` or more straight from the OS (mmap) and
    hand it back when it is freed, and trim the heap once that much is free at its top.

    Why: glibc starts at 128 KB but raises its threshold to the size of each large block freed, up
    to 32 MB. From then on the sampler's tensors (a KV cache that grows a token at a time, logits of
    a batch that shrinks as rows finish, tool episodes of every length) are carved from the heap
    and freed in sizes later requests cannot reuse, so the resident set grows step after step: on
    the SmolLM2 preset from 5 GB after its first step to 9-10 GB by its twentieth
    (docs/performance.md). A fixed threshold turns that off, but every large tensor then costs fresh
    pages from the kernel: 0.66x the step speed there, so it is an option, not the default. None
    keeps glibc's own behaviour; so does a C library without mallopt (False is returned then)."""
    libc = _glibc() if threshold_kb is not None else None
    if libc is None:
        return False
    size = threshold_kb * 1024
    return bool(libc.mallopt(M_MMAP_THRESHOLD, size)) and bool(libc.mallopt(M_TRIM_THRESHOLD, size))


def cap_kernel_caches(capacity: int | None) -> bool:
    """Keep at most ``capacity`` compiled matrix-product kernels in each of the two caches that bf16
    on the CPU fills: PyTorch's oneDNN wrapper (ideep, ``LRU_CACHE_CAPACITY``) and oneDNN itself
    (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), 1024 each by default.

    Why: under bf16 autocast a CPU matrix product goes through oneDNN, which builds a kernel for each
    new shape and keeps it, with its buffers, in both caches: about 0.7 MB a shape, measured. The
    sampler meets a new shape at every prefill and the update at every micro-batch, so the resident
    set grows by about 0.8 GB until both caches are full, and trimming the heap cannot hand that
    back (docs/performance.md). fp32 goes through other kernels and is unaffected. Too small a cap
    rebuilds the decoding loop's kernels (a shape per batch size) again and again.

    Both libraries read their setting once, at their first bf16 product, so this must run before
    the process's first one; a variable already set in the environment is left as the user set it.
    None keeps the libraries' defaults (False is returned then)."""
    if capacity is None:
        return False
    for name in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))
    return True


def trim_heap() -> bool:
    """Hand every whole free page of the C heap back to the OS now (glibc's ``malloc_trim(0)``,
    which also releases free pages inside the heap, not only at its top); True if any went back.

    Called between a step's phases (``trainer.system.trim_heap``): the fragments one phase leaves
    (see ``release_freed_memory``) stop counting as resident before the next phase, while inside a
    phase freed blocks are still reused without a trip to the kernel. False without glibc."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def resident_gb() -> tuple[float, float]:
    """This process's resident set now and its peak so far, in GB (NaN for "now" off Linux)."""
    import resource  # Unix only: imported here so that importing this module does not need it

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan"), peak
    return pages * resource.getpagesize() / 2**30, peak


# Below this size a CPU step is dispatch and Python, not matrix arithmetic, and bf16's casts do not
# pay (the tiny model: docs/performance.md); it is also the size of every model the tests build.
BF16_MIN_PARAMETERS = 20_000_000


def arithmetic(device: torch.device, dtype: str, parameters: int) -> str:
    """What ``model.dtype`` trains in here: ``bfloat16`` (autocast; weights and optimizer stay fp32)
    or ``float32``. ``auto`` is bf16 where the hardware has it: CUDA, and a CPU with AMX or
    AVX512-BF16 for a model of at least BF16_MIN_PARAMETERS (on the SmolLM2 preset it trained
    faster with held-out success within fp32's seed spread, docs/performance.md)."""
    if dtype != "auto":
        return dtype
    if device.type == "cuda":
        return "bfloat16"
    return "bfloat16" if device.type == "cpu" and cpu_bf16() and parameters >= BF16_MIN_PARAMETERS else "float32"


def autocast(device: torch.device, dtype: str) -> ContextManager:
    """bf16 autocast on CUDA or the CPU for ``bfloat16`` (``arithmetic`` resolves ``model.dtype=auto``
    to it or to ``float32``); full precision otherwise. The weights stay fp32 either way."""
    if dtype == "bfloat16" and device.type in ("cuda", "cpu"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cpu_bf16() -> str | None:
    """The CPU's bf16 matrix instructions, AMX or AVX512-BF16 (named as /proc/cpuinfo names them),
    or None: without them bf16 arithmetic is emulated and slower than fp32."""
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return None
    found = [name for name in ("amx_bf16", "avx512_bf16") if name in flags]
    return "+".join(found) or None


def precision(device: torch.device, dtype: str, parameters: int) -> str:
    """One line for the run's start: the arithmetic it trains in, and why."""
    if device.type == "cuda":
        return "precision: bf16 autocast on CUDA" if dtype != "float32" else "precision: fp32 (model.dtype=float32)"
    has, chosen = cpu_bf16(), arithmetic(device, dtype, parameters)
    if dtype == "bfloat16":
        return f"precision: bf16 autocast on the CPU ({has or 'no bf16 instructions: emulated, slower than fp32'})"
    if chosen == "bfloat16":
        return f"precision: bf16 autocast on the CPU (model.dtype=auto and this CPU has {has}; float32 keeps fp32)"
    if dtype == "auto" and has:
        return (f"precision: fp32 (this CPU has {has}, but a model of {parameters / 1e6:.1f}M parameters is too small "
                f"to gain from it; model.dtype=bfloat16 trains in bf16 autocast)")
    return f"precision: fp32 ({'model.dtype=float32' if dtype == 'float32' else 'this CPU has no bf16 instructions'})"


def resume_hint(path: Path | None) -> str:
    """How to go on: a saved checkpoint's path, or why there is none (other ranks do not save, and a
    model with non-finite weights is never saved)."""
    if path is None:
        return "resume from the last checkpoint saved (none was saved now)"
    return f"resume with resume={path}"


def library_versions() -> dict[str, str]:
    """Versions of what decides rewards and updates, stored with the run for audits."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("palestra", "math-verify", "sympy", "torch", "transformers", "jsonschema"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


class StopOnSignal:
    """Turn SIGTERM/SIGINT into a request to stop after the current step (main thread only)."""

    def __enter__(self) -> "StopOnSignal":
        self.requested = False
        self.signum = signal.SIGINT
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def _request(self, signum, frame) -> None:
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
