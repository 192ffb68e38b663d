"""The engine's knobs, validated up front so a bad setting fails with a clear message.

`EngineConfig` is what the caller asks for: frozen, never changed by the engine that receives
it. Some knobs depend on the model (`max_model_len` defaults to its context) or on each other
(`num_kv_blocks` defaults to enough for `max_num_seqs` requests of `max_model_len` tokens), and
`attention="auto"` depends on the machine; `EngineConfig.resolve` fills them in once, into a new
frozen `ResolvedConfig` that remembers which values it derived. So `replace(engine.config,
max_num_seqs=64)` derives the pool size again for 64 requests, instead of keeping the old one as
if the caller had chosen it.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, dataclass, field, fields

from minicb.registry import ATTENTION_BACKENDS, KV_CACHES, SCHEDULERS

DTYPES = ("float32", "float16", "bfloat16")
# weight-only quantization applied at load (minicb/model/quant.py), named as vLLM's knob names it
QUANTIZATIONS = ("int8", "int4")
# the KV cache's storage, vLLM's kv_cache_dtype: auto = the model's dtype; int8 = one float32
# scale per (token, KV head) inside its block (CPU); fp8 (alias fp8_e4m3) = FP8 e4m3 with the
# same scale per row (the Triton kernels on a GPU; the torch backend anywhere)
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3")
POLICIES = ("fcfs", "priority", "shortest_prompt_first")
STEP_ORDERS = ("decode_first", "prefill_first")
SPECULATIVE_METHODS = ("ngram", "draft_model")
SPECULATIVE_KNOBS = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                     "speculative_disable_by_batch_size", "speculative_model")
# the knobs only one proposer reads
PROPOSER_KNOBS = {"ngram": ("speculative_model",),
                  "draft_model": ("prompt_lookup_min", "prompt_lookup_max")}
# the continuous scheduler's policy knobs, and every knob only it uses (another scheduler refuses
# them set away from their defaults: naive and static batches admit in order, allocate a request's
# blocks whole and never claim a cached prefix)
POLICY_KNOBS = ("policy", "step_order", "max_prefill_tokens_per_step", "max_wait_steps",
                "watermark_blocks")
CONTINUOUS_ONLY_KNOBS = (*POLICY_KNOBS, "enable_prefix_caching")
# the knobs a ResolvedConfig may derive (from the model, the machine or the other knobs)
DERIVED_KNOBS = ("attention", "max_model_len", "num_kv_blocks", "max_fused_decode_rows")
# a decode step of at most this many rows per thread runs in the fused CPU layer: where the
# small-batch products and torch's met on a 2-core AVX2 CPU (benchmarks/log.md). The count of
# threads is the engine's ceiling at start, never the count the load-following policy sets later.
FUSED_DECODE_ROWS_PER_THREAD = 32


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens: the ceiling of num_tokens / block_size."""
    return -(-num_tokens // block_size)


def cli_fields(exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> list[Field]:
    """The knobs that are command-line flags (every field that carries help): those in `only` if
    given, minus those in `exclude`."""
    return [spec for spec in fields(EngineConfig) if "help" in spec.metadata and spec.name
            not in exclude and (only is None or spec.name in only)]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def knob(default, help: str, choices: tuple[str, ...] | None = None, group: str = "engine"):
    """A dataclass field that carries its command-line help: every knob is described once, here."""
    return field(default=default, metadata={"help": help, "choices": choices, "group": group})


@dataclass(frozen=True)
class EngineConfig:
    """Every knob of the engine, its default and its help text. `LLM(**kwargs)` builds one; the
    server, the benchmarks and the demo build their command-line flags from it (add_cli_args)."""

    model: str | None = knob(None, "checkpoint directory or hub id (default: the shipped model)")
    scheduler: str = knob("continuous", "how requests share steps", SCHEDULERS.choices)
    kv_cache: str = knob("paged", "KV layout: one reservation per request, or blocks on demand",
                         KV_CACHES.choices)
    attention: str = knob("auto", "torch (the readable reference) | triton (GPU kernels) | cpu (a "
                          "C kernel "
                          "for decodes, compiled on first use) | auto (cpu for float32 on a CPU "
                          "with a C "
                          "compiler, else torch)", ATTENTION_BACKENDS.choices)
    device: str = knob("cpu", "torch device: cpu or cuda")
    dtype: str = knob("float32", "weights' and KV cache's dtype; auto: bfloat16 on a CPU with "
                      "AVX-512 BF16 or AMX and on a GPU (float16 for a float16 checkpoint), "
                      "else float32 (minicb/model/quant.py)", ("auto", *DTYPES))
    quantization: str | None = knob(
        None, "weight-only quantization of the decoder's matrices at load: int8 (one scale per "
        "output channel) or int4 (groups of 32), CPU; default: none, or what a compressed-tensors "
        "checkpoint stores", QUANTIZATIONS)
    kv_cache_dtype: str = knob(
        "auto", "KV cache storage: auto (the model's dtype), int8 (one float32 scale per token "
        "and KV head, kept in its block: about 3.8x float32's tokens per byte at head_dim 64; "
        "CPU) or fp8 / fp8_e4m3 (FP8 e4m3 with the same scales; attention 'triton' on a GPU, "
        "'torch' anywhere)", KV_CACHE_DTYPES)
    max_num_seqs: int = knob(32, "requests that may be running at once (the batch's slots)")
    max_num_batched_tokens: int = knob(2048, "tokens one step may carry (prompt chunks + decodes)")
    max_model_len: int | None = knob(None, "longest sequence (prompt + output) a request may reach "
                                     "(default: the model's context)")
    block_size: int = knob(16, "tokens per KV block (paged) and the reservation unit (contiguous)")
    num_kv_blocks: int | None = knob(None, "size of the KV pool in blocks (default: enough for "
                                     "max_num_seqs "
                                     "requests of max_model_len tokens, so preemption is never "
                                     "needed)")
    cpu_threads: int | None = knob(None, "CPU threads of a model step (default: torch's count, "
                                   "fewer while other programs keep cores busy; "
                                   "minicb/runner/threads.py)")
    max_fused_decode_rows: int | None = knob(
        None, "largest decode step (rows) the fused CPU layer takes; bigger steps run the torch "
        f"modules (default: {FUSED_DECODE_ROWS_PER_THREAD} per thread of the engine's ceiling at "
        "start; fixed for the engine's life, so outputs never depend on the machine's load)")
    enforce_eager: bool = knob(
        False, "run every step eagerly: no CUDA graphs for decode steps (graphs are captured "
        "only on CUDA with attention='triton'; elsewhere every step is eager anyway)")
    tensor_parallel_size: int = knob(
        1, "processes (GPUs on CUDA) one model is split across, by attention heads and MLP "
        "features, as vLLM's option of the same name; each runs its share of every layer and "
        "the ranks all-reduce twice per layer (minicb/engine/tp_executor.py)")
    seed: int = knob(0, "seed of the sampler's default generator")
    async_scheduling: bool = knob(
        False, "overlap the host's work with the model: plan and pack step n + 1 while step n runs "
        "in its own thread; stops are applied one step late (the token past one is discarded). "
        "Speculative decoding, and requests with penalties, min_tokens or structured output, run "
        "synchronous steps (minicb/engine/core.py)")
    policy: str = knob("fcfs", "admission order; under 'priority' a lower value goes first, as in "
                       "vLLM; "
                       "preemption evicts the latest arrival (under priority, the lowest priority)",
                       POLICIES, group="policy")
    step_order: str = knob("decode_first", "decode_first: running requests get their token and "
                           "prefills fill what is left; prefill_first: new prompts first",
                           STEP_ORDERS, group="policy")
    max_prefill_tokens_per_step: int | None = knob(
        None, "cap on prompt tokens per step, so a long prompt " "is chunked (default: no cap)",
        group="policy")
    max_wait_steps: int | None = knob(
        None, "ageing: a request waiting more steps than this goes first " "(default: off)",
        group="policy")
    watermark_blocks: int = knob(0, "KV blocks admission leaves free for running requests to grow "
                                 "into",
                                 group="policy")
    enable_prefix_caching: bool = knob(
        False, "reuse the KV blocks of cached prompt prefixes (continuous " "scheduler, paged KV)",
        group="policy")
    # speculative decoding (minicb/spec/), named as vLLM's speculative_config names them
    speculative_method: str | None = knob(
        None, "propose tokens and verify them in one step: 'ngram' (prompt lookup: the tokens "
        "that followed the last match of the sequence's final n-gram) or 'draft_model' (a "
        "smaller model with the same tokenizer drafts them); default: off", SPECULATIVE_METHODS)
    speculative_model: str | None = knob(
        None, "the draft checkpoint of speculative_method='draft_model' (default: the shipped "
        "draft, when the model is the shipped default model)")
    num_speculative_tokens: int = knob(4, "k: tokens proposed per request and step (speculation "
                                       "only)")
    prompt_lookup_min: int = knob(2, "shortest n-gram the prompt-lookup proposer matches")
    prompt_lookup_max: int = knob(4, "longest n-gram the prompt-lookup proposer matches (tried "
                                  "first)")
    speculative_disable_by_batch_size: int | None = knob(
        None, "no proposals while more requests than this are running: a big batch is "
        "compute-bound and verification costs more than it saves (default: never off)")
    extra: dict = field(default_factory=dict)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                     defaults: dict | None = None, only: tuple[str, ...] | None = None) -> None:
        """Add one --flag per knob (those in `only` if given, not those in `exclude`) to `parser`,
        with the knob's help text. `defaults` overrides a default where a command has its own
        reason (a benchmark's size)."""
        defaults = defaults or {}
        groups = {"engine": parser.add_argument_group("engine"),
                  "policy": parser.add_argument_group(
                      "scheduling policy (continuous scheduler only; see benchmarks/policies.md)")}
        for spec in cli_fields(exclude, only):
            group = groups[spec.metadata["group"]]
            flag = "--" + spec.name.replace("_", "-")
            default = defaults.get(spec.name, spec.default)
            if spec.type in ("bool", bool):
                group.add_argument(flag, action="store_true", default=default,
                                   help=spec.metadata["help"])
                continue
            kind = str if spec.type in ("str", "str | None") else int
            group.add_argument(flag, type=kind, choices=spec.metadata["choices"], default=default,
                               help=f"{spec.metadata['help']} (default: {default})")

    @classmethod
    def knobs_from_cli(cls, args: argparse.Namespace, exclude: tuple[str, ...] = (),
                       only: tuple[str, ...] | None = None) -> dict:
        """The knobs add_cli_args put on `args`, as keyword arguments for LLM / EngineConfig."""
        return {spec.name: getattr(args, spec.name) for spec in cli_fields(exclude, only)}

    def __post_init__(self) -> None:
        SCHEDULERS.check(self.scheduler)
        KV_CACHES.check(self.kv_cache)
        ATTENTION_BACKENDS.check(self.attention)
        _check(self.dtype in ("auto", *DTYPES),
               f"dtype={self.dtype!r} is not one of {('auto', *DTYPES)}; pick one of those.")
        _check(self.quantization is None or self.quantization in QUANTIZATIONS,
               f"quantization={self.quantization!r} is not one of {QUANTIZATIONS} (or None for "
               "none); pick one of those.")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"kv_cache_dtype={self.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}; pick one "
               "of those.")
        _check(self.kv_cache_dtype != "int8" or (self.device == "cpu"
                                                 and self.attention in ("auto", "cpu", "torch")),
               f"kv_cache_dtype={self.kv_cache_dtype!r} runs on the CPU, with attention 'cpu' or "
               f"'torch' (got device={self.device!r}, attention={self.attention!r}); use those, "
               "or kv_cache_dtype='fp8' on a GPU, or 'auto'.")
        _check(not self.kv_cache_dtype.startswith("fp8") or self.attention != "cpu",
               f"kv_cache_dtype={self.kv_cache_dtype!r} is read by the Triton kernels (attention="
               "'triton', a GPU) and the torch backend (attention='torch', any device), not by "
               "the C kernel (attention='cpu'); use one of those, or kv_cache_dtype='int8' for "
               "the C kernel on a CPU.")
        narrow = [f"{name}={getattr(self, name)!r}" for name, plain in
                  (("quantization", None), ("kv_cache_dtype", "auto"))
                  if getattr(self, name) != plain]
        _check(self.tensor_parallel_size == 1 or not narrow,
               f"{', '.join(narrow)} run in one process: tensor parallelism's ranks load float "
               f"shards (got tensor_parallel_size={self.tensor_parallel_size}); use one of the "
               "two.")
        _check(self.policy in POLICIES,
               f"policy={self.policy!r} is not one of {POLICIES}; pick one of those.")
        _check(self.step_order in STEP_ORDERS,
               f"step_order={self.step_order!r} is not one of {STEP_ORDERS}; pick one of those.")
        _check(isinstance(self.block_size, int) and self.block_size >= 1,
               f"block_size must be an integer >= 1 (got {self.block_size!r}); 16 is the usual "
               f"choice.")
        _check(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
               f"max_num_seqs must be an integer >= 1 (got {self.max_num_seqs!r}).")
        _check(isinstance(self.max_num_batched_tokens, int)
               and self.max_num_batched_tokens >= self.max_num_seqs,
               f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_num_seqs "
               f"({self.max_num_seqs}): a step could not give every running request its next "
               f"token. "
               f"Raise max_num_batched_tokens or lower max_num_seqs.")
        _check(self.max_model_len is None or (isinstance(self.max_model_len, int)
                                              and self.max_model_len >= 2),
               f"max_model_len must be an integer >= 2 or None (got {self.max_model_len!r}).")
        _check(self.cpu_threads is None or (_is_int(self.cpu_threads) and self.cpu_threads >= 1),
               f"cpu_threads must be None (follow the machine's load) or an integer >= 1 (got "
               f"{self.cpu_threads!r}).")
        _check(self.max_fused_decode_rows is None or (_is_int(self.max_fused_decode_rows)
                                                      and self.max_fused_decode_rows >= 0),
               f"max_fused_decode_rows must be None (the default) or an integer >= 0 (0: never "
               f"fuse) (got {self.max_fused_decode_rows!r}).")
        _check(_is_int(self.tensor_parallel_size) and self.tensor_parallel_size >= 1,
               f"tensor_parallel_size must be an integer >= 1 (got "
               f"{self.tensor_parallel_size!r}); 1 runs the model in this process alone.")
        _check(isinstance(self.enforce_eager, bool),
               f"enforce_eager must be True or False (got {self.enforce_eager!r}).")
        _check(self.num_kv_blocks is None or (isinstance(self.num_kv_blocks, int)
                                              and self.num_kv_blocks >= 1),
               f"num_kv_blocks must be an integer >= 1 or None (got {self.num_kv_blocks!r}).")
        cap = self.max_prefill_tokens_per_step
        _check(cap is None or (_is_int(cap) and 1 <= cap <= self.max_num_batched_tokens),
               f"max_prefill_tokens_per_step must be None or an integer from 1 to "
               f"max_num_batched_tokens "
               f"({self.max_num_batched_tokens}) (got {cap!r}); a larger cap could never bind.")
        _check(self.max_wait_steps is None or (_is_int(self.max_wait_steps)
                                               and self.max_wait_steps >= 1),
               f"max_wait_steps must be None (no ageing) or an integer >= 1 (got "
               f"{self.max_wait_steps!r}).")
        _check(isinstance(self.async_scheduling, bool),
               f"async_scheduling must be true or false (got {self.async_scheduling!r}).")
        _check(_is_int(self.watermark_blocks) and self.watermark_blocks >= 0,
               f"watermark_blocks must be an integer >= 0 (got {self.watermark_blocks!r}).")
        defaults = {f.name: f.default for f in fields(self)}
        changed = [f"{name}={getattr(self, name)!r}" for name in CONTINUOUS_ONLY_KNOBS
                   if getattr(self, name) != defaults[name]]
        _check(self.scheduler == "continuous" or not changed,
               f"{', '.join(changed)} only apply to scheduler='continuous' (got "
               f"scheduler={self.scheduler!r}); "
               "use the continuous scheduler or leave those knobs at their defaults.")
        _check(not (self.enable_prefix_caching and self.kv_cache != "paged"),
               "enable_prefix_caching needs kv_cache='paged': only blocks can be shared.")
        self._check_speculative()

    def _check_speculative(self) -> None:
        _check(self.speculative_method is None or self.speculative_method in SPECULATIVE_METHODS,
               f"speculative_method={self.speculative_method!r} is not one of "
               f"{SPECULATIVE_METHODS}; pick one of those or None (no speculation).")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1,
                   f"{name} must be an integer >= 1 (got {value!r}).")
        _check(self.prompt_lookup_min <= self.prompt_lookup_max,
               f"prompt_lookup_min={self.prompt_lookup_min} exceeds prompt_lookup_max="
               f"{self.prompt_lookup_max}; lower the first or raise the second.")
        off = self.speculative_disable_by_batch_size
        _check(off is None or (_is_int(off) and off >= 1),
               f"speculative_disable_by_batch_size must be None or an integer >= 1 (got {off!r}).")
        if self.speculative_method is None:
            defaults = {f.name: f.default for f in fields(self)}
            changed = [f"{name}={getattr(self, name)!r}" for name in SPECULATIVE_KNOBS
                       if getattr(self, name) != defaults[name]]
            _check(not changed, f"{', '.join(changed)} only apply with speculative_method set; "
                   "set speculative_method='ngram' or 'draft_model', or leave them at their "
                   "defaults.")
            return
        defaults = {f.name: f.default for f in fields(self)}
        other = [f"{name}={getattr(self, name)!r}" for name in
                 PROPOSER_KNOBS[self.speculative_method] if getattr(self, name) != defaults[name]]
        _check(not other, f"{', '.join(other)} do not apply to speculative_method="
               f"{self.speculative_method!r}; leave them at their defaults or pick the proposer "
               "that reads them.")
        _check(self.scheduler == "continuous" and self.kv_cache == "paged",
               f"speculative_method={self.speculative_method!r} needs scheduler='continuous' and "
               f"kv_cache='paged' (got scheduler={self.scheduler!r}, kv_cache={self.kv_cache!r}): "
               "verification is a multi-token row of the packed batch, and rejected tokens are "
               "rolled back block by block. Use those, or turn speculation off.")

    def asked(self, name: str):
        """The value the caller asked for (a ResolvedConfig may hold a derived one)."""
        return getattr(self, name)

    def resolve(self, model_max_len: int, attention: str | None = None,
                dtype: str | None = None, thread_ceiling: int = 1) -> ResolvedConfig:
        """A new frozen config with every derived knob filled in: `model_max_len` is the model's
        context, `attention` the backend "auto" (or the asked one) resolved to on this machine,
        `dtype` the one the device runs (bfloat16 becomes float16 on a GPU without it),
        `thread_ceiling` the most CPU threads a step may use (the engine passes its thread
        policy's ceiling, minicb.runner.threads.ceiling; 1 where no model runs)."""
        values = {spec.name: getattr(self, spec.name) for spec in fields(EngineConfig)}
        derived = tuple(getattr(self, "derived", ()))
        for name, value in (("attention", attention), ("dtype", dtype)):
            if value is not None and value != values[name]:
                derived = (*(d for d in derived if d[0] != name),
                           (name, self.asked(name), value))
                values[name] = value
        return ResolvedConfig(**values, model_max_len=model_max_len,
                              thread_ceiling=thread_ceiling, derived=derived)


