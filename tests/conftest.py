"""Shared fixtures: small checkpoints with random weights, built once per test session.

Correctness is measured against transformers on the same weights, so the fixtures save
transformers models to disk and both sides load the same files.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")       # tests never reach the network
# a key exported in the shell would lock the servers the tests start; the tests that need a key
# set their own
os.environ.pop("MINICB_API_KEY", None)
torch.set_num_threads(1)   # the suite shares the machine with its own workers


def _save(model_cls, config, path, vary: bool = False) -> str:
    torch.manual_seed(0)
    model = model_cls(config).eval()
    # random init leaves logits nearly flat; sharpen them so greedy choices are rarely near-ties
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("proj.weight") or "embed" in name or "lm_head" in name:
                param.mul_(2.0)
            elif vary and name.endswith("bias"):        # init leaves biases zero: a bias the
                param.normal_(0.0, 0.2)                  # forward dropped would go unnoticed
            elif vary and name.endswith("norm.weight"):  # and norm weights one
                param.normal_(1.0, 0.2)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """A Llama with grouped-query attention (4 query heads, 2 KV heads) and untied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _save(LlamaForCausalLM, config, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> str:
    """A Qwen2 with q/k/v biases and tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    path = _save(Qwen2ForCausalLM, config, tmp_path_factory.mktemp("tiny-qwen2"))
    return path


@pytest.fixture(scope="session", params=["tiny_llama", "tiny_qwen2"])
def tiny_model(request) -> str:
    """Each random-weight architecture in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> str:
    """A Qwen3: an RMSNorm over each query and key head; head_dim (32) x heads is not the hidden
    size; random norm weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0)
    return _save(Qwen3ForCausalLM, config, tmp_path_factory.mktemp("tiny-qwen3"), vary=True)


@pytest.fixture(scope="session")
def tiny_llama_bias(tmp_path_factory) -> str:
    """A Llama with attention_bias (q, k, v and o biases) and mlp_bias, all random."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                         attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _save(LlamaForCausalLM, config, tmp_path_factory.mktemp("tiny-llama-bias"), vary=True)


@pytest.fixture(scope="session", params=["tiny_qwen3", "tiny_llama_bias"])
def tiny_variant(request) -> str:
    """The architectures beyond tiny_model's two: Qwen3 and Llama with every bias."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session", params=["tiny_llama", "tiny_qwen2", "tiny_qwen3",
                                         "tiny_llama_bias"])
def any_tiny_model(request) -> str:
    """Every random-weight architecture in turn."""
    return request.getfixturevalue(request.param)



def _cpu_builds() -> list[str]:
    from minicb.kernels import isa

    return isa.supported()


@pytest.fixture(params=_cpu_builds())
def build(request, monkeypatch, reload_cpu_kernel):
    """The CPU kernels as compiled for one instruction set this machine runs, forced through
    $MINICB_CPU_ISA (each build a parameter)."""
    from minicb.kernels import cpu, isa

    monkeypatch.setenv(isa.ENV, request.param)
    ok, how = cpu.available()
    assert ok and how.startswith(request.param + ":"), how
    return request.param


@pytest.fixture
def reload_cpu_kernel():
    """The CPU attention kernel is found (or not) afresh inside the test, under the test's own
    environment ($CC, $MINICB_CACHE), and afresh again after it, so no other test sees its
    result."""
    from minicb.kernels import cpu

    cpu._library.cache_clear()
    yield
    cpu._library.cache_clear()


@pytest.fixture(scope="session")
def save_checkpoint():
    """`_save` for a test that builds a checkpoint of its own config (a fixture, not an import:
    under pytest-xdist another folder's conftest can hold the name `conftest`)."""
    return _save


def _save_moe(model_cls, config, path) -> str:
    """An MoE checkpoint: `_save`'s sharpening, and the experts' and routers' weights scaled up
    too, so tokens prefer their experts clearly (a near-tie between two experts' router scores
    would let rounding pick either)."""
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("proj.weight", "_proj")) or "embed" in name or "lm_head" in name:
                param.mul_(2.0)
            elif name.endswith("mlp.gate.weight"):
                param.mul_(20.0)
            elif name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)
    model.save_pretrained(path)
    return str(path)


MOE_COMMON = dict(vocab_size=512, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory) -> str:
    """A Qwen3-MoE: 8 experts, top-2, renormalised (norm_topk_prob), every layer sparse."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                            num_hidden_layers=2, head_dim=32, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=True, **MOE_COMMON)
    return _save_moe(Qwen3MoeForCausalLM, config, tmp_path_factory.mktemp("tiny-qwen3-moe"))


@pytest.fixture(scope="session")
def tiny_mixtral(tmp_path_factory) -> str:
    """A Mixtral: 8 experts, top-2, always renormalised, float32 routing weights."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                           num_local_experts=8, num_experts_per_tok=2, **MOE_COMMON)
    return _save_moe(MixtralForCausalLM, config, tmp_path_factory.mktemp("tiny-mixtral"))


@pytest.fixture(scope="session")
def tiny_many_experts(tmp_path_factory) -> str:
    """Many small experts (32, top-8, not renormalised), a dense middle layer (mlp_only_layers),
    and Qwen2-MoE's sigmoid-gated shared expert."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(hidden_size=128, intermediate_size=192, moe_intermediate_size=32,
                            shared_expert_intermediate_size=64, num_hidden_layers=3,
                            mlp_only_layers=[1], num_experts=32, num_experts_per_tok=8,
                            norm_topk_prob=False, **MOE_COMMON)
    return _save_moe(Qwen2MoeForCausalLM, config, tmp_path_factory.mktemp("tiny-many-experts"))


@pytest.fixture(scope="session", params=["tiny_qwen3_moe", "tiny_mixtral", "tiny_many_experts"])
def tiny_moe(request) -> str:
    """Each mixture-of-experts family in turn."""
    return request.getfixturevalue(request.param)
