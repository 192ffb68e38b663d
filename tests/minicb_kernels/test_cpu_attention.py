"""The CPU attention kernel (kernels/cpu_attention.c) and the "cpu" backend against the torch
reference.

The kernel is compiled with the machine's C compiler on first use; these tests need one (CI has
gcc), and one test checks what happens where there is none.
"""

from __future__ import annotations

import pytest
import torch
from minicb.kernels import cpu, paged_attention_reference
from test_kernels import CONFIGS, batch_shapes, make_batch, seed_of, wide_table_meta

from minicb.model.attention import paged_attention_cpu, resolve_backend

KINDS = ["decode", "prefill", "mixed", "left_padded"]


def cpu_batch(config, kind, tag):
    head_dim, block_size, group, num_kv_heads = config
    q_lens, seq_lens = batch_shapes(block_size)[kind]
    return make_batch(q_lens, seq_lens, head_dim, block_size, group, num_kv_heads,
                      seed=seed_of(tag, config, kind), device="cpu")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c[0]}-bs{c[1]}-g{c[2]}-kv{c[3]}")
def test_kernel_matches_reference(config, kind):
    """Every query of every kind of step: decodes on block edges, whole prompts, chunks on top of a
    cached context, left-padded static batches; every head_dim, block size and GQA ratio."""
    batch = cpu_batch(config, kind, "cpu")
    meta = wide_table_meta(batch, extra=2)
    out = torch.full_like(batch.q, float("nan"))   # an element the kernel skips stays NaN
    result = cpu.paged_attention_cpu(batch.q, batch.k_cache, batch.v_cache, meta.cu_seqlens_q,
                                     meta.seq_lens, meta.block_tables, batch.q.shape[-1] ** -0.5,
                                     out=out)
    assert result is out
    assert torch.isfinite(result).all(), "some output elements were never written"
    torch.testing.assert_close(result, paged_attention_reference(*batch.args()), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3], (96, 16, 3, 1)],
                         ids=lambda c: f"d{c[0]}-g{c[2]}")
def test_decodes_only_writes_exactly_the_decode_rows(config):
    batch = cpu_batch(config, "mixed", "decodes-only")
    out = torch.full_like(batch.q, float("nan"))
    cpu.paged_attention_cpu(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                            batch.seq_lens, batch.block_tables, batch.q.shape[-1] ** -0.5,
                            decodes_only=True, out=out)
    q_lens = (batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]).tolist()
    decode_rows = [int(batch.cu_seqlens_q[i]) for i, n in enumerate(q_lens) if n == 1]
    others = [t for t in range(len(batch.q)) if t not in decode_rows]
    assert decode_rows and others
    expected = paged_attention_reference(*batch.args())
    torch.testing.assert_close(out[decode_rows], expected[decode_rows], atol=1e-5, rtol=1e-5)
    assert out[others].isnan().all(), "decodes_only wrote rows that belong to prefill chunks"


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_backend_matches_reference(kind):
    """The backend the engine calls: the kernel for decodes, SDPA for prompts, one metadata object
    shared by every layer (called twice, as two layers would)."""
    config = CONFIGS[2]
    batch = cpu_batch(config, kind, "backend")
    meta = wide_table_meta(batch, extra=3)
    scale = batch.q.shape[-1] ** -0.5
    first = paged_attention_cpu(batch.q, batch.k_cache, batch.v_cache, meta, scale)
    again = paged_attention_cpu(batch.q, batch.k_cache, batch.v_cache, meta, scale)
    torch.testing.assert_close(first, paged_attention_reference(*batch.args()), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def test_bad_arguments_are_refused_with_the_fix():
    batch = cpu_batch(CONFIGS[0], "decode", "bad")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.seq_lens,
            batch.block_tables, 0.125)
    with pytest.raises(ValueError, match="attention='torch'"):
        cpu.paged_attention_cpu(batch.q.double(), *args[1:])
    with pytest.raises(ValueError, match="int32"):
        cpu.paged_attention_cpu(*args[:4], batch.seq_lens.long(), *args[5:])
    bad_tables = batch.block_tables.clone()
    bad_tables[0, 0] = batch.k_cache.shape[0]      # one past the pool
    with pytest.raises(ValueError, match="outside the KV pool"):
        cpu.paged_attention_cpu(*args[:5], bad_tables, 0.125)
    short = batch.block_tables[:, :1].contiguous()   # the longest row needs more blocks than this
    with pytest.raises(ValueError, match="shorter than its row"):
        cpu.paged_attention_cpu(*args[:5], short, 0.125)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        cpu.paged_attention_cpu(*args, out=torch.empty_like(batch.q).transpose(0, 1))


