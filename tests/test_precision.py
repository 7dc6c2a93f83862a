"""model.dtype: which arithmetic a run trains in on the CPU, and the line that says so."""
import torch

import trainer.runtime as runtime
from trainer.runtime import BF16_MIN_PARAMETERS, arithmetic, autocast, cpu_bf16, precision

CPU = torch.device("cpu")
SMOLLM2, TINY = 134_515_008, 800_000  # parameters


def test_bfloat16_autocasts_the_cpu_and_float32_does_not():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(CPU, "bfloat16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(CPU, "float32"):
        assert (a @ b).dtype == torch.float32


def test_auto_is_bf16_for_a_real_model_on_a_cpu_with_bf16_instructions(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: "amx_bf16+avx512_bf16")
    assert arithmetic(CPU, "auto", SMOLLM2) == "bfloat16"
    assert arithmetic(CPU, "auto", TINY) == "float32"  # too small to gain; the tests' models stay fp32
    assert arithmetic(CPU, "auto", BF16_MIN_PARAMETERS) == "bfloat16"
    assert arithmetic(CPU, "float32", SMOLLM2) == "float32"
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    assert arithmetic(CPU, "auto", SMOLLM2) == "float32"  # emulated bf16 would be slower
    assert arithmetic(CPU, "bfloat16", TINY) == "bfloat16"  # asked for: done, even where it is slow


def test_the_first_lines_say_what_the_cpu_has_and_what_the_run_does(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    assert precision(CPU, "auto", SMOLLM2) == "precision: fp32 (this CPU has no bf16 instructions)"
    assert "emulated, slower than fp32" in precision(CPU, "bfloat16", SMOLLM2)
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: "amx_bf16+avx512_bf16")
    assert precision(CPU, "auto", SMOLLM2) == ("precision: bf16 autocast on the CPU (model.dtype=auto and this CPU "
                                               "has amx_bf16+avx512_bf16; float32 keeps fp32)")
    assert precision(CPU, "auto", TINY) == ("precision: fp32 (this CPU has amx_bf16+avx512_bf16, but a model of 0.8M "
                                            "parameters is too small to gain from it; model.dtype=bfloat16 trains "
                                            "in bf16 autocast)")
    assert precision(CPU, "bfloat16", TINY) == "precision: bf16 autocast on the CPU (amx_bf16+avx512_bf16)"
    assert precision(CPU, "float32", SMOLLM2) == "precision: fp32 (model.dtype=float32)"


def test_the_cpu_flags_are_read_from_proc_cpuinfo():
    flags = open("/proc/cpuinfo").read()
    expected = [name for name in ("amx_bf16", "avx512_bf16") if f" {name}" in flags]
    assert cpu_bf16() == ("+".join(expected) or None)
