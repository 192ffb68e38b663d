"""Chapter 10: placeholders and one-step-late stops, on a fake model and on the shipped one."""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from adapter import chapter, run_docstring_examples

from minicb import LLM, SamplingParams
from minicb.model.default import default_model_path

ch10 = chapter("10")
FAKE_EOS = 0


def test_ch10_worked_examples():
    run_docstring_examples(ch10)


def test_ch10_fill_placeholders_on_random_rows():
    rng = random.Random(0)
    for case in range(300):
        previous = torch.tensor([rng.randrange(100) for _ in range(rng.randint(1, 6))])
        width = rng.randint(1, 3)
        ids = [[rng.choice([rng.randrange(100), -1 - rng.randrange(len(previous))])
                for _ in range(width)] for _ in range(rng.randint(1, 5))]
        expected = [[int(previous[-1 - i]) if i < 0 else i for i in row] for row in ids]
        given = torch.tensor(ids)
        got = ch10.fill_placeholders(given, previous)
        assert got.tolist() == expected, (
            f"case {case}: fill_placeholders({ids}, previous={previous.tolist()}) should give "
            f"{expected}, yours gave {got.tolist()}. Only negative ids are placeholders; -1 - r "
            "names row r of previous.")
        assert given.tolist() == ids, "fill_placeholders changed its input tensor"


def next_token(history: list[int], vocab: int = 12) -> int:
    """The fake model: a token that depends on every token the row was fed (EOS about one time
    in `vocab`)."""
    return hash(tuple(history)) % vocab


class FakeDevice:
    """A model in miniature: its cache is each row's history; it counts the rows it computes."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.rows_computed = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.tolist()
        assert all(i >= 0 for row in ids for i in row), \
            f"the device was fed {ids}: a placeholder was left unfilled"
        if not self.rows:
            self.rows = [list(row) for row in ids]
        else:
            assert len(ids) == len(self.rows), "the step's ids and the kept rows disagree"
            for history, row in zip(self.rows, ids):
                history.extend(row)
        self.rows_computed += len(self.rows)
        return torch.tensor([next_token(history) for history in self.rows])

    def keep(self, rows: list[int]) -> None:
        assert all(0 <= r < len(self.rows) for r in rows), f"no row {rows} in {len(self.rows)}"
        self.rows = [list(self.rows[r]) for r in rows]


def synchronous(prompt: list[int], max_tokens: int) -> list[int]:
    history, output = list(prompt), []
    while True:
        token = next_token(history)
        output.append(token)
        history.append(token)
        if token == FAKE_EOS or len(output) >= max_tokens:
            return output


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ch10_overlapped_equals_synchronous_on_a_fake_model(seed):
    """Random batches whose sequences stop at different steps (EOS or max_tokens): the same
    outputs as each sequence alone, and no row computed that was not needed: each sequence
    costs its tokens, plus one row past an EOS (the step launched before the host saw it)."""
    rng = random.Random(seed)
    for case in range(150):
        length = rng.randint(1, 4)
        prompts = [[rng.randrange(1, 12) for _ in range(length)] for _ in range(rng.randint(1, 8))]
        limits = [rng.randint(1, 14) for _ in prompts]
        device = FakeDevice()
        got = ch10.generate_overlapped(prompts, limits, device, {FAKE_EOS})
        expected = [synchronous(p, m) for p, m in zip(prompts, limits)]
        for index, (mine, theirs) in enumerate(zip(got, expected)):
            assert mine == theirs, (
                f"case {case}, sequence {index} (max_tokens {limits[index]}): the synchronous "
                f"loop gives {theirs}, yours {mine}. A token after a stop must be discarded; "
                "a placeholder names the row in the step before, not in the new plan.")
        needed = sum(len(out) + (len(out) < limit) for out, limit in zip(expected, limits))
        assert device.rows_computed == needed, (
            f"case {case}: the device computed {device.rows_computed} rows where {needed} were "
            "needed: a sequence is planned only while it may need a token (not finished, and "
            "output plus tokens in flight short of max_tokens).")


class TransformersDevice:
    """The shipped model through transformers, its KV in a DynamicCache (greedy)."""

    def __init__(self, model) -> None:
        self.model, self.cache = model, transformers.DynamicCache()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, past_key_values=self.cache).logits[:, -1].argmax(-1)

    def keep(self, rows: list[int]) -> None:
        self.cache.batch_select_indices(torch.tensor(rows, dtype=torch.long))


TEXTS = ["def read(path):\n", "def size(self):\n", "def name(self):\n", "def sort(items):\n",
         "def clear(self):\n", "def test_add():\n", "def close(self):\n", "def run(self):\n"]


def test_ch10_real_model_equals_the_synchronous_engine():
    """The shipped model through your loop: the tokens of minicb's synchronous engine, requests
    stopping at EOS and at max_tokens at different steps included."""
    path = default_model_path()
    llm = LLM(path)
    tokenizer, eos = llm.llm_engine.tokenizer, set(llm.llm_engine.eos_token_ids)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    assert len({len(p) for p in prompts}) == 1, "the prompts must have one length"
    limits = [48, 48, 48, 20, 33, 9, 48, 27]
    reference = [o.outputs[0].token_ids for o in llm.generate(
        prompts, [SamplingParams(max_tokens=m, temperature=0) for m in limits], use_tqdm=False)]
    assert any(r[-1] in eos for r in reference), \
        "no request stopped at EOS: the check lost its point"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    got = ch10.generate_overlapped(prompts, limits, TransformersDevice(model), eos)
    for index, (mine, theirs) in enumerate(zip(got, reference)):
        assert mine == theirs, (f"prompt {TEXTS[index]!r}: minicb's synchronous engine gives "
                                f"{theirs}, your overlapped loop {mine}")
