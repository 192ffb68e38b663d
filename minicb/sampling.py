"""SamplingParams (vLLM's names) and the Sampler that turns logits into next tokens.

Every request owns a CPU `torch.Generator`. Sampling draws ONE uniform number per request per
step from it and inverts the request's own CDF, so a seeded request yields the same tokens alone
or inside any batch, on any device: its randomness never depends on its neighbours.

The CDF runs over the vocabulary in token-id order: any fixed order samples the same
distribution, and this one needs no sort. Only a request with top_k or top_p sorts its row, to
find the tokens it keeps (sorting a batch's rows of 4,096 logits costs more than the rest of
sampling together, about a third of a small model's 64-row decode step on a CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minicb.logits_process import LogitsState, apply_logits_processors
from minicb.structured_outputs import StructuredOutputsParams


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # the penalties and filters (minicb.logits_process): neutral values leave a row untouched
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    structured_outputs: StructuredOutputsParams | None = None
    # the text leaves out special tokens (end of text, chat markers), as vLLM's does by default;
    # False keeps them in the text (the token ids are the same either way)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError("stop must be a string or a list of strings (got "
                             f"{type(self.stop).__name__}).")
        self.stop = list(self.stop or [])
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError("stop_token_ids must be a list of token ids "
                             f"(got {type(self.stop_token_ids).__name__}).")
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("n", self.n, 1, MAX_N)
        _check_int("max_tokens", self.max_tokens, 1, None, "ask for at least one token")
        _check_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE,
                      "use 0 for greedy decoding")
        _check_number("top_p", self.top_p, 0.0, 1.0, "1.0 keeps the whole distribution")
        if self.top_p == 0:
            raise ValueError("top_p must be in (0, 1] (got 0); a tiny top_p keeps only the most "
                             "likely token.")
        if not _is_int(self.top_k) or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or an integer >= 1 (got {self.top_k!r}).")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        self._check_processors()
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false (got {getattr(self, name)!r}).")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings (got {self.stop!r}).")
        if len(self.stop) > MAX_STOP_STRINGS or sum(len(s) for s in self.stop) > MAX_STOP_CHARS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} "
                             f"characters in all (got {len(self.stop)} of "
                             f"{sum(len(s) for s in self.stop)}).")
        for text in self.stop:
            _check_text("stop", text)
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or any(
                not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} token ids "
                             f"(integers >= 0); "
                             f"got {self.stop_token_ids[:5]!r}"
                             f"{'...' if len(self.stop_token_ids) > 5 else ''}.")

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), -2.0, 2.0, "0 turns it off")
        _check_number("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY,
                      MAX_REPETITION_PENALTY, "1 turns it off; above 1 discourages repeats")
        _check_number("min_p", self.min_p, 0.0, 1.0, "0 turns it off")
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens,
                   "it cannot exceed max_tokens")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias must be a dict of at most {MAX_LOGIT_BIAS} token ids "
                                 "to biases, e.g. {50256: -100}.")
            bias = {}
            for token, value in self.logit_bias.items():
                if isinstance(token, str) and token.isdigit():
                    token = int(token)            # OpenAI's JSON keys are token id strings
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0); got "
                                     f"{token!r}.")
                _check_number(f"logit_bias[{token}]", value, -100.0, 100.0,
                              "OpenAI's range: -100 bans the token, 100 all but forces it")
                bias[token] = float(value)
            self.logit_bias = bias or None
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as error:
                raise ValueError(f"structured_outputs: {error}; its fields are json, regex, "
                                 "choice, grammar, json_object, disable_any_whitespace.") from None
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams (got "
                                 f"{type(self.structured_outputs).__name__}).")
            if self.ignore_eos:
                raise ValueError("structured_outputs cannot be combined with ignore_eos: the "
                                 "grammar ends the output with EOS; drop ignore_eos.")
            if self.min_tokens:
                raise ValueError("structured_outputs cannot be combined with min_tokens: the "
                                 "grammar decides where the output ends; drop min_tokens.")

    @property
    def needs_logits_processing(self) -> bool:
        """Whether any penalty, filter or constraint changes this request's logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or self.min_p or self.min_tokens
                    or self.structured_outputs is not None)

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one so small that sampling at it is greedy (dividing logits by it
        would overflow float32)."""
        return self.temperature < GREEDY_BELOW


# Bounds of SamplingParams: beyond them a request is refused, naming the field.
MAX_N = 128
MAX_TEMPERATURE = 100.0
MAX_LOGPROBS = 20                 # as OpenAI's and vLLM's default
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 4096
MAX_STOP_TOKEN_IDS = 1024
MAX_REPETITION_PENALTY = 100.0
# vLLM takes any repetition_penalty above 0; a value this small already multiplies every seen
# token's logit by 100, and one below float32's smallest number (1.4e-45) becomes 0, which turns
# a grammar mask's -inf into NaN (0 * -inf) and lets a masked token through
MIN_REPETITION_PENALTY = 0.01
MAX_LOGIT_BIAS = 1024
GREEDY_BELOW = 1e-5               # temperatures below this sample greedily


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value, low: int, high: int | None, hint: str = "") -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be an integer {span} (got "
                         f"{value!r}){'; ' + hint if hint else ''}.")


def _check_number(name: str, value, low: float, high: float, hint: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            ok = math.isfinite(float(value)) and low <= value <= high
        except OverflowError:
            ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number from {low:g} to {high:g} (got "
                         f"{value!r}); {hint}.")


def _check_text(name: str, text: str) -> None:
    """Text must encode as UTF-8: a lone surrogate (say from a broken JSON escape) cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} is not valid text: {error.reason} at character {error.start}; "
                         "send valid UTF-8.") from None


