"""bfloat16 and int8 weights: the quantizer equals torchao's, the int8 layer equals
dequantize-then-matmul, and whole requests give transformers' greedy tokens on the same weights
(bfloat16 against transformers in bfloat16; int8 against transformers with torchao's
Int8WeightOnlyConfig), near-ties treated as tests/reference.py treats them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import NEAR_TIE_BF16, check_all, greedy, hf_greedy

from minicb import LLM
from minicb.config import EngineConfig
from minicb.model.loader import load_model
from minicb.model.quant import Int8Linear, auto_dtype, quantize_int8, quantize_model
from minicb.registry import KV_CACHES, SCHEDULERS


@pytest.fixture
def torchao():
    """torchao, the int8 reference (a test dependency); only its tests need it."""
    return pytest.importorskip("torchao", reason="torchao is the int8 reference (pyproject dev)")

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(5 + 9 * i)] for i in range(5)]
MAX_TOKENS = [30, 4, 22, 30, 12]


def torchao_int8(model: torch.nn.Module) -> None:
    """torchao's weight-only int8 on every Linear but the head (minicb leaves the head as it is,
    as vLLM does)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig(),
              filter_fn=lambda module, name: isinstance(module, torch.nn.Linear)
              and "lm_head" not in name)


def test_the_quantizer_equals_torchaos_bit_for_bit(torchao):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(300, 70))
    layer[0].weight.data[5] = 0.0      # an all-zero channel: its scale is the floor, not 0
    q, scale = quantize_int8(layer[0].weight)
    quantize_(layer, Int8WeightOnlyConfig())
    assert torch.equal(q, layer[0].weight.qdata)
    assert torch.equal(scale, layer[0].weight.scale.flatten())


@pytest.mark.parametrize("kernel", ["c", "torch"])
@pytest.mark.parametrize("rows", [1, 3, 65], ids=lambda r: f"{r}-rows")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int8_layer_equals_dequantize_then_matmul(rows, dtype, kernel, monkeypatch):
    """The C kernel, or without one torch's _weight_int8pack_mm: both equal x times the
    dequantized weight, within the activations' own rounding."""
    from minicb.model import quant

    if kernel == "torch":
        monkeypatch.setattr(quant, "_c_kernel", lambda: False)
    torch.manual_seed(rows)
    linear = torch.nn.Linear(96, 40)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(rows, 96).to(dtype)
    dense = layer.weight.float() * layer.scale[:, None]
    expected = (x.double() @ dense.double().T + layer.bias.double()).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(layer(x), expected, atol=tolerance, rtol=tolerance)
    assert layer(x[None]).shape == (1, rows, 40)


def test_the_quantized_model_holds_int8_views_and_no_float_matrix(tiny_qwen2):
    model = load_model(Path(tiny_qwen2), quantization="int8")
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.dtype == torch.int8
    assert attn.k_proj.weight.untyped_storage().data_ptr() == \
        attn.qkv_proj.weight.untyped_storage().data_ptr()
    matrices = [name for name, t in model.named_buffers() | dict(model.named_parameters()).items()
                if t.dim() == 2 and t.is_floating_point() and "layers" in name]
    assert not matrices, matrices


def test_a_mixture_of_experts_is_refused_by_name(tiny_qwen3_moe):
    with pytest.raises(ValueError, match="mixture of experts"):
        load_model(Path(tiny_qwen3_moe), quantization="int8")
    model = load_model(Path(tiny_qwen3_moe))
    with pytest.raises(ValueError, match="layer 0's MLP is a SparseMoeBlock"):
        quantize_model(model, "int8")


@pytest.mark.parametrize("kv_cache", KV_CACHES.choices)
@pytest.mark.parametrize("scheduler", SCHEDULERS.choices)
def test_int8_weights_equal_transformers_with_torchaos_int8(tiny_llama, scheduler, kv_cache,
                                                           torchao):
    references = hf_greedy(tiny_llama, PROMPTS, MAX_TOKENS, prepare=torchao_int8)
    llm = LLM(tiny_llama, quantization="int8", scheduler=scheduler, kv_cache=kv_cache,
              max_num_seqs=3)
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(PROMPTS) - 1, verdicts


def test_int8_weights_equal_torchao_on_every_family(any_tiny_model, torchao):
    references = hf_greedy(any_tiny_model, PROMPTS, MAX_TOKENS, prepare=torchao_int8)
    llm = LLM(any_tiny_model, quantization="int8", max_num_seqs=3)
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    verdicts = check_all(references, outputs)
    assert verdicts.count("equal") >= len(PROMPTS) - 1, verdicts


@pytest.mark.parametrize("scheduler, kv_cache", [("continuous", "paged"),
                                                 ("static", "contiguous")])
def test_bfloat16_equals_transformers_in_bfloat16(any_tiny_model, scheduler, kv_cache):
    """minicb keeps the residual stream in float32 between bfloat16 products (the fused decode
    layer) where transformers rounds every activation to bfloat16, so their logits differ by a
    few bfloat16 steps: a choice may flip where the reference's two candidates are within
    NEAR_TIE_BF16 (tests/reference.py says why)."""
    references = hf_greedy(any_tiny_model, PROMPTS, MAX_TOKENS, dtype=torch.bfloat16)
    llm = LLM(any_tiny_model, dtype="bfloat16", scheduler=scheduler, kv_cache=kv_cache,
              max_num_seqs=3)
    assert llm.llm_engine.config.attention == "cpu"
    outputs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS], use_tqdm=False)
    verdicts = check_all(references, outputs, near_tie=NEAR_TIE_BF16)
    assert verdicts.count("equal") >= len(PROMPTS) - 2, verdicts


def test_auto_dtype_is_bfloat16_where_the_cpu_computes_it(tiny_llama, monkeypatch):
    from minicb.kernels import isa

    monkeypatch.setattr(isa, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert auto_dtype(Path(tiny_llama), "cpu") == "bfloat16"
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"avx2", "fma"})
    assert auto_dtype(Path(tiny_llama), "cpu") == "float32"
    assert auto_dtype(Path(tiny_llama), "cuda") == "bfloat16"


@pytest.mark.parametrize("knobs, message", [
    ({"quantization": "int3"}, r"quantization='int3' is not one of \('int8', 'int4'\)"),
    ({"quantization": "INT4"}, r"not one of \('int8', 'int4'\)"),
    ({"dtype": "fp8"}, r"dtype='fp8' is not one of \('auto', 'float32', 'float16', 'bfloat16'\)"),
])
def test_a_bad_choice_names_the_choices(knobs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs)
