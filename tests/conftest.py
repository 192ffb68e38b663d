"""Shared fixtures: small checkpoints with random weights, built once per test session.

Correctness is measured against transformers on the same weights, so the fixtures save
transformers models to disk and both sides load the same files.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")       # tests never reach the network
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



@pytest.fixture
def reload_cpu_kernel():
    """The CPU attention kernel is found (or not) afresh inside the test, under the test's own
    environment ($CC, $MINICB_CACHE), and afresh again after it, so no other test sees its
    result."""
    from minicb.kernels import cpu

    cpu._library.cache_clear()
    yield
    cpu._library.cache_clear()
