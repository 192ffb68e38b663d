"""The front door: every request is checked here, once, before the engine sees it.

A prompt (text or token ids) and its SamplingParams go in; a `ProcessedPrompt` (its token ids,
checked against the vocabulary and the scheduler's length rule) comes out, or a ValueError that
names the problem and the fix. `LLMEngine.add_request` takes either: a raw prompt is processed
there, a ProcessedPrompt is queued as it is. So a caller that checks its prompts first does not
pay for the checks twice: LLM.generate checks them all before queuing any, and the async engine
tokenises on a thread of its own. vLLM's `Processor` (vllm/v1/engine/processor.py) is the
production counterpart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minicb.params import MAX_PROMPT_CHARS, SamplingParams, _check_text
from minicb.runner.structured_outputs import StructuredOutputManager

Prompt = str | Sequence[int]
TENSOR_HINT = " (call .tolist() on a tensor)"


@dataclass(frozen=True)
class ProcessedPrompt:
    """A prompt that passed the front door: its text (None for token ids), its token ids and the
    settings it was checked with."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


class InputProcessor:
    """Checks and tokenises requests for one engine: its tokenizer, vocabulary and length rule
    (`check_fits`: Scheduler.check_fits, which reads only the configuration, so any thread may
    call it)."""

    def __init__(self, tokenizer, vocab_size: int,
                 check_fits: Callable[..., None], model_path: str,
                 structured_outputs: Callable[..., StructuredOutputManager] | None = None):
        """`structured_outputs(tokenizer)`: the engine's grammar compiler, built on first use
        (LLMEngine._structured_manager); None refuses structured outputs."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.check_fits = check_fits
        self.model_path = model_path
        self.structured_outputs = structured_outputs

    def process(self, prompt: Prompt, params: SamplingParams, tokenizer=None,
                require_fit: bool = False) -> ProcessedPrompt:
        """Tokenise and check one prompt; raise ValueError naming the problem and the fix.

        `tokenizer`: the one to encode with, for a caller on another thread than the steps (a
        tokenizer must never be used by two threads at once; minicb.serving.async_engine).
        `require_fit=True` refuses a request whose prompt + max_tokens exceeds max_model_len
        instead of cutting it short (Scheduler.check_fits)."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams (got {type(params).__name__}); "
                             "pass SamplingParams(...) or leave it out for the defaults.")
        if isinstance(prompt, str):
            if len(prompt) > MAX_PROMPT_CHARS:
                raise ValueError(f"the prompt has {len(prompt)} characters, more than the "
                                 f"{MAX_PROMPT_CHARS} any model here can read; shorten it.")
            _check_text("the prompt", prompt)
            if tokenizer is None:
                raise ValueError(f"this checkpoint ({self.model_path}) has no tokenizer; pass "
                                 "prompts as lists of token ids.")
            token_ids = tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and
                                                       not isinstance(t, bool) for t in prompt):
            token_ids = list(prompt)
        else:
            raise ValueError("a prompt must be a string or a list of token ids (ints); "
                             f"got {type(prompt).__name__}"
                             f"{TENSOR_HINT if hasattr(prompt, 'tolist') else ''}.")
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token.")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, "
                             f"{self.vocab_size}); check the tokenizer matches the model.")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this checkpoint has none: use "
                             "stop_token_ids.")
        bad = [t for t in (params.logit_bias or {}) if t >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias names token ids {bad[:5]} outside the vocabulary [0, "
                             f"{self.vocab_size}); use the model's token ids.")
        if params.structured_outputs is not None:
            if self.structured_outputs is None:
                raise ValueError("structured_outputs are not taken by this engine; leave it out.")
            # compiled now (and cached): a constraint that cannot compile is refused before the
            # request queues
            self.structured_outputs(tokenizer).compile(params.structured_outputs)
        self.check_fits(len(token_ids), params.max_tokens, require_fit=require_fit)
        return ProcessedPrompt(prompt if isinstance(prompt, str) else None, token_ids, params)

    def process_batch(self, prompts: Prompt | Sequence[Prompt],
                      sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                      priority: Sequence[int] | None = None) -> list[ProcessedPrompt]:
        """LLM.generate's arguments: one prompt or a list, one SamplingParams for all or one per
        prompt (None: the defaults), one priority per prompt or none. Every prompt is checked
        before any is queued; an error names the prompt's index."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of token ids, or a list of those "
                             f"(got {type(prompts).__name__}"
                             f"{TENSOR_HINT if hasattr(prompts, 'tolist') else ''}).")
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts; "
                             "pass one for all or one per prompt.")
        processed = []
        for index, (prompt, p) in enumerate(zip(prompts, params_list)):
            try:
                processed.append(self.process(prompt, p))
            except ValueError as error:
                raise ValueError(f"prompt {index}: {error}") from None
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts; pass one "
                             "per prompt.")
        return processed
