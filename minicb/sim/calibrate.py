"""Calibrate the cost model: what a step really costs, on this machine and on a GPU.

`minicb.sim` charges each step `step_overhead + prefill_token * P + decode_seq * R +
context_token * C` for P prompt tokens, R decode rows and C keys those rows read. The book's
default numbers (1, 1/64, 0 or 0.05, 0) are a caricature of a GPU; this module replaces them with
measurements:

* `measure_steps` runs the real engine through steps of chosen shapes (decode rows, context
  length, a prompt of P tokens joining) and times each one;
* `fit` finds the four numbers by least squares (none negative) and says how well they fit;
* `fit_piecewise` fits them twice, once for the steps the fused C decode layer runs (decodes
  only, at most the engine's `max_fused_decode_rows` rows, on a CPU) and once for every other
  step (the torch modules): the two paths have different fixed costs, so one line through
  both fits neither;
* `A100_LLAMA2_7B` is the same four numbers for a GPU, derived from published measurements
  (see its comment), so the chapters can run the same experiment under both.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from minicb.sim import CostModel

TERMS = ("step_overhead", "prefill_token", "decode_seq", "context_token")

# A GPU, from published figures. lmdeploy's benchmark of Llama-2-7B in fp16 on one A100-80GB
# (TurboMind engine, v0.1.0a1; InternLM/lmdeploy, docs/en/benchmark/a100_fp16.md, "Static
# Inference Benchmark") reports, for 128 output tokens after a 1-token prompt, 100.02 output
# tokens/s at batch 1 (10.0 ms per step) and 4,154.81 at batch 64 (15.4 ms per step); with 2,048
# prompt and 2,048 output tokens at batch 16 the median time per token is 25 ms (about 3,072 keys
# per row); and the first token after a 2,048-token prompt at batch 1 takes 0.139 s against
# 0.022 s after 128 tokens. Solving for the four terms: 10.0 ms per step, 0.067 ms per decode row,
# 0.285 us per key read (Llama-2-7B keeps 0.5 MiB of K and V per token: at the A100's 2.0 TB/s
# that alone is 0.26 us) and 61 us per prompt token (13.4 GFLOP per token at the A100's 312 dense
# TFLOP/s would be 43 us). A derived model, not a measurement of ours.
A100_LLAMA2_7B = CostModel(step_overhead=10.0e-3, prefill_token=61e-6, decode_seq=0.067e-3,
                           context_token=0.285e-6, name="A100-80GB, Llama-2-7B fp16 (published)",
                           unit="s")


@dataclass
class PiecewiseCostModel(CostModel):
    """Two cost models in one: a step of decodes only, with at most `fused_rows` rows, runs
    through the fused C decode layer on a CPU (one call per layer) and costs `fused_overhead +
    fused_decode_seq * rows + fused_context_token * keys`; every other step (a prompt in it, or
    more rows) runs the torch modules and costs what the four inherited terms say."""

    fused_rows: int = 0
    fused_overhead: float = 0.0
    fused_decode_seq: float = 0.0
    fused_context_token: float = 0.0

    def uses_fused(self, prefill_tokens: int, decode_rows: int) -> bool:
        return prefill_tokens == 0 and 0 < decode_rows <= self.fused_rows

    def step_time(self, prefill_tokens: int, decode_rows: int, context_tokens: int = 0) -> float:
        if self.uses_fused(prefill_tokens, decode_rows):
            return (self.fused_overhead + self.fused_decode_seq * decode_rows
                    + self.fused_context_token * context_tokens)
        return super().step_time(prefill_tokens, decode_rows, context_tokens)


PIECEWISE_TERMS = TERMS + ("fused_rows", "fused_overhead", "fused_decode_seq",
                           "fused_context_token")

# This book's reference CPU, measured: `python -m minicb bench calibrate` on a shared 2-core AMD
# EPYC VM, the default model, one torch thread (as the notebooks run), decode-only steps of up to
# 64 rows through the fused C layer, the others through the torch modules; each step timed by the
# stepping thread's CPU time, each shape the least of its repeats: the step with a core and the
# caches to itself, the figure that repeats from run to run (calibration.json; tests/sim holds the
# numbers to it). On a busy machine both clocks rise, the one-row step most (its weights come from
# memory again once others fill the shared cache), so a step's fixed part is larger there: `python
# -m minicb bench step-cost` measures both clocks with the load (chapter 06 reads it). The chapters
# use these numbers so that their outputs are the same on every run; `calibrate()` measures the
# reader's machine.
REFERENCE_CPU = PiecewiseCostModel(
    step_overhead=1.3e-3, prefill_token=71.8e-6, decode_seq=0.0916e-3,
    context_token=0.457e-6, fused_rows=64, fused_overhead=0.294e-3,
    fused_decode_seq=0.119e-3, fused_context_token=0.521e-6,
    name="2-core CPU, minicb's default model (measured)", unit="s")


@dataclass
class StepSample:
    prefill_tokens: int
    decode_rows: int
    context_tokens: int
    seconds: float          # the median (or the least) of the repeats


@dataclass
class Fit:
    cost: CostModel
    samples: list[StepSample]
    predicted: list[float]
    r2: float
    worst_error: float      # the largest |predicted - measured| / measured

    def table(self) -> list[dict]:
        return [{"prompt tokens": s.prefill_tokens, "decode rows": s.decode_rows,
                 "keys read": s.context_tokens, "measured ms": round(s.seconds * 1e3, 2),
                 "model ms": round(p * 1e3, 2)} for s, p in zip(self.samples, self.predicted)]


def fit(samples: list[StepSample], name: str = "this machine") -> Fit:
    """Least squares over the four terms, in relative error (a 2 ms step counts as much as a
    40 ms one: the small decode steps are most of a run), with any term that would come out
    negative dropped (a step cannot get cheaper with more work) and the rest refitted."""
    features = np.array([[1.0, s.prefill_tokens, s.decode_rows, s.context_tokens]
                         for s in samples])
    target = np.array([s.seconds for s in samples])
    weight = 1.0 / target
    active = list(range(len(TERMS)))
    while True:
        coef, *_ = np.linalg.lstsq(features[:, active] * weight[:, None], target * weight,
                                   rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    values = dict.fromkeys(TERMS, 0.0)
    for index, value in zip(active, coef):
        values[TERMS[index]] = max(float(value), 0.0)
    cost = CostModel(**values, name=name, unit="s")
    return _scored(cost, samples)


def fit_piecewise(samples: list[StepSample], fused_rows: int,
                  name: str = "this machine") -> Fit:
    """`fit` twice: over the steps the fused decode layer runs (decodes only, at most
    `fused_rows` rows) and over all the others; `fused_rows=0` is one fit over everything."""
    cost = PiecewiseCostModel(fused_rows=fused_rows, name=name, unit="s")
    fused = [s for s in samples if cost.uses_fused(s.prefill_tokens, s.decode_rows)]
    other = [s for s in samples if not cost.uses_fused(s.prefill_tokens, s.decode_rows)]
    if other:
        general = fit(other).cost
        for term in TERMS:
            setattr(cost, term, getattr(general, term))
    if fused:
        small = fit(fused).cost
        cost.fused_overhead = small.step_overhead
        cost.fused_decode_seq = small.decode_seq
        cost.fused_context_token = small.context_token
    return _scored(cost, samples)


def _scored(cost, samples: list[StepSample]) -> Fit:
    """The fit's predictions for its samples, its R² and its worst relative error."""
    target = np.array([s.seconds for s in samples])
    predicted = [cost.step_time(s.prefill_tokens, s.decode_rows, s.context_tokens)
                 for s in samples]
    residual = target - np.array(predicted)
    spread = ((target - target.mean()) ** 2).sum()
    r2 = float(1 - (residual ** 2).sum() / spread) if spread > 0 else 1.0
    worst = float(max(abs(r) / t for r, t in zip(residual, target)))
    return Fit(cost, samples, predicted, r2, worst)


