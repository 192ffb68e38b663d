"""Chapter 14 exercise: a mixture-of-experts block's router, dispatch and combine.

A sparse block replaces the MLP. A router (a linear layer) scores every expert for each token; the
token goes to its top_k experts, and its output is their outputs weighted by the router's
probabilities:

    token t ── router ──► softmax over E experts ──► top-k: experts (2, 5), weights (0.7, 0.3)
    y[t] = 0.7 · expert_2(x[t]) + 0.3 · expert_5(x[t])

Computed token by token, each expert's weights would be read once per token that chose it. A
serving engine turns the loop around: it groups the step's (token, slot) pairs by expert
(dispatch), runs each touched expert once on all its rows (one matrix product per expert; an
expert nobody chose is never read), then sums each token's k outputs back (combine).

The combine's order matters. Float addition is not associative, so summing a token's outputs in
router rank order and in expert-id order can differ in the last bit, and a last bit can flip a
greedy token at a near-tie. transformers' eager block loops over experts in ascending id, adding
into zeros; minicb sums in that order too, so it equals transformers bit for bit. So does yours,
if it sums the same way. The tests compare your functions with minicb.model.moe and
minicb.kernels.fused_moe_reference bit for bit.

An expert is a SwiGLU: down(silu(gate(x)) * up(x)), its weights stacked as transformers holds
them: w_gate_up [E, 2 * size, hidden] (gate rows, then up rows), w_down [E, hidden, size].

Grade it: make grade CH=14
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU on rows x [rows, hidden] (given): w_gate_up [2 * size, hidden] and
    w_down [hidden, size] are that expert's slices of the stacked weights."""
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w_down)


def route(router_logits: torch.Tensor, top_k: int,
          renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top_k experts and their weights, [tokens, top_k] each, the experts of a token
    in ascending id (the weights permuted with them).

    The weights are the softmax over all experts (computed in float32), kept for the top k, and,
    if `renormalize` (Mixtral; Qwen3-MoE's norm_topk_prob), divided by their sum; then cast to
    the logits' dtype.

    >>> weights, ids = route(torch.tensor([[0.0, 2.0, 1.0, 3.0]]), top_k=2, renormalize=True)
    >>> ids.tolist(), [round(w, 3) for w in weights[0].tolist()]
    ([[1, 3]], [0.269, 0.731])
    """
    # BEGIN SOLUTION: softmax, top-k, optional renormalisation, then sort each row by expert id
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(router_logits.dtype)
    ids, order = ids.sort(dim=-1)
    return weights.gather(-1, order), ids
    # END SOLUTION


def dispatch(ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """The step's (token, slot) pairs grouped by expert: for each expert some token chose, in
    ascending id, (expert, its pairs), a pair numbered token * top_k + slot, in ascending order.

    >>> dispatch(torch.tensor([[0, 2], [2, 3]]))
    [(0, tensor([0])), (2, tensor([1, 2])), (3, tensor([3]))]
    """
    # BEGIN SOLUTION: for each touched expert, the flat indices of the slots that chose it
    flat = ids.reshape(-1)
    return [(int(index), (flat == index).nonzero().flatten())
            for index in flat.unique(sorted=True)]
    # END SOLUTION


def moe_forward(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The experts' part of the block for x [tokens, hidden]: each touched expert once on the
    rows of its pairs (`dispatch`, `expert`), its output times the pair's weight, then each
    token's top_k outputs summed slot after slot (slot 0 + slot 1, then + slot 2, ...: ascending
    expert id). Never read an expert no token chose.
    """
    # BEGIN SOLUTION: dispatch, one SwiGLU per touched expert, weight, combine in slot order
    tokens, top_k = ids.shape
    outputs = x.new_zeros(tokens * top_k, x.shape[1])
    flat_weights = weights.reshape(-1, 1)
    for index, pairs in dispatch(ids):
        out = expert(x[pairs // top_k], w_gate_up[index], w_down[index])
        outputs[pairs] = (out * flat_weights[pairs]).to(x.dtype)
    outputs = outputs.view(tokens, top_k, -1)
    total = outputs[:, 0]
    for slot in range(1, top_k):
        total = total + outputs[:, slot]
    return total
    # END SOLUTION
