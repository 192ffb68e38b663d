"""Seeded workloads: request lengths and arrival times, the same for every system compared.

A workload is data, not behaviour: (prompt length, output length, arrival time) per request.
`prompt_token_ids` turns it into prompts for a model; every output length is enforced with
max_tokens and ignore_eos, so all systems do the same work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


@dataclass
class WorkloadRequest:
    prompt_len: int
    output_len: int
    arrival: float = 0.0      # seconds (or cost-model time units); 0 = there from the start
    priority: int = 0


@dataclass
class Workload:
    name: str
    requests: list[WorkloadRequest]
    description: str = ""
    ignore_eos: bool = True
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_lens(self) -> list[int]:
        return [r.prompt_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]

    def with_arrivals(self, arrivals: list[float] | np.ndarray) -> Workload:
        requests = [WorkloadRequest(r.prompt_len, r.output_len, float(a), r.priority)
                    for r, a in zip(self.requests, arrivals)]
        return Workload(self.name, requests, self.description, self.ignore_eos, dict(self.extra))

    def prompt_token_ids(self, vocab_size: int, seed: int = 0, low: int = 3) -> list[list[int]]:
        """Random token ids of the right lengths (ids below `low` are left out: special tokens)."""
        rng = np.random.default_rng(seed)
        return [rng.integers(low, vocab_size, r.prompt_len).tolist() for r in self.requests]


# --- length distributions ------------------------------------------------------------------------
def uniform_lengths(n: int, low: int, high: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(low, high + 1, n).tolist()


def capped_exponential(n: int, mean: float, cap: int, seed: int = 0, minimum: int = 1) -> list[int]:
    """Mostly short, a few long: the shape of real answer lengths."""
    values = np.random.default_rng(seed).exponential(mean, n)
    return np.clip(np.ceil(values), minimum, cap).astype(int).tolist()


def long_tail_lengths(n: int, low: int, high: int, seed: int = 0, alpha: float = 1.2) -> list[int]:
    """Pareto-shaped lengths between low and high."""
    values = low * (1 + np.random.default_rng(seed).pareto(alpha, n))
    return np.clip(values, low, high).astype(int).tolist()


# --- arrivals -------------------------------------------------------------------------------------
def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process with `rate` requests per time unit (inf = all at 0)."""
    return gamma_arrivals(n, rate, 1.0, seed)


