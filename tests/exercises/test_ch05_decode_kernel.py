"""Chapter 05: a Triton paged decode kernel against minicb's torch reference and inside the engine.

Without CUDA the kernel runs in Triton's interpreter on CPU (the adapter sets TRITON_INTERPRET
before the chapter's module defines it); with a GPU and without TRITON_INTERPRET, compiled on it.
"""

from __future__ import annotations

import os

import pytest
import torch
from adapter import chapter
from engine_probe import generate_completions, random_prompts
from reference import compare, hf_greedy

from minicb import LLM, kernels

ch05 = chapter("05")
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"

# (head_dim, block_size, query heads per KV head, num_kv_heads, seq_lens, q scale, dtype): lengths
# on and around block and tile boundaries, a head_dim that is not a power of two, the common 128,
# GQA groups 1, 2, 4 and 8, bfloat16, and queries scaled by 50: scores in the hundreds overflow
# exp() (or drown the small ones) in a kernel that does not subtract a running maximum
CASES = [
    (16, 4, 2, 2, [1, 3, 4, 5, 33], 1.0, torch.float32),
    (32, 16, 1, 1, [15, 16, 17], 1.0, torch.float32),
    (24, 8, 4, 1, [2, 40], 1.0, torch.float32),
    (128, 16, 8, 1, [3, 40], 1.0, torch.float32),
    (32, 8, 2, 2, [9, 47], 50.0, torch.float32),
    (64, 16, 8, 2, [17, 70], 50.0, torch.float32),
    (128, 16, 2, 1, [5, 37], 1.0, torch.bfloat16),
]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def decode_batch(head_dim: int, block_size: int, group: int, num_kv_heads: int, seq_lens: list[int],
                 q_scale: float, dtype: torch.dtype, seed: int) -> dict:
    """Random queries and a cache whose blocks are handed out in shuffled order."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    for row, count in enumerate(blocks_per_seq):
        tables[row, :count] = torch.tensor([order.pop() for _ in range(count)])
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return dict(
        q=(q_scale * torch.randn(len(seq_lens), num_kv_heads * group, head_dim,
                                 generator=generator)).to(DEVICE, dtype),
        k_cache=torch.randn(shape, generator=generator).to(DEVICE, dtype),
        v_cache=torch.randn(shape, generator=generator).to(DEVICE, dtype),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        scale=head_dim ** -0.5,
    )


def reference(batch: dict) -> torch.Tensor:
    """minicb's oracle, with one query per request (a decode: cu_seqlens_q = 0, 1, 2, ...)."""
    num_seqs = batch["seq_lens"].shape[0]
    cu_seqlens_q = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEVICE)
    as_float = {name: batch[name].float() for name in ("q", "k_cache", "v_cache")}
    return kernels.paged_attention_reference(as_float["q"], as_float["k_cache"],
                                             as_float["v_cache"], cu_seqlens_q, batch["seq_lens"],
                                             batch["block_tables"], batch["scale"], 1,
                                             int(batch["seq_lens"].max()))


def case_id(case) -> str:
    head_dim, block_size, group, num_kv_heads, _, q_scale, dtype = case
    return (f"d{head_dim}-bs{block_size}-g{group}-kv{num_kv_heads}"
            + (f"-q{q_scale:g}x" if q_scale != 1 else "")
            + ("-bf16" if dtype is torch.bfloat16 else ""))


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_ch05_decode_kernel_matches_the_reference(case):
    head_dim, block_size, group, num_kv_heads, seq_lens, q_scale, dtype = case
    batch = decode_batch(*case, seed=sum(seq_lens))
    got = ch05.paged_decode(**batch)
    expected = reference(batch)
    assert got.shape == expected.shape and got.dtype == dtype, (
        f"expected an output of shape {tuple(expected.shape)} and {dtype} (the dtype of q), got "
        f"{tuple(got.shape)} {got.dtype}")
    error = (got.float() - expected).abs().amax(dim=(1, 2))
    bad = [(n, float(e)) for n, e in zip(seq_lens, error) if not e <= TOLERANCE[dtype]]
    assert not bad, (f"{case_id(case)}: head_dim {head_dim}, block_size {block_size}, {group} "
                     f"query heads per KV head, q scaled by {q_scale:g}, {dtype}: the output "
                     "differs from the reference for (seq_len, max abs error) "
                     f"{bad}. Hint: wrong only past {ch05.BLOCK_N} keys points at the rescaling "
                     "between tiles (alpha); only at some short lengths, at the key mask or the "
                     "block lookup; at every length, at the scores or the GQA head; only with q "
                     "scaled up (NaN or inf), at the running maximum.")


def test_ch05_a_triton_kernel_computes_the_output(monkeypatch):
    """The exercise is the kernel: paged_decode must launch paged_decode_kernel, which writes
    the result (a torch gather returning the right numbers does not count)."""
    kernel, launches = ch05.paged_decode_kernel, []
    assert hasattr(kernel, "__getitem__") and hasattr(kernel, "fn"), \
        "paged_decode_kernel should stay a @triton.jit function"

    class CountingLaunch:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(ch05, "paged_decode_kernel", CountingLaunch())
    batch = decode_batch(*CASES[0], seed=5)
    got = ch05.paged_decode(**batch)
    assert launches, ("paged_decode returned without launching paged_decode_kernel[grid](...): "
                      "the output must come from your Triton kernel")
    assert torch.allclose(got, reference(batch), atol=1e-4), \
        "paged_decode launched the kernel but its output differs from the reference"


def test_ch05_engine_decodes_with_your_kernel(tiny_llama):
    """minicb's engine with every decode-only step's attention done by your kernel."""
    llm = LLM(tiny_llama, attention="torch", block_size=4, max_num_seqs=2, device=DEVICE)
    # shared by every layer
    attention = llm.llm_engine.model.model.layers[0].self_attn.attention
    torch_attend, calls = attention._attend, []

    def attend(q, k_cache, v_cache, meta, scale):
        if meta.max_seqlen_q != 1:              # prefill steps keep minicb's torch attention
            return torch_attend(q, k_cache, v_cache, meta, scale)
        calls.append(q.shape[0])
        return ch05.paged_decode(q, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale)

    attention._attend = attend
    prompts, lengths = random_prompts([6, 9], 512, seed=13), [7, 5]
    completions = generate_completions(llm, prompts, lengths)
    assert calls, "no decode step reached the kernel"
    for index, (expected, completion) in enumerate(zip(hf_greedy(tiny_llama, prompts, lengths),
                                                       completions)):
        try:
            compare(expected, completion.token_ids, completion.logprobs, f"request {index}")
        except AssertionError as error:
            raise AssertionError(f"{error}. With your kernel in the engine: "
                                 f"{completion.token_ids}; transformers: "
                                 f"{expected.token_ids}.") from None