Logprob = tuple[float, dict[int, float]]   # (the chosen token's logprob, {id: logprob} of the top)


@dataclass
class SamplerOutput:
    """The sampler's answer for a batch of rows, one token each."""

    token_ids: list[int]
    # per row: (logprob of the chosen token, {token_id: logprob} of the top-k) or None
    logprobs: list[Logprob | None]
    # per row, when a row could not be sampled: why (its token is None); None when all went well
    errors: list[str | None] | None = None


@dataclass
class ModelRunnerOutput:
    """A step's result, one entry per row that needed logits, whatever the row was: a decode or a
    prompt's last chunk yields one token, a speculative verification row 1 to k + 1. Every path
    after the model (the scheduler's update, the simulators) reads this one shape."""

    sampled_token_ids: list[list[int] | None]    # None: the row could not be sampled
    logprobs: list[list[Logprob | None] | None]  # per row, one entry per token; None: not asked
    errors: list[str | None]                     # per row: why it has no tokens, else None
    # prompt log-probabilities, by the row's index in the step's SchedulerOutput.seqs: one
    # {token id: logprob} per prompt position the row computed (the next prompt token's and the
    # top prompt_logprobs); None when no row asked
    prompt_logprobs: dict[int, list[dict[int, float]]] | None = None

    @classmethod
    def of(cls, sampled: ModelRunnerOutput | SamplerOutput | Sequence[int | None]
           ) -> ModelRunnerOutput:
        """Read a sampler's one-token-per-row answer, or a plain list of token ids (a model-free
        runner's), as a step's result."""
        if isinstance(sampled, ModelRunnerOutput):
            return sampled
        if not isinstance(sampled, SamplerOutput):
            sampled = SamplerOutput(list(sampled), [None] * len(sampled))
        return cls([None if t is None else [t] for t in sampled.token_ids],
                   [None if lp is None else [lp] for lp in sampled.logprobs],
                   sampled.errors or [None] * len(sampled.token_ids))