@dataclass(frozen=True)
class ResolvedConfig(EngineConfig):
    """An EngineConfig with the knobs that depend on the model and on each other filled in, once.

    `derived` records (knob, what was asked, what it became) for every knob filled in, so a
    `dataclasses.replace` of it derives them again from the new values, and
    `given("num_kv_blocks")` tells a chosen pool size from a derived one.
    """

    model_max_len: int = 0
    thread_ceiling: int = 1      # the machine's, given to resolve: max_fused_decode_rows' default
    derived: tuple = field(default=(), repr=False, compare=False)

    def asked(self, name: str):
        for knob_name, asked, got in self.derived:
            if knob_name == name and getattr(self, name) == got:
                return asked
        return getattr(self, name)

    def given(self, name: str) -> bool:
        """Whether the knob's value is the caller's own choice (not derived)."""
        return self.asked(name) is not None and self.asked(name) == getattr(self, name)

    @property
    def num_kv_blocks_given(self) -> bool:
        return self.given("num_kv_blocks")

    def __post_init__(self) -> None:
        asked = {name: self.asked(name) for name in DERIVED_KNOBS}
        super().__post_init__()
        _check(_is_int(self.model_max_len) and self.model_max_len >= 2,
               f"model_max_len must be the model's context, an integer >= 2 (got "
               f"{self.model_max_len!r}).")
        derived = [d for d in self.derived if d[0] == "attention" and self.attention == d[2]]

        def settle(name: str, value) -> None:
            if value != asked[name]:
                derived.append((name, asked[name], value))
            object.__setattr__(self, name, value)

        settle("max_model_len", asked["max_model_len"] or self.model_max_len)
        _check(self.max_model_len <= self.model_max_len,
               f"max_model_len={self.max_model_len} exceeds the model's context "
               f"({self.model_max_len}); lower max_model_len.")
        settle("num_kv_blocks", asked["num_kv_blocks"] or self.max_num_seqs * self.blocks_per_seq())
        if asked["max_fused_decode_rows"] is None:
            settle("max_fused_decode_rows",
                   FUSED_DECODE_ROWS_PER_THREAD * (self.cpu_threads or self.thread_ceiling))
        else:
            settle("max_fused_decode_rows", asked["max_fused_decode_rows"])
        object.__setattr__(self, "derived", tuple(derived))
        self._check_pool()

    def blocks_per_seq(self) -> int:
        """Blocks a request of max_model_len tokens occupies."""
        return blocks_for(self.max_model_len, self.block_size)

    def _check_pool(self) -> None:
        if self.kv_cache == "contiguous":
            _check(self.num_kv_blocks >= self.blocks_per_seq(),
                   f"num_kv_blocks={self.num_kv_blocks} cannot hold one contiguous reservation of "
                   f"max_model_len={self.max_model_len} tokens ({self.blocks_per_seq()} blocks); "
                   "raise num_kv_blocks or lower max_model_len.")
        # admission keeps the watermark free even when nothing runs, so a lone request's first
        # chunk (or its contiguous reservation) plus the watermark must fit the empty pool, or the
        # engine would wait for room that never comes
        chunk = min(self.max_prefill_tokens_per_step or self.max_num_batched_tokens,
                    self.max_model_len)
        first_blocks = self.blocks_per_seq() if self.kv_cache == "contiguous" else blocks_for(
            chunk, self.block_size)
        fits = self.watermark_blocks + first_blocks <= self.num_kv_blocks
        _check(self.watermark_blocks == 0 or fits,
               f"watermark_blocks={self.watermark_blocks} leaves "
               f"{self.num_kv_blocks - self.watermark_blocks} "
               f"of num_kv_blocks={self.num_kv_blocks} blocks free for admission, fewer than the "
               f"{first_blocks} "
               "a request's first step may need, so it could never be admitted; lower "
               "watermark_blocks, raise "
               "num_kv_blocks, or lower max_prefill_tokens_per_step or max_model_len.")
