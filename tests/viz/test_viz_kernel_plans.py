"""The chapter 05 pictures follow the kernel's own division of work."""

from __future__ import annotations

import pytest
import torch
from minicb.kernels import paged_attention_reference

from minicb import viz


def test_decode_programs_follow_the_block_table():
    tables = [[7, 2, 9, 4], [5, 0, 0, 0]]
    plans = viz.decode_programs([50, 10], tables, block_size=16, block_n=32)
    first = plans[0]
    assert [r.physical for r in first] == [7, 2, 9, 4]          # logical order, through the table
    assert [r.keys for r in first] == [16, 16, 16, 2]           # exactly the 50 keys
    assert [r.iteration for r in first] == [0, 0, 1, 1]         # 32 keys (two blocks) per pass
    assert [(r.physical, r.keys) for r in plans[1]] == [(5, 10)]
    with pytest.raises(ValueError, match="need 4 blocks"):
        viz.decode_programs([50], [[1, 2]], block_size=16)


def test_split_ranges_cover_every_key_once_in_whole_tiles():
    for seq_len, splits in [(1000, 4), (300, 3), (64, 5), (1, 1), (4096, 7)]:
        ranges = viz.split_ranges(seq_len, splits, block_n=64)
        assert len(ranges) == splits
        covered = [k for lo, hi in ranges for k in range(lo, hi)]
        assert covered == list(range(seq_len))
        assert all(lo % 64 == 0 for lo, hi in ranges if hi > lo)
    assert viz.split_ranges(1000, 4) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert viz.split_ranges(64, 5)[1:] == [(64, 64)] * 4          # the tiles run out: empty


def test_split_ranges_match_the_kernel_under_the_interpreter():
    """Attention computed split by split over split_ranges, then merged by log-sum-exp, equals
    the reference; the kernel with the same forced split count agrees too."""
    from minicb.kernels import paged_attention

    torch.manual_seed(0)
    seq_len, heads, dim, block_size = 200, 2, 16, 16
    blocks = -(-seq_len // block_size)
    k_cache = torch.randn(blocks, block_size, heads, dim)
    v_cache = torch.randn(blocks, block_size, heads, dim)
    q = torch.randn(1, heads, dim)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    args = (q, k_cache, v_cache, torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([seq_len], dtype=torch.int32), table, dim ** -0.5)
    expected = paged_attention_reference(*args, max_seqlen_q=1, max_seqlen_k=seq_len)
    keys = k_cache.reshape(-1, heads, dim)[:seq_len]
    values = v_cache.reshape(-1, heads, dim)[:seq_len]
    scores = torch.einsum("hd,khd->hk", q[0], keys) * dim ** -0.5
    parts, lses = [], []
    for lo, hi in viz.split_ranges(seq_len, 3, block_n=64):
        s = scores[:, lo:hi]
        parts.append(torch.einsum("hk,khd->hd", s.softmax(-1), values[lo:hi]))
        lses.append(s.logsumexp(-1))
    weights = torch.stack(lses).softmax(0)
    merged = (weights[..., None] * torch.stack(parts)).sum(0)
    assert torch.allclose(merged, expected[0], atol=1e-5)
    got = paged_attention(*args, max_seqlen_q=1, max_seqlen_k=seq_len, num_splits=3)
    assert torch.allclose(got, expected, atol=1e-5)


def test_pictures_draw_the_plans():
    fig = viz.decode_grid_picture([50, 10], [[7, 2, 9, 4], [5, 0, 0, 0]], block_size=16,
                                  num_kv_heads=2, group=2, block_n=32)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(t.startswith("program (") for t in texts) == 4          # 2 requests x 2 KV heads
    assert "program (1, 1)\nq heads 2–3" in texts
    assert [t for t in texts if t.startswith("block ")] == ["block 7", "block 2", "block 9",
                                                           "block 4", "block 5"]
    fig = viz.split_kv_picture(1000, 4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "split 3\nkeys 768–999" in texts and any(t.startswith("merge") for t in texts)