def gamma_arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Gamma-distributed gaps with mean 1/rate; burstiness < 1 is burstier than Poisson (vLLM's
    knob)."""
    if rate == float("inf"):
        return np.zeros(n)
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0 (got rate={rate}, "
                         f"burstiness={burstiness}).")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), n)
    return np.cumsum(gaps) - gaps[0]


# --- the book's standard workloads ----------------------------------------------------------------
def fixed(name: str, prompt_lens: list[int], output_lens: list[int],
          description: str = "") -> Workload:
    return Workload(name, [WorkloadRequest(p, o) for p, o in zip(prompt_lens, output_lens)],
                    description)


def seed_example() -> Workload:
    """Four requests needing 4, 4, 10 and 10 tokens on four slots, two more 4-token ones waiting."""
    return fixed("seed-example", [4] * 6, [4, 4, 10, 10, 4, 4],
                 "4/4/10/10 on four slots plus two waiting 4s: static 14 steps, continuous 10")


def three_answers() -> Workload:
    """A static batch whose answers need 6, 50 and 300 tokens."""
    return fixed("three-answers", [8, 8, 8], [6, 50, 300],
                 "the short answers wait for the 300-token one")


def chat(n: int = 64, seed: int = 0) -> Workload:
    """Chat-like: short-to-medium prompts, answers mostly short with a tail."""
    return fixed("chat", uniform_lengths(n, 16, 128, seed),
                 capped_exponential(n, 48, 256, seed + 1),
                 "prompts 16-128, outputs capped-exponential (mean 48, cap 256)")


def long_tail(n: int = 256, seed: int = 0) -> Workload:
    """Long-tail: prompts 16-512, outputs capped-exponential up to 512, ignore_eos."""
    return fixed("long-tail", uniform_lengths(n, 16, 512, seed),
                 capped_exponential(n, 96, 512, seed + 1),
                 "prompts 16-512, outputs capped-exponential (mean 96, cap 512)")


def mixed(n: int = 32, seed: int = 0) -> Workload:
    """A small mix for demos and tests: prompts 8-96, outputs 4-96."""
    return fixed("mixed", uniform_lengths(n, 8, 96, seed), long_tail_lengths(n, 4, 96, seed + 1),
                 "prompts 8-96, outputs long-tailed 4-96")


def prefix_heavy(n: int = 96, seed: int = 0, systems: int = 4, turns: int = 4,
                 system_len: int = 160, user_len: int = 24, answer_len: int = 24) -> Workload:
    """Multi-turn chats under shared system prompts: where routing by prefix pays.

    n // turns conversations, each under one of `systems` system prompts (of `system_len`
    tokens); turn t's prompt is the system prompt, then t user messages (`user_len` each) with
    the t - 1 answers between them (`answer_len` each), so it repeats turn t - 1's prompt and
    adds one answer and one message. Requests go out round by round (every conversation's turn 1,
    in a seeded order, then every turn 2, ...), so a conversation's next turn arrives after its
    last one. `extra["turns"]` holds (system, conversation, turn) per request; `prefix_texts`
    turns it into text prompts.
    """
    rng = np.random.default_rng(seed)
    conversations = max(1, n // turns)
    system_of = rng.integers(0, systems, conversations)
    order, requests = [], []
    for turn in range(1, turns + 1):
        for conversation in rng.permutation(conversations):
            order.append((int(system_of[conversation]), int(conversation), turn))
            prompt_len = system_len + turn * user_len + (turn - 1) * answer_len
            requests.append(WorkloadRequest(prompt_len, answer_len))
    extra = {"turns": order, "system_len": system_len, "user_len": user_len,
             "answer_len": answer_len, "seed": seed}
    return Workload("prefix-heavy", requests,
                    f"{conversations} chats of {turns} turns under {systems} system prompts of "
                    f"{system_len} tokens; messages {user_len}, answers {answer_len}",
                    extra=extra)


def prefix_texts(workload: Workload, words: tuple[str, ...]) -> list[str]:
    """The text prompts of a prefix-heavy workload, from seeded words (about a token each)."""
    extra = workload.extra
    rng = np.random.default_rng(extra["seed"] + 1)
    systems: dict[int, str] = {}
    messages: dict[tuple[int, int], str] = {}
    answers: dict[tuple[int, int], str] = {}

    def words_of(count: int) -> str:
        return " ".join(rng.choice(words, count))

    prompts = []
    for system, conversation, turn in extra["turns"]:
        if system not in systems:
            systems[system] = "system: " + words_of(extra["system_len"])
        parts = [systems[system]]
        for t in range(1, turn + 1):
            if (conversation, t) not in messages:
                messages[conversation, t] = "\nuser: " + words_of(extra["user_len"])
                answers[conversation, t] = "\nassistant: " + words_of(extra["answer_len"])
            parts.append(messages[conversation, t])
            if t < turn:
                parts.append(answers[conversation, t])
        prompts.append("".join(parts) + "\nassistant:")
    return prompts


@functools.cache
def _stdlib_functions(max_prompt_chars: int) -> tuple[str, ...]:
    """Every top-level function of the standard library's modules with a docstring and a body,
    cut after its docstring, in sorted module order (parsed once per process: about 200 files)."""
    import ast
    import sysconfig
    from pathlib import Path

    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines(keepends=True)
        for node in tree.body:
            body = getattr(node, "body", [])
            if (isinstance(node, ast.FunctionDef) and len(body) > 1
                    and ast.get_docstring(node) is not None):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                text = "".join(lines[first:body[0].end_lineno])
                if len(text) <= max_prompt_chars:
                    texts.append(text)
    if not texts:
        raise RuntimeError("found no standard-library functions to use as prompts; is "
                           "sysconfig's stdlib path readable?")
    return tuple(texts)


def code_completion(n: int = 64, seed: int = 0, output_len: int = 128,
                    max_prompt_chars: int = 800) -> Workload:
    """Python to continue: top-level functions of the standard library's own modules, each cut
    after its docstring (the model writes the body). The shipped models were trained on the
    standard library, so they continue these well, and code repeats its own names: where
    speculation's proposals get accepted. `n` functions drawn with `seed` from the modules in
    sorted order; `extra["texts"]` holds the prompts (their lengths here are in characters:
    `prompt_len` is filled in once a tokenizer counts them)."""
    texts = _stdlib_functions(max_prompt_chars)
    rng = np.random.default_rng(seed)
    chosen = [texts[i] for i in rng.choice(len(texts), size=n, replace=n > len(texts))]
    return Workload("code", [WorkloadRequest(len(t), output_len) for t in chosen],
                    f"{n} standard-library functions cut after their docstring, "
                    f"{output_len} tokens each", extra={"texts": chosen, "seed": seed})


WORKLOADS = {"seed-example": seed_example, "three-answers": three_answers, "chat": chat,
             "long-tail": long_tail, "mixed": mixed, "prefix-heavy": prefix_heavy,
             "code": code_completion}


def get_workload(name: str, **kwargs) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}.")
    return WORKLOADS[name](**kwargs)
