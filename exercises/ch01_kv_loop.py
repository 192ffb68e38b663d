# Generated from solutions/ch01_kv_loop.py by scripts/make_exercises.py. Replace each
# NotImplementedError with your code, then run `make grade CH=01`.
"""Chapter 01 exercise: the prefill + decode loop with a KV cache, one request at a time.

Naive serving runs one request from its first prompt token to its last output token, in two
phases:

- prefill: the whole prompt goes through the model in ONE call. Every layer writes the prompt's
  keys and values into the cache, and the logits of the last prompt token give output token 1.
- decode: every later call feeds only the newest token. Attention finds all earlier tokens in
  the cache, so a step costs one token of compute instead of the whole sequence again.

You drive minicb's real model (minicb.model.llama.LlamaForCausalLM) through its packed-batch
interface (docs/ARCHITECTURE.md, "The packed batch"), with a batch of one request:

    logits = model(input_ids, positions, kv_caches, meta, logits_indices)   # [rows, vocab]

The cache is one (k_cache, v_cache) pair per layer, each [num_blocks, block_size, num_kv_heads,
head_dim]. In this exercise the request owns blocks 0, 1, 2, ... in order, so the token at
position p lives in slot p: block p // block_size, offset p % block_size.

Grade it: make grade CH=01
"""

from __future__ import annotations

import torch

from minicb.model.attention import AttentionMetadata
from minicb.model.llama import LlamaForCausalLM, ModelArgs


def allocate_kv_cache(args: ModelArgs, max_tokens: int, block_size: int,
                      dtype: torch.dtype = torch.float32
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A zeroed cache big enough for one request of up to `max_tokens` tokens.

    Contract: a list with one (k_cache, v_cache) pair per layer (args.num_layers), each of shape
    [ceil(max_tokens / block_size), block_size, args.num_kv_heads, args.head_dim] and `dtype`.

    Hint: a cache is sized by KV heads, not query heads: grouped-query attention stores fewer.

    >>> args = ModelArgs(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
    ...                  num_heads=4, num_kv_heads=2, head_dim=2, rms_norm_eps=1e-6, rope_theta=1e4,
    ...                  max_position_embeddings=64, tie_word_embeddings=False, qkv_bias=False,
    ...                  mlp_bias=False)
    >>> cache = allocate_kv_cache(args, max_tokens=9, block_size=4)
    >>> len(cache), tuple(cache[0][0].shape)
    (2, (3, 4, 2, 2))
    """
    raise NotImplementedError(
        "allocate_kv_cache: per layer a (k, v) pair of zeros [num_blocks, block_size, kv_heads, "
        "head_dim]")


def pack_step(token_ids: list[int], num_cached: int,
              block_size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The model's inputs for one call that computes `token_ids` of a request whose first
    `num_cached` tokens are already in the cache.

    Prefill: pack_step(prompt, num_cached=0, ...). Decode: pack_step([newest], num_cached=n, ...)
    where n is the number of tokens computed so far.

    Contract (one request, blocks 0, 1, 2, ... in order):
      input_ids     int64 [len(token_ids)]       the tokens
      positions     int64 [len(token_ids)]       num_cached, num_cached + 1, ...
      meta.slot_mapping  int64 [len(token_ids)]  where each token's K/V is written (= its position)
      meta.cu_seqlens_q  int32 [2]               [0, len(token_ids)]
      meta.seq_lens      int32 [1]               keys in the cache after this call's write
      meta.block_tables  int32 [1, num_blocks]   [[0, 1, ...]]: the blocks those keys occupy
      meta.max_seqlen_q  int                     len(token_ids)
      meta.max_seqlen_k  int                     the same as seq_lens[0]

    >>> ids, positions, meta = pack_step([42], num_cached=5, block_size=4)
    >>> positions.tolist(), meta.slot_mapping.tolist()
    ([5], [5])
    >>> meta.seq_lens.tolist(), meta.block_tables.tolist()
    ([6], [[0, 1]])
    """
    raise NotImplementedError(
        "pack_step: build input_ids, positions and the AttentionMetadata of one request")


def greedy_generate(model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int,
                    block_size: int = 16) -> list[int]:
    """Greedy decoding of one prompt with a KV cache: exactly `max_new_tokens` new token ids.

    Contract: one model call for the prefill (the whole prompt), then one call per further token
    with ONLY the newest token as input; always `max_new_tokens` tokens (no stop on EOS, like
    transformers' generate(..., min_new_tokens=max_new_tokens, do_sample=False)).

    Hints:
      - allocate_kv_cache(model.args, len(prompt_ids) + max_new_tokens, block_size) once.
      - pass logits_indices = torch.tensor([last row]) so the model returns only the logits you
        need, and pick the next token with argmax over the vocabulary.
      - the token you just picked is not in the cache yet: the next call computes (and caches) it.
    """
    raise NotImplementedError(
        "greedy_generate: prefill the prompt in one call, then one call per new token, reusing the "
        "cache")
