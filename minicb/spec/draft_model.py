"""The draft-model proposer: a smaller model with the target's tokenizer drafts the k tokens.

Where its KV lives: in the target's blocks. The draft has cache tensors of its own (its own
layers, KV heads and head size), one block of them for every block of the target's pool, and a
request's block table addresses both: block b of the target's cache and block b of the draft's
hold the same positions of the same request. So every block operation of the KV manager
(allocation, the rollback's truncate, freeing on finish, abort and preemption, prefix-cache claims
and evictions, copy-on-write) applies to both caches at once, with no second table to keep in
step. (vLLM's engine likewise gives its draft layers the target's block tables.)

Sharing blocks is safe only under one invariant: after every step, the draft has computed KV for
exactly the positions the target has. A block the prefix cache hands to another request, or a
block a preempted request recomputes, then holds the right KV in both caches. Each step keeps it
in three moves:

1. **First pass**, before the target's forward: the draft runs every row of the step as the
   target will (prompt chunks, recomputes and plain decodes too, so its KV keeps up), except that a
   verification row feeds only its first token, the last accepted one. Its logits give each
   verification row's first draft token.
2. **Draft decode passes** 2 to k: one batched decode step of the rows still drafting, each feeding
   its previous draft token, so a row's k tokens cost k small decode steps shared by the batch.
3. **Catch-up**, after acceptance: the draft never fed its own k-th token, so a row that accepted
   all k feeds it now (one small decode step of those rows). Rejected positions need nothing: the
   scheduler's truncate frees their blocks in both caches, and a kept block's slots past the
   accepted tokens are written again next step, as in the target's cache.

Greedy requests draft by the draft's argmax; sampled ones draw from q, the draft's distribution
under the request's own temperature, top-k and top-p, with the request's generator, and
`ScheduledSeq.draft_probs` carries q to the rejection rule (minicb.spec.rejection.accept).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from minicb.config import ResolvedConfig
from minicb.model.llama import LlamaForCausalLM
from minicb.model.loader import load_model, load_tokenizer
from minicb.plan import ScheduledSeq, SchedulerOutput
from minicb.runner.model_runner import ModelRunner
from minicb.runner.sampler import Sampler


class DraftModelProposer:
    """Runs the draft through its own ModelRunner: its model and caches, the target's blocks."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write in the draft's cache too: a copied block holds both models' KV."""
        self.runner.copy_blocks(pairs)

    def _forward(self, output: SchedulerOutput, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The draft's forward over a plan; logits for `rows` (indices among the rows the packing
        returns logits for), every such row when None."""
        input_ids, positions, meta, logits_indices, _ = self.runner.prepare(output)
        if rows is not None:
            logits_indices = logits_indices[rows]
        return self.runner.forward(input_ids, positions, meta, logits_indices)

    def propose(self, output: SchedulerOutput) -> None:
        """Fill in every verification row's proposal (the scheduler sized it, k placeholders) and,
        for sampled requests, its draft probabilities; write the draft's KV for the whole step."""
        drafting = [i for i, s in enumerate(output.seqs) if s.proposal]
        # the first pass: the step's rows, a verification row cut to its last accepted token.
        # Decode rows are marked needs_logits like verification rows, so both of the runner's
        # packing paths list one logits position per marked row, in order; the head then runs
        # only on the verification rows' positions
        first = [replace(s, num_tokens=1, token_ids=s.token_ids[:1], proposal=[],
                         needs_logits=True, is_decode=True)
                 if s.proposal else replace(s, needs_logits=s.is_decode) for s in output.seqs]
        marked = torch.tensor([s.needs_logits for s in first]).cumsum(0) - 1
        logits = self._forward(SchedulerOutput(output.step, first), marked[drafting])
        if not drafting:
            return
        seqs = [output.seqs[i] for i in drafting]
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        for depth in range(max(len(s.proposal) for s in seqs)):
            tokens, q = self._draw(logits, [seqs[r] for r in active])
            for j, (r, token) in enumerate(zip(active, tokens.tolist())):
                drafted[r].append(token)
                if q is not None:
                    probs[r].append(q[j])
            active = [r for r in active if len(drafted[r]) < len(seqs[r].proposal)]
            if not active:
                break
            # the next draft decode step: each row feeds the token it just drafted
            rows = [ScheduledSeq(seqs[r].request, 1, seqs[r].start + depth + 1,
                                 [drafted[r][-1]], seqs[r].block_table, seqs[r].params,
                                 seqs[r].generator, needs_logits=True, is_decode=True,
                                 req_id=seqs[r].req_id)
                    for r in active]
            logits = self._forward(SchedulerOutput(output.step, rows))
        for seq, tokens, q in zip(seqs, drafted, probs):
            seq.proposal[:] = tokens
            seq.token_ids[1:] = tokens
            seq.draft_probs = torch.stack(q) if q and not seq.params.greedy else None

    @staticmethod
    def _draw(logits: torch.Tensor, seqs: list[ScheduledSeq]
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row: the argmax for greedy requests; for sampled ones a draw from
        q with the request's generator. Returns the tokens and q (rows of greedy requests unused),
        or None when every row is greedy."""
        tokens = Sampler.argmax(logits.float())
        sampled = [j for j, s in enumerate(seqs) if not s.params.greedy]
        if not sampled:
            return tokens, None
        q = torch.zeros_like(logits, dtype=torch.float32)
        q[sampled] = Sampler.probs(logits[sampled], [seqs[j].params for j in sampled])
        tokens[sampled] = Sampler.draw(q[sampled], [seqs[j].generator for j in sampled])
        return tokens, q

    def catch_up(self, seqs: list[ScheduledSeq]) -> None:
        """Rows that accepted all k proposals: feed the k-th, which the draft never computed, so
        its KV covers every accepted position again."""
        if not seqs:
            return
        rows = [ScheduledSeq(s.request, 1, s.start + len(s.proposal), s.proposal[-1:],
                             s.block_table, s.params, s.generator, is_decode=True,
                             req_id=s.req_id) for s in seqs]
        self._forward(SchedulerOutput(0, rows), torch.zeros(0, dtype=torch.long))


def draft_path(config: ResolvedConfig, target_path: Path) -> Path:
    """The draft checkpoint: `speculative_model`, or the shipped draft beside the shipped model."""
    from minicb.model.default import default_model_path, draft_model_path
    from minicb.model.loader import resolve_model_path

    if config.speculative_model is not None:
        return resolve_model_path(config.speculative_model)
    if target_path.resolve() == Path(default_model_path()).resolve():
        return Path(draft_model_path())
    raise ValueError(f"speculative_method='draft_model' needs speculative_model for {target_path}: "
                     "only the shipped default model has a default draft. Pass a checkpoint with "
                     "this model's tokenizer, or use speculative_method='ngram'.")


def load_draft(config: ResolvedConfig, target_path: Path, target_args,
               target_tokenizer) -> LlamaForCausalLM:
    """Load the draft and refuse one that cannot propose for this target: another vocabulary or
    tokenizer (its token ids would mean other text), or a context shorter than max_model_len."""
    path = draft_path(config, target_path)
    draft = load_model(path, config.device, config.dtype, config.attention)
    args = draft.args
    if args.vocab_size != target_args.vocab_size:
        raise ValueError(f"the draft {path} has a vocabulary of {args.vocab_size} tokens but the "
                         f"model {target_path} has {target_args.vocab_size}; a draft must share "
                         "the model's tokenizer. Pick a draft trained with it.")
    tokenizer = load_tokenizer(path)
    if (tokenizer is not None and target_tokenizer is not None
            and tokenizer.get_vocab() != target_tokenizer.get_vocab()):
        raise ValueError(f"the draft {path} has another tokenizer than the model {target_path} "
                         "(their vocabularies map text to different ids); a draft must share the "
                         "model's tokenizer. Pick a draft trained with it.")
    if args.max_position_embeddings < config.max_model_len:
        raise ValueError(f"the draft {path} reads at most {args.max_position_embeddings} tokens "
                         f"but max_model_len is {config.max_model_len}; lower max_model_len to "
                         f"{args.max_position_embeddings} or pick a draft with a longer context.")
    return draft