def test_auto_picks_the_kernel_where_it_runs():
    ok, why = cpu.available()
    assert ok, f"the CPU kernel should compile on this machine: {why}"
    assert resolve_backend("auto", "cpu", "float32") == "cpu"
    assert resolve_backend("auto", "cpu", "bfloat16") == "cpu"       # bfloat16 weights and KV
    assert resolve_backend("auto", "cpu", "float16") == "torch"      # the kernels read no float16
    assert resolve_backend("torch", "cpu", "float32") == "torch"
    with pytest.raises(ValueError, match="attention='torch'"):
        resolve_backend("cpu", "cpu", "float16")


def test_auto_picks_triton_on_a_gpu_where_triton_is_installed(monkeypatch):
    """Decided from the device's type and Triton's presence, so it is checked without a GPU."""
    from minicb.model import attention

    assert resolve_backend("auto", "cuda", "bfloat16") == "triton"
    assert resolve_backend("auto", "cuda:1", "float32") == "triton"
    assert resolve_backend("torch", "cuda", "bfloat16") == "torch"
    monkeypatch.setattr(attention, "_triton_installed", lambda: False)
    assert resolve_backend("auto", "cuda", "bfloat16") == "torch"


def test_without_a_compiler_auto_falls_back_and_cpu_says_why(
    monkeypatch, tmp_path, reload_cpu_kernel):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MINICB_CACHE", str(tmp_path / "cache"))
    ok, why = cpu.available()
    assert not ok and "no-such-compiler" in why
    assert resolve_backend("auto", "cpu", "float32") == "torch"
    with pytest.raises(ValueError, match="unavailable here.*attention='torch'"):
        resolve_backend("cpu", "cpu", "float32")


def test_an_unwritable_cache_is_a_reason_not_a_crash(monkeypatch, tmp_path, reload_cpu_kernel):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should go")
    monkeypatch.setenv("MINICB_CACHE", str(blocker))
    ok, why = cpu.available()
    assert not ok and "MINICB_CACHE" in why
    assert resolve_backend("auto", "cpu", "float32") == "torch"


PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w"); if (f) { fputs("loaded", f); fclose(f); }
}
int minicb_paged_attention(void) { return 0; }
"""


def _plant(path, marker, tmp_path):
    import subprocess

    source = tmp_path / "planted.c"
    source.write_text(PLANTED)
    subprocess.run(["cc", f'-DMARKER="{marker}"', "-shared", "-fPIC", str(source), "-o", str(path)],
                   check=True)


@pytest.mark.skipif(not cpu.available()[0],
                    reason="needs a C compiler (the kernel cache is not used without one)")
def test_a_library_planted_in_the_cache_is_never_loaded(monkeypatch, tmp_path, reload_cpu_kernel):
    monkeypatch.setenv("MINICB_CACHE", str(tmp_path / "cache"))
    assert cpu.available()[0]
    (built,) = (tmp_path / "cache" / "kernels").glob("*.so")
    marker = tmp_path / "marker"
    _plant(built, marker, tmp_path)                 # same name, same owner, different bytes
    cpu._library.cache_clear()
    ok, _ = cpu.available()
    assert ok and not marker.exists(), "the planted library was loaded: its constructor ran"
    assert built.with_suffix(".sha256").read_text() == cpu._digest(built), ("the real kernel was "
                                                                            "rebuilt in its place")
    assert cpu._private(built.parent), "the cache directory is private to its user"


@pytest.mark.skipif(not cpu.available()[0],
                    reason="needs a C compiler (the kernel cache is not used without one)")
def test_a_cache_others_can_write_to_is_not_used(monkeypatch, tmp_path, reload_cpu_kernel):
    shared = tmp_path / "shared" / "kernels"
    monkeypatch.setenv("MINICB_CACHE", str(tmp_path / "shared"))
    assert cpu.available()[0]
    (built,) = shared.glob("*.so")
    marker = tmp_path / "marker"
    _plant(built, marker, tmp_path)
    built.with_suffix(".sha256").write_text(cpu._digest(built))     # even with a matching record
    shared.chmod(0o777)
    cpu._library.cache_clear()
    ok, _ = cpu.available()
    assert ok and not marker.exists(), "a library from a world-writable cache was loaded"