class Sampler:
    """Greedy at temperature 0; otherwise temperature → (top-k → top-p) → one inverse-CDF draw.

    Its public functions are the only place these rules live: the runner samples every row with
    `sample` and reads every emitted token's logprob with `logprobs`; speculative decoding's
    acceptance rule and the draft model draw from `probs` with `draw`."""

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator],
                 states: Sequence[LogitsState | None] | None = None) -> SamplerOutput:
        """One token per row, with its logprobs (of the raw logits, as vLLM's default mode)."""
        logits = logits.float()
        tokens = self.sample(logits, params, generators, states)
        return SamplerOutput(tokens.tolist(), self.logprobs(logits, tokens, params))

    @staticmethod
    def sample(logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator],
               states: Sequence[LogitsState | None] | None = None) -> torch.Tensor:
        """One token per row: the argmax for a greedy row, a draw for the others, after the
        rows' logits processors. `states`: each row's LogitsState (minicb.logits_process), for
        rows with penalties, min_tokens or a grammar; None where no row has any."""
        # the one hook: penalties, bias, filters and grammar masks, on the rows that ask
        logits = apply_logits_processors(logits.float(), params, states)
        greedy = [p.greedy for p in params]
        if all(greedy):
            return Sampler.argmax(logits)
        drawn = Sampler.draw(Sampler.probs(logits, params), generators)
        if not any(greedy):
            return drawn
        return torch.where(torch.tensor(greedy, device=logits.device), Sampler.argmax(logits),
                           drawn)

    @staticmethod
    def argmax(logits: torch.Tensor) -> torch.Tensor:
        """The most likely token of each row (the first, on a tie). On a CPU by numpy's
        vectorised argmax: torch's takes about nine times as long there (128 against 14 µs for
        256 rows of 512 logits on the project's 2-core machine), a sizeable part of a step."""
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
        return logits.argmax(dim=-1)

    @staticmethod
    def probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Each row's distribution to draw from: temperature, then top-k and top-p (a greedy
        row gets temperature 1; the caller takes its argmax instead)."""
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params],
                                   device=device)
        probs = (logits.float() / temperature[:, None]).softmax(dim=-1)
        restricted = [row for row, p in enumerate(params) if p.top_k > 0 or p.top_p < 1]
        if restricted:
            rows = torch.tensor(restricted, device=device)
            top_k = torch.tensor([min(params[r].top_k, vocab) if params[r].top_k > 0 else vocab
                                  for r in restricted], device=device)
            # float64: a tiny top_p (1e-300) must stay above 0, where it keeps the top token alone
            top_p = torch.tensor([params[r].top_p for r in restricted], device=device,
                                 dtype=torch.float64)
            probs[rows] = Sampler.keep_top_k_top_p(probs[rows], top_k, top_p)
        return probs

    @staticmethod
    def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """One token per row by inverse CDF, one uniform from each row's own generator. The rows
        need not be normalised: the draw scales the uniform by each row's total."""
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=g) for g in generators]).to(probs.device)
        # the first token whose cumulative mass exceeds u * total: a token of mass 0 is never it
        choice = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)
        return choice.clamp(max=probs.shape[-1] - 1).squeeze(1)

    @staticmethod
    def keep_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor,
                         top_p: torch.Tensor) -> torch.Tensor:
        """Zero every token outside the row's top_k most likely, then outside the smallest set of
        the most likely whose mass (renormalised over the top_k) reaches top_p; the first always
        stays."""
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device)
        sorted_probs = sorted_probs.masked_fill(ranks[None, :] >= top_k[:, None], 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(
            (mass_before >= top_p[:, None]) & (ranks[None, :] > 0), 0.0)
        return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 params: list[SamplingParams]) -> list[Logprob | None]:
        """Row r's chosen token `tokens[r]`: its logprob and the row's top `params[r].logprobs`,
        from the raw logits (as vLLM reports them); None for a row that asked for none."""
        return Sampler.top_logprobs(logits, tokens, [p.logprobs for p in params])

    @staticmethod
    def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                     wanted: list[int | None]) -> list[Logprob | None]:
        """Per row: (the log-probability of `tokens[row]`, {token id: log-probability} of the
        row's top wanted[row] tokens and of tokens[row] itself, as vLLM's), or None where
        wanted[row] is None. The log-softmax of the logits as given, in float32."""
        if all(w is None for w in wanted):
            return [None] * len(wanted)
        logprobs = logits.float().log_softmax(dim=-1)
        tokens = tokens.to(logprobs.device)
        chosen = logprobs.gather(1, tokens[:, None])
        k = max(max(w or 0 for w in wanted), 1)
        top_values, top_ids = logprobs.topk(k, dim=-1)
        # one copy to the host for the whole batch, not one per row: per row, the chosen token's
        # logprob, the top k logprobs, their ids and the chosen id (float64 holds every id and
        # every float32 exactly)
        table = torch.cat([chosen.double(), top_values.double(), top_ids.double(),
                           tokens[:, None].double()], dim=1).tolist()
        result: list[Logprob | None] = []
        for row, w in zip(table, wanted):
            if w is None:
                result.append(None)
                continue
            top = dict(zip(map(int, row[1 + k:1 + k + w]), row[1:1 + w]))
            top.setdefault(int(row[-1]), row[0])
            result.append((row[0], top))
        return result
