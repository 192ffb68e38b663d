"""How the CPU kernels are built and called: each .c compiles on its own against cpu_kernels.h,
the ctypes mirror of the fused layer's argument struct matches the C struct field by field, and
the CPU engine runs where Triton is not installed."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap

import pytest
from minicb.kernels import cpu

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@needs_cc
@pytest.mark.parametrize("source", cpu.SOURCES, ids=lambda path: path.name)
def test_each_source_compiles_on_its_own(source, tmp_path):
    """No .c depends on being included after another: what it uses from the others is declared
    in the header. Warnings are errors here, so an undeclared function fails too."""
    done = subprocess.run(["cc", "-std=c11", "-O1", "-fopenmp", "-Wall", "-Werror",
                           "-Wno-unknown-pragmas", "-c", str(source), "-o",
                           str(tmp_path / "out.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_library_is_named_for_what_it_holds(monkeypatch, tmp_path, reload_cpu_kernel):
    monkeypatch.setenv("MINICB_CACHE", str(tmp_path))
    assert cpu.available()[0]
    assert [p.name.split("-")[0] for p in (tmp_path / "kernels").glob("*.so")] == [
        "libminicb_cpu_kernels"]


def test_the_ctypes_struct_matches_the_c_struct_field_by_field():
    """Names, order, offsets and sizes: a field added, dropped, renamed or moved on one side
    only fails here, not as garbage in the fused layer's output."""
    size, fields = cpu.c_layout()
    mirror = [(name, getattr(cpu.LayerArgs, name).offset, getattr(cpu.LayerArgs, name).size)
              for name, _ in cpu.LayerArgs._fields_]
    assert fields == mirror
    assert size == ctypes.sizeof(cpu.LayerArgs)


def test_the_layer_refuses_weights_it_has_no_slot_for_or_lacks():
    import torch
    from minicb.kernels.cpu import MATRICES, WEIGHTS, check_layer_weights

    full = {name: torch.zeros(2) for name in WEIGHTS if name not in MATRICES.values()}
    check_layer_weights(full)
    with pytest.raises(ValueError, match="only they take one"):
        check_layer_weights(full | {"s_o": torch.zeros(2)})
    with pytest.raises(ValueError, match="no slot for w_gate"):
        check_layer_weights(full | {"w_gate": torch.zeros(2)})
    with pytest.raises(ValueError, match="needs w_o"):
        check_layer_weights(full | {"w_o": None})


# The CPU engine with `import triton` failing, as where Triton is not installed. TRITON_INTERPRET
# is unset: with it set, importing minicb.kernels patches Triton's interpreter (if Triton is there).
# One process serves every check: each backend generates, and the Triton backend is refused.
NO_TRITON = textwrap.dedent("""
    import sys

    class NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("No module named 'triton' (blocked by the test)")

    sys.meta_path.insert(0, NoTriton())
    from minicb import LLM, SamplingParams
    from minicb.model.attention import Attention

    for attention in ("cpu", "torch"):
        llm = LLM(attention=attention)
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0),
                           use_tqdm=False)
        print(attention, "tokens", len(out[0].outputs[0].token_ids))
        del llm
    try:
        Attention("triton")
    except ImportError as error:
        print("refused:", error)
    assert "triton" not in sys.modules, "triton was imported"
""")


@pytest.fixture(scope="module")
def without_triton() -> str:
    done = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "TRITON_INTERPRET": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["cpu", "torch"])
def test_the_cpu_engine_runs_without_triton(attention, without_triton):
    assert f"{attention} tokens 4" in without_triton, without_triton


@pytest.mark.slow
def test_the_triton_backend_without_triton_names_the_extra(without_triton):
    assert "refused:" in without_triton and "minicb[triton]" in without_triton, without_triton


def test_env_check_warns_but_passes_without_triton(monkeypatch):
    import importlib.util

    from minicb.tools import env_check

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else find_spec(name, *a))
    runtime, _ = env_check.requirements()
    monkeypatch.setattr(env_check, "requirements", lambda: (runtime, []))  # triton is a dev one
    lines, ok = env_check.check()
    assert any(line.startswith("WARN triton: not installed") and "minicb[triton]" in line
               for line in lines), lines
    assert ok, lines
