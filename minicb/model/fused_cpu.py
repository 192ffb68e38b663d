"""The CPU engine's fast path for small decode steps, beside the model it runs.

A decode step on a CPU is many small operations on a few rows, and two C kernels
(kernels/cpu_linear.c, kernels/cpu_decode_layer.c) cut what torch spends on them:

* the **small-batch product** (``SmallBatchLinear``): a matrix product of at most
  ``kernel_rows`` rows reads every weight once for all the rows, where torch's general product,
  built for big blocks of rows, reads them at a fraction of the speed the memory allows;
* the **fused decode layer** (``FusedCpuDecoder``): a step in which every row decodes one token
  runs each layer as one C call instead of about 25 torch operations, each with its own dispatch
  cost (a CUDA graph's idea on a CPU).

The model (minicb/model/llama.py) knows nothing of either: the runner builds a
``FusedCpuDecoder`` for a CPU engine and sends it the steps it takes (``FusedCpuDecoder.takes``);
every other step runs the model's torch modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minicb.model.attention import AttentionMetadata
from minicb.model.llama import DecoderLayer, LlamaForCausalLM


class SmallBatchLinear(nn.Linear):
    """``nn.Linear`` (the same parameters, buffers and names) that hands a product of at most
    ``kernel_rows`` rows to the small-batch kernel; bigger ones (prompts, big batches), where
    torch's blocked product wins, stay with torch. The two met at 32 rows per thread on a 2-core
    AVX2 CPU with one thread and with two (benchmarks/log.md); 64 is that for the two cores.

    The limit is a fixed number of rows, never scaled by the live thread count: the two products
    sum in a different order (they agree to about 1e-6), and the thread policy
    (minicb/runner/threads.py) changes the thread count with the machine's load between steps. Which
    arithmetic a step runs depends only on its shape, so greedy outputs never depend on what else
    the machine is doing; the threads change only how fast it runs.

    bfloat16 weights have their own limit: torch's bfloat16 product (oneDNN, AVX-512 BF16) reaches
    the machine's peak sooner. On a 2-core AMD EPYC (Zen 4 flags), one thread, the 1024 -> 2816
    product: the C kernel 2.8x faster at 1 row, 1.15x at 8, oneDNN 1.09x faster at 16 and about
    2x at 48 (benchmarks/quant.md).
    """

    kernel_rows = 64
    bfloat16_kernel_rows = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        limit = self.bfloat16_kernel_rows if self.weight.dtype == torch.bfloat16 else \
            self.kernel_rows
        if x.dim() == 2 and x.shape[0] <= limit:
            from minicb.kernels.cpu import linear_cpu

            # the kernel takes float32 rows and float32, bfloat16 (or int8) weights
            bias = None if self.bias is None else self.bias.float()
            return linear_cpu(x.float().contiguous(), self.weight, bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


def use_small_batch_linear(model: nn.Module, on: bool = True) -> None:
    """Every ``nn.Linear`` of the model computes through ``SmallBatchLinear`` (``on=False``: back
    to torch's product). The modules keep their weights and names: only their class changes,
    between ``nn.Linear`` and a subclass that adds no state (as torch's own
    ``nn.utils.parametrize`` does), so nothing is copied and the change is undone exactly."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.__class__ = SmallBatchLinear if on else nn.Linear


# Every tensor of a decoder layer, and where the fused decode layer reads it: its slot in the C
# struct (kernels/cpu_kernels.h), or for a separate projection, the fused one it is a view of
# (LlamaForCausalLM.fuse_projections).
SLOTS = {"input_layernorm.weight": "norm1",
         "self_attn.qkv_proj.weight": "w_qkv", "self_attn.qkv_proj.bias": "b_qkv",
         "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
         "self_attn.o_proj.weight": "w_o", "self_attn.o_proj.bias": "b_o",
         "post_attention_layernorm.weight": "norm2",
         "mlp.gate_up_proj.weight": "w_gate_up", "mlp.gate_up_proj.bias": "b_gate_up",
         "mlp.down_proj.weight": "w_down", "mlp.down_proj.bias": "b_down",
         # int8 weights' per-channel scales (minicb.model.quant.Int8Linear)
         "self_attn.qkv_proj.scale": "s_qkv", "self_attn.o_proj.scale": "s_o",
         "mlp.gate_up_proj.scale": "s_gate_up", "mlp.down_proj.scale": "s_down"}
VIEWS = {"self_attn.q_proj": "self_attn.qkv_proj", "self_attn.k_proj": "self_attn.qkv_proj",
         "self_attn.v_proj": "self_attn.qkv_proj", "mlp.gate_proj": "mlp.gate_up_proj",
         "mlp.up_proj": "mlp.gate_up_proj"}


def layer_weights(layer: DecoderLayer) -> dict[str, torch.Tensor | None]:
    """The tensors the fused decode layer reads (after fuse_projections), by their slot names:
    the four matrices as they are stored (float32, bfloat16 or int8), the small vectors (norms,
    biases) as float32, copied once here where the model holds them narrower. A tensor of the
    layer that has no slot (a part this code does not know) is refused, never skipped: the fused
    layer would compute without it."""
    from minicb.kernels.cpu import MATRICES, WEIGHTS, check_layer_weights

    attn, mlp = layer.self_attn, layer.mlp
    if attn.qkv_proj is None or mlp.gate_up_proj is None:
        raise ValueError("the fused decode layer reads the fused projections: call "
                         "fuse_projections() first.")
    tensors = dict(layer.named_parameters()) | dict(layer.named_buffers())
    weights: dict[str, torch.Tensor | None] = dict.fromkeys(WEIGHTS)
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        if name in SLOTS:
            slot = SLOTS[name]
            weights[slot] = tensor if slot in MATRICES else tensor.float().contiguous()
        elif module in VIEWS:
            fused = f"{VIEWS[module]}.{kind}"
            if (fused not in tensors or tensor.untyped_storage().data_ptr()
                    != tensors[fused].untyped_storage().data_ptr()):
                raise ValueError(f"{name} is no longer a view of {fused}, which the fused "
                                 "decode layer reads; call fuse_projections() again after "
                                 "changing weights.")
        else:
            raise ValueError(f"the fused decode layer has no slot for the layer's {name}: it "
                             "would compute without it. Use attention='torch'.")
    norms = (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)
    if any(n is not None and n.eps != layer.input_layernorm.eps for n in norms):
        raise ValueError("the fused decode layer uses one epsilon for every RMSNorm of a "
                         "layer; this layer's differ. Use attention='torch'.")
    check_layer_weights(weights)
    return weights


class FusedCpuDecoder:
    """A model's decode-only steps through the fused C decode layer (float32, bfloat16 or int8
    weights on a CPU, after fuse_projections; a float32, bfloat16 or int8 KV cache). Building it
    checks every layer's weights (``layer_weights``) and hands the model's other small products
    (the lm_head's, a mixed step's) to the small-batch kernel (``use_small_batch_linear``). The
    residual stream stays float32 through the layers, whatever the weights' format."""

    def __init__(self, model: LlamaForCausalLM, max_rows: int | None = None):
        """``max_rows``: the most rows a step may have and still be fused (the engine's
        ``max_fused_decode_rows``, resolved once at start); None: ``SmallBatchLinear.kernel_rows``.
        """
        self.model = model
        self.max_rows = SmallBatchLinear.kernel_rows if max_rows is None else max_rows
        from minicb.kernels.cpu import check_layer_weights

        self.layers = [layer_weights(layer) for layer in model.model.layers]
        self.w_dtype = check_layer_weights(self.layers[0])
        use_small_batch_linear(model)

    def takes(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        """The plan marks every row a decode (meta.num_decode_rows), and there are few enough
        rows that the small-batch products win (``max_rows``); never the live thread count."""
        rows = meta.seq_lens.shape[0]
        if meta.num_decode_rows != rows or rows > self.max_rows:
            return False
        if num_tokens != rows:
            raise ValueError(f"the plan marks all {rows} rows as decodes, but the step has "
                             f"{num_tokens} tokens: a decode row has exactly one.")
        return True

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                 logits_indices: torch.Tensor) -> torch.Tensor:
        """The model's forward for a step it ``takes``: the same embedding, rotary angles, final
        norm and head, and each layer as one call (kernels/cpu_decode_layer.c)."""
        from minicb.kernels import cpu

        inner = self.model.model
        attn, rows = inner.layers[0].self_attn, input_ids.shape[0]
        with torch.inference_mode():
            x = inner.embed_tokens(input_ids).float().contiguous()
            cos, sin = inner.rotary_emb(positions, torch.float32)
            step = cpu.decode_step_cpu(x, cos.reshape(rows, -1), sin.reshape(rows, -1),
                                       meta.slot_mapping, meta.seq_lens, meta.block_tables,
                                       attn.num_heads, attn.num_kv_heads, attn.head_dim,
                                       inner.layers[0].mlp.down_proj.in_features,
                                       inner.norm.eps, attn.scale)
            for weights, (k_cache, v_cache) in zip(self.layers, kv_caches):
                cpu.decode_layer_cpu(x, weights, k_cache, v_cache, step, self.w_dtype)
            dtype = inner.embed_tokens.weight.dtype
            return self.model.lm_head(inner.norm(x.to(dtype))[logits_indices]).float()
