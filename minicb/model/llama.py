"""A Llama-family decoder (Llama, Qwen2, Qwen3) that runs on a packed batch with a paged KV cache.

Readable in one sitting. Module names mirror Hugging Face's so a checkpoint loads with
`load_state_dict` and no renaming. What differs from transformers: there is no batch dimension.
Every step feeds `num_tokens` tokens from many requests back to back, and attention finds each
request's past through the batch's slot mapping and block tables (minicb.model.attention).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minicb.model.attention import Attention, AttentionMetadata
from minicb.model.moe import MoeArgs, SparseMoeBlock


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool          # Qwen2 has q/k/v biases; Llama and Qwen3 may (attention_bias)
    mlp_bias: bool
    rope_scaling: dict | None = None
    o_bias: bool = False    # an o_proj bias: Llama's and Qwen3's attention_bias (not Qwen2's)
    qk_norm: bool = False   # Qwen3: an RMSNorm over each query and key head, before RoPE
    moe: MoeArgs | None = None  # the mixture-of-experts layers (minicb/model/moe.py); None: dense


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # the same arithmetic as below in one fused operation (equal bit for bit in float32):
            # a small step runs hundreds of operations, and each costs microseconds of overhead
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # normalise in float32 like the reference implementation, then cast back
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate pairs of channels by an angle proportional to the token's position."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    def forward(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin of every token's angles, [num_tokens, 1, head_dim], once per step
        for all layers (see apply_rope)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        half = sin.shape[-1] // 2
        signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return cos[:, None, :], signed_sin[:, None, :]


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """One rotation frequency per channel pair, made on the CPU exactly as the reference does."""
    steps = torch.arange(0, args.head_dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (args.rope_theta ** (steps / args.head_dim))
    if args.rope_scaling and args.rope_scaling.get("rope_type", "default") == "llama3":
        inv_freq = _llama3_scaled(inv_freq, args.rope_scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, cfg: dict) -> torch.Tensor:
    factor, low, high = cfg["factor"], cfg["low_freq_factor"], cfg["high_freq_factor"]
    old_len = cfg["original_max_position_embeddings"]
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_mid, mid, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair (i, i + head_dim/2) of x [num_tokens, heads, head_dim] by its angle.

    The reference writes x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] for the
    halves x1, x2. Swapping the halves with `roll` and folding the minus sign into the sine once
    per step ([-sin, sin]) gives the same numbers bit for bit in three operations instead of six.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class SelfAttention(nn.Module):
    def __init__(self, args: ModelArgs, attention: Attention):
        super().__init__()
        self.num_heads, self.num_kv_heads = args.num_heads, args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_proj = nn.Linear(args.hidden_size, args.num_heads * args.head_dim,
                                bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim,
                                bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim,
                                bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:   # Qwen3: each query and key head normalised on its own, before RoPE
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = args.head_dim ** -0.5
        self.attention = attention
        self.qkv_proj: nn.Linear | None = None      # set by fuse_projections after loading

    def forward(self, x, cos, sin, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata):
        tokens = x.shape[0]
        if self.qkv_proj is not None:      # one matrix product for q, k and v, then three views
            q, k, v = self.qkv_proj(x).split(
                [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = self.attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)).

    A big prefill step runs it on `chunk_tokens` rows at a time: the token rows are independent,
    and the intermediate activations (intermediate_size wide) then stay in the CPU's cache
    instead of making several round trips to memory (on a 2-core CPU, a 6,400-token MLP took
    ~30% less time in chunks of 1,024, bit for bit the same result).
    """

    chunk_tokens = 1024

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)
        self.gate_up_proj: nn.Linear | None = None  # set by fuse_projections after loading

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:   # gate and up in one matrix product
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.chunk_tokens:
            return self.swiglu(x)
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], self.chunk_tokens):
            out[start:start + self.chunk_tokens] = self.swiglu(x[start:start + self.chunk_tokens])
        return out


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the parts' outputs side by side, and each part's weight (and
    bias) turned into a view of the fused one: no memory is duplicated, and code that calls a
    part (or loads weights into it by name) still works on the same numbers.

    The parts keep their parameters, under the checkpoint's names; the fused weight and bias are
    buffers outside the state dict. So `parameters()` and `state_dict()` list every number once,
    as the checkpoint does: were the fused tensors parameters too, each q, k, v, gate and up
    weight would be counted twice."""
    weight = torch.cat([p.weight.detach() for p in parts])
    has_bias = parts[0].bias is not None
    with torch.device("meta"):      # its own weight and bias are replaced just below
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias)
    del fused.weight, fused.bias
    fused.register_buffer("weight", weight, persistent=False)
    fused.register_buffer("bias", torch.cat([p.bias.detach() for p in parts])
                          if has_bias else None, persistent=False)
    start = 0
    for part in parts:
        rows = part.weight.shape[0]
        part.weight = nn.Parameter(fused.weight[start:start + rows], requires_grad=False)
        if has_bias:
            part.bias = nn.Parameter(fused.bias[start:start + rows], requires_grad=False)
        start += rows
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, attention: Attention, index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = SelfAttention(args, attention)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if args.moe is not None and index in args.moe.sparse_layers:
            shared = args.moe.shared_expert_size     # Qwen2-MoE's shared expert: a dense MLP
            self.mlp = SparseMoeBlock(args.hidden_size, args.moe, MLP(dataclasses.replace(
                args, intermediate_size=shared, mlp_bias=False)) if shared else None)
        else:
            self.mlp = MLP(args)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs, attention: Attention):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, attention, index)
                                    for index in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(args)

    def forward(self, input_ids, positions, kv_caches, meta):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, kv_cache, meta)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, args: ModelArgs, attention_backend: str = "torch"):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args, Attention(attention_backend))
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """After the weights are loaded: q, k and v become one matrix product per layer, and so do
        gate and up. A decode step is many small operations, each with a fixed cost of
        microseconds; one product of the concatenated weights does the same arithmetic in one
        call instead of three (or two). Checkpoints keep the separate names; the separate
        weights become views of the fused ones."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_proj = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            if isinstance(mlp, MLP):     # a sparse block's experts are stacked already
                mlp.gate_up_proj = fuse_linears([mlp.gate_proj, mlp.up_proj])

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                logits_indices: torch.Tensor) -> torch.Tensor:
        """Run one packed step; return float32 logits only for the rows that need them."""
        hidden = self.model(input_ids, positions, kv_caches, meta)
        return self.lm_head(hidden[logits_indices]).float()