def fused_rows_of(llm) -> int:
    """How many decode rows a step may have and still run the fused C decode layer in this
    engine (its resolved `max_fused_decode_rows`; 0 when the model runs only its torch modules:
    a GPU, or CPU kernels off)."""
    engine = llm.llm_engine
    if engine.runner.fused is None:
        return 0
    return int(engine.config.max_fused_decode_rows)


def measure_steps(llm=None, rows: tuple[int, ...] = (1, 4, 16, 48),
                  contexts: tuple[int, ...] = (16, 384), prompts: tuple[int, ...] = (64, 256),
                  repeats: int = 5, seed: int = 0, clock=time.perf_counter,
                  reduce=statistics.median) -> list[StepSample]:
    """Time real engine steps of known shapes.

    For each context length and number of rows: that many requests with prompts of that length
    are prefilled, then `repeats` pure decode steps are timed; then, for each prompt length, a
    new request joins and the step that carries its whole prompt beside the decodes is timed
    (`repeats` times, one newcomer each). Each sample is the median of its repeats (`reduce`:
    `min` on a shared machine, where other programs only ever add time to a step).

    `clock` is what a step is timed with: wall-clock by default; `time.thread_time` (the CPU
    time of the thread that steps) leaves out the time the step waited for a core, which is what
    to use on a shared machine when the engine computes on this one thread (one torch thread,
    `cpu_threads=1`)."""
    from minicb import LLM, SamplingParams

    if llm is None:
        llm = LLM(max_num_seqs=max(rows) + 1,
                  max_num_batched_tokens=max(max(rows) * max(contexts), max(prompts) + max(rows)))
    engine = llm.llm_engine
    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    samples: list[StepSample] = []
    counter = 0

    def ids(n: int) -> list[int]:
        return rng.integers(3, vocab, size=n).tolist()

    def timed_step() -> float:
        start = clock()
        engine.step()
        return clock() - start

    # warm up first (the first steps of a fresh engine pay for cold caches and first-touch
    # memory), untimed: one request through its prompt and a few decodes, then a few rows more
    warm = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for index in range(4):
        engine.add_request(f"calibrate-warm-{index}", ids(min(contexts)), warm)
    while engine.has_unfinished_requests():
        engine.step()
    for context in contexts:
        for r in rows:
            long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
            group = []
            for _ in range(r):
                counter += 1
                group.append(f"calibrate-{counter}")
                engine.add_request(group[-1], ids(context), long)
            while any(req.is_prefilling for req in engine.scheduler.running) or \
                    engine.num_waiting:
                engine.step()
            engine.step()                      # one decode to settle
            keys = lambda: sum(req.num_computed_tokens + 1 for req in engine.scheduler.running)
            before = keys()
            times = [timed_step() for _ in range(repeats)]
            samples.append(StepSample(0, r, before + r * (repeats // 2), reduce(times)))
            for prompt in prompts:
                times = []
                for _ in range(repeats):
                    counter += 1
                    before = keys()
                    engine.add_request(f"calibrate-{counter}", ids(prompt),
                                       SamplingParams(max_tokens=1, temperature=0,
                                                      ignore_eos=True))
                    times.append(timed_step())
                samples.append(StepSample(prompt, r, before, reduce(times)))
            for request_id in group:
                engine.abort(request_id)
            engine.step()                      # let the aborts land
    return samples


def calibrate(llm=None, **kwargs) -> Fit:
    """Measure this machine's steps and fit the cost model to them: piecewise where the engine
    runs decode-only steps through the fused C layer (see `fit_piecewise`)."""
    from minicb import LLM

    if llm is None:
        rows, contexts = kwargs.get("rows", (1, 4, 16, 48)), kwargs.get("contexts", (16, 384))
        prompts = kwargs.get("prompts", (64, 256))
        llm = LLM(max_num_seqs=max(rows) + 1,
                  max_num_batched_tokens=max(max(rows) * max(contexts), max(prompts) + max(rows)))
    return fit_piecewise(measure_steps(llm, **kwargs), fused_rows_of(llm))
