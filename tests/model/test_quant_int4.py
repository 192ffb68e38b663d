"""int4 weights in groups of 32: the quantizer keeps each group's range, the int4 layer equals
dequantize-then-matmul (the C kernel and torch's int4 product), and whole requests give the
greedy tokens of transformers running the same dequantized weights in float32, near-ties treated
as tests/reference.py treats them. (torchao's Int4WeightOnlyConfig does not run on a CPU build of
torch 2.13 with torchao 0.18: its plain packing needs the mslk GPU kernels. The float reference
is exact instead: the weights it multiplies are the int4 layer's own, dequantized.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import check_all, greedy, hf_greedy

from minicb import LLM
from minicb.model.int4 import Int4Linear, dequantize_int4, pack_int4, quantize_int4, unpack_int4
from minicb.model.loader import load_model

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(5)]
MAX_TOKENS = [30, 4, 22, 30, 12]


def dequantized_int4(model: torch.nn.Module) -> None:
    """Every Linear but the head gets the weight minicb's int4 stands for."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            q, pairs = quantize_int4(module.weight)
            module.weight.data = dequantize_int4(pack_int4(q), pairs).to(module.weight.dtype)


def test_each_group_keeps_its_range_and_the_bytes_unpack():
    torch.manual_seed(0)
    w = torch.randn(6, 96) + torch.linspace(-3, 3, 96)   # groups that lean one way
    w[2, 32:64] = 0.7                                     # a constant group: the scale's floor
    q, pairs = quantize_int4(w)
    assert q.dtype == torch.uint8 and q.max() == 15 and q.min() == 0
    packed = pack_int4(q)
    assert packed.shape == (6, 48) and torch.equal(unpack_int4(packed), q)
    # byte b of a group: value b low, value b + 16 high (the kernels' layout)
    assert packed[0, 0] == q[0, 0] | q[0, 16] << 4 and packed[1, 17] == q[1, 33] | q[1, 49] << 4
    dense = dequantize_int4(packed, pairs).view(6, 3, 32)
    groups = w.view(6, 3, 32)
    torch.testing.assert_close(dense.amin(-1), groups.amin(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(dense.amax(-1), groups.amax(-1), atol=1e-5, rtol=1e-6)
    step = pairs[..., 0][..., None]
    assert ((dense - groups).abs() <= step / 2 * 1.001).all()


def test_a_row_that_does_not_split_into_groups_is_refused():
    with pytest.raises(ValueError, match="no multiple of 32. Use quantization='int8'"):
        quantize_int4(torch.randn(4, 48))


@pytest.mark.parametrize("kernel", ["c", "torch"])
@pytest.mark.parametrize("rows", [1, 3, 65], ids=lambda r: f"{r}-rows")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int4_layer_equals_dequantize_then_matmul(rows, dtype, kernel, monkeypatch):
    """The C kernel, or without one torch's _weight_int4pack_mm_for_cpu (40 output rows: its
    padding to a multiple of 16 is exercised); both equal x times the dequantized weight."""
    from minicb.model import quant

    if kernel == "torch":
        monkeypatch.setattr(quant, "_c_kernel", lambda: False)
    torch.manual_seed(rows)
    layer = Int4Linear.from_linear(torch.nn.Linear(96, 40))
    x = torch.randn(rows, 96).to(dtype)
    dense = dequantize_int4(layer.weight, layer.scale)
    expected = (x.double() @ dense.double().T + layer.bias.double()).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(layer(x), expected, atol=tolerance, rtol=tolerance)
    assert layer(x[None]).shape == (1, rows, 40)


def test_the_int4_model_holds_packed_views_and_no_float_matrix(tiny_qwen2):
    model = load_model(Path(tiny_qwen2), quantization="int4")
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, Int4Linear) and attn.qkv_proj.weight.dtype == torch.uint8
    assert attn.v_proj.weight.untyped_storage().data_ptr() == \
        attn.qkv_proj.weight.untyped_storage().data_ptr()
    assert attn.v_proj.scale.shape == (attn.v_proj.out_features, 2, 2)
    matrices = [name for name, t in model.named_buffers() | dict(model.named_parameters()).items()
                if t.dim() == 2 and t.is_floating_point() and "layers" in name]
    assert not matrices, matrices


@pytest.mark.parametrize("scheduler, kv_cache", [("continuous", "paged"),
                                                 ("static", "contiguous")])
def test_int4_weights_equal_transformers_on_the_dequantized_weights(any_tiny_model, scheduler,
                                                                    kv_cache):
    references = hf_greedy(any_tiny_model, PROMPTS, MAX_TOKENS, prepare=dequantized_int4)
    llm = LLM(any_tiny_model, quantization="int4", scheduler=scheduler, kv_cache=kv_cache,
              max_num_seqs=3)
    assert llm.llm_engine.config.attention == "cpu"     # decodes through the fused C layer
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(PROMPTS) - 1, verdicts
