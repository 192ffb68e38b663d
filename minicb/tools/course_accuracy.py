"""The course's accuracy gate: the project's lm-eval tasks scored through the student's engine.

The two tasks (minicb.bench.lm_eval.TASKS_DIR: multiple choice by log-likelihood, and greedy
generation to the end of a line) are scored here the way lm-evaluation-harness scores them,
directly through minicb's LLM with the milestone's parts taken from the graded folder, on the
shipped model: a multiple-choice item asks for the prompt's own log-probabilities of context +
each continuation and picks the likeliest continuation; a generation item is compared with its
target. Running lm-eval itself would cost a server and minutes per grading; this costs seconds.

The gate passes when each task's score is within one point of the reference solution's on the
same machine. It exists for builds that change numerics (a quantized kernel, a sampled
acceptance rule): parity checks compare with transformers token by token, this compares what
the model knows.

    python -m minicb.tools.course_accuracy PARTS KNOBS FOLDER...   # each folder's item results
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TOLERANCE_POINTS = 1.0
GATE_TIMEOUT_S = 300


def score_items(folder: Path, parts: tuple[str, ...], knobs: dict) -> dict[str, list[bool]]:
    """Per task, whether each item came out right, through the engine with `folder`'s parts."""
    from minicb import LLM, SamplingParams, default_model_path
    from minicb.bench.lm_eval import TASKS_DIR
    from minicb.tools.course_bench import plugged

    def read(name: str) -> list[dict]:
        return [json.loads(line) for line in (TASKS_DIR / name).read_text().splitlines()
                if line.strip()]

    with plugged(folder, parts):
        llm = LLM(default_model_path(), **knobs)
        tokenizer = llm.llm_engine.tokenizer

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        choice_items = read("stdlib_mc.jsonl")
        prompts, spans = [], []
        for item in choice_items:
            # lm-eval's split: the whole text encoded, the context's own length marks the start
            start = len(encode(item["context"]))
            for choice in item["choices"]:
                prompts.append(encode(item["context"] + choice))
                spans.append(start)
        scored = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0,
                                                      prompt_logprobs=1), use_tqdm=False)
        likelihoods = [sum(step[token] for step, token in zip(out.prompt_logprobs[start:],
                                                              prompt[start:]))
                       for out, prompt, start in zip(scored, prompts, spans)]
        choice_right, at = [], 0
        for item in choice_items:
            mine = likelihoods[at:at + len(item["choices"])]
            at += len(item["choices"])
            choice_right.append(mine.index(max(mine)) == item["answer"])

        generation_items = read("stdlib_gen.jsonl")
        outputs = llm.generate([encode(item["context"]) for item in generation_items],
                               SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)
        generation_right = [out.outputs[0].text.split("\n")[0] == item["target"]
                            for out, item in zip(outputs, generation_items)]
    return {"stdlib_mc": choice_right, "stdlib_gen": generation_right}


def _score_in_new_process(folders: list[Path], parts: tuple[str, ...],
                          knobs: dict) -> list[dict]:
    """Each folder's item results, scored one after the other in one new interpreter (the
    grader's own process may hold a graded chapter already; one interpreter imports torch and
    loads the model once for both)."""
    run = subprocess.run([sys.executable, "-m", "minicb.tools.course_accuracy", ",".join(parts),
                          json.dumps(knobs), *map(str, folders)],
                         capture_output=True, text=True, timeout=GATE_TIMEOUT_S)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit {run.returncode}")
    return json.loads(run.stdout.strip().splitlines()[-1])


@dataclass
class GateResult:
    passed: bool
    summary: str                           # one line: each task's score beside the reference's
    scores: dict[str, tuple[float, float]]  # task → (yours, reference), in points (0-100)


def accuracy_gate(folder: Path, reference: Path, parts: tuple[str, ...],
                  knobs: dict) -> GateResult:
    """Each task within TOLERANCE_POINTS of the reference's score, the engines built alike."""
    try:
        yours, theirs = _score_in_new_process([folder, reference], parts, knobs)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return GateResult(False, f"the engine with your parts could not score the tasks: {error}",
                          {})
    return compare_scores(yours, theirs)


def compare_scores(yours: dict[str, list[bool]], theirs: dict[str, list[bool]]) -> GateResult:
    """The gate's reading of two item-by-item results: each task's score in points, within
    TOLERANCE_POINTS of the reference's, and which items came out differently."""
    scores, words, passed = {}, [], True
    for task in theirs:
        mine, ref = (100 * sum(items) / len(items) for items in (yours[task], theirs[task]))
        scores[task] = (mine, ref)
        passed &= abs(mine - ref) <= TOLERANCE_POINTS
        changed = [i for i, (a, b) in enumerate(zip(yours[task], theirs[task])) if a != b]
        words.append(f"{task} {mine:.1f} (reference {ref:.1f}"
                     + (f"; items {changed[:8]} differ" if changed else "") + ")")
    return GateResult(passed, ", ".join(words), scores)


if __name__ == "__main__":
    names, settings = tuple(p for p in sys.argv[1].split(",") if p), json.loads(sys.argv[2])
    print(json.dumps([score_items(Path(folder), names, settings) for folder in sys.argv[3:]]))
