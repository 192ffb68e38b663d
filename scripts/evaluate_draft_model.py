#!/usr/bin/env python
"""How well the draft model (and prompt lookup) predict the default model, on held-out code.

Speculative decoding with greedy verification keeps a proposal as long as it equals the target's
own greedy token. Along the target's greedy path, a draft that proposes greedily from the same
prefix agrees at position j exactly when the draft's argmax after the target's first j tokens is
the target's token j + 1. So ONE forward pass of each model over the target's greedy completion
tells, for every position, how many proposals a verification step starting there would accept:
the run of agreeing positions from it, capped at k. Prompt lookup is scored the same way, from
`minicb.spec.ngram.propose_ngram` on the prompt plus the output so far.

Writes ``draft_eval.json`` into the draft model's directory: the agreement rate per position and
the mean tokens per verification step for k = 1..8, for both proposers, on the held-out files'
docstring prompts (the same prompts as ``evaluate_default_model.py`` (b)).

Usage::

    python scripts/evaluate_draft_model.py --draft minicb/assets/draft_model
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))
import evaluate_default_model as E  # noqa: E402  (prompts and greedy completion)

from minicb.spec.ngram import propose_ngram  # noqa: E402


def tokens_per_step(agree: list[bool], k: int) -> float:
    """Greedy speculative decoding over a completion whose position j is proposed correctly when
    agree[j]: each step accepts the run of correct proposals from where it starts (at most k) and
    adds the target's own token. Returns completion tokens per verification step."""
    position, steps = 0, 0
    while position < len(agree):
        run = 0
        while run < k and position + run < len(agree) and agree[position + run]:
            run += 1
        position += run + 1
        steps += 1
    return len(agree) / max(steps, 1)


def ngram_tokens_per_step(prompt_ids: list[int], completion: list[int], k: int) -> float:
    """Greedy speculative decoding with prompt lookup, step by step: each step looks up k tokens
    from the prompt and the output so far, keeps those equal to the target's, adds one."""
    position, steps = 0, 0
    while position < len(completion):
        proposal = propose_ngram(prompt_ids + completion[:position], k)
        run = 0
        while (run < len(proposal) and position + run < len(completion)
               and proposal[run] == completion[position + run]):
            run += 1
        position += run + 1
        steps += 1
    return len(completion) / max(steps, 1)


@torch.no_grad()
def draft_agreement(draft, prompt_ids: list[int], completion: list[int]) -> list[bool]:
    ids = torch.tensor([prompt_ids + completion])
    predicted = draft(ids).logits[0].argmax(dim=-1).tolist()
    start = len(prompt_ids) - 1                    # logits at i predict token i + 1
    return [predicted[start + j] == completion[j] for j in range(len(completion))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, default=E.DEFAULT_MODEL)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--prompts", type=int, default=120)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    log = json.loads((args.target / "training_log.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {rel: (stdlib / rel).read_text(encoding="utf-8")
             for rel in log["data"]["val_file_list"] if (stdlib / rel).exists()}
    prompts = E.spread(E.docstring_prompts(files), args.prompts)
    texts = [q["text"] for q in prompts]
    completions = E.greedy_complete(target, tok, texts, args.max_new, 16, bos=False)

    pairs = [(tok.encode(text, add_special_tokens=False), done["ids"])
             for text, done in zip(texts, completions) if done["ids"]]
    total = sum(len(c) for _, c in pairs)
    agree = [draft_agreement(draft, prompt_ids, c) for prompt_ids, c in pairs]
    result = {"target": args.target.name, "draft": args.draft.name, "prompts": len(pairs),
              "completion_tokens": total, "k": list(range(1, 9)),
              # tokens per verification step, weighted by completion length (total tokens over
              # total steps)
              "draft_tokens_per_step": [
                  round(total / sum(len(r) / tokens_per_step(r, k) for r in agree), 3)
                  for k in range(1, 9)],
              "draft_agreement": round(sum(map(sum, agree)) / total, 4),
              "ngram_tokens_per_step": [
                  round(total / sum(len(c) / ngram_tokens_per_step(p, c, k) for p, c in pairs), 3)
                  for k in range(1, 9)]}
    (args.draft / "draft_eval.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
