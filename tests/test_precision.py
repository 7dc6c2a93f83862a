"""model.dtype: which arithmetic a run trains in on the CPU, and the line that says so."""
import torch

import trainer.runtime as runtime
from trainer.runtime import autocast, cpu_bf16, precision

CPU = torch.device("cpu")


def test_bfloat16_autocasts_the_cpu_and_auto_stays_fp32():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(CPU, "bfloat16"):
        assert (a @ b).dtype == torch.bfloat16
    for dtype in ("auto", "float32"):
        with autocast(CPU, dtype):
            assert (a @ b).dtype == torch.float32


def test_the_first_lines_say_what_the_cpu_has_and_what_the_run_does(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    assert precision(CPU, "auto") == "precision: fp32 (this CPU has no bf16 instructions)"
    assert "emulated, slower than fp32" in precision(CPU, "bfloat16")
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: "amx_bf16+avx512_bf16")
    assert precision(CPU, "auto") == ("precision: fp32 (this CPU has amx_bf16+avx512_bf16: model.dtype=bfloat16 "
                                      "trains in bf16 autocast)")
    assert precision(CPU, "bfloat16") == "precision: bf16 autocast on the CPU (amx_bf16+avx512_bf16)"
    assert precision(CPU, "float32") == "precision: fp32 (model.dtype=float32)"


def test_the_cpu_flags_are_read_from_proc_cpuinfo():
    flags = open("/proc/cpuinfo").read()
    expected = [name for name in ("amx_bf16", "avx512_bf16") if f" {name}" in flags]
    assert cpu_bf16() == ("+".join(expected) or None)
