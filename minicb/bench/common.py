"""What the benchmarks share about what they run: models, workloads, memory probes and timers
(how a benchmark runs, repeats and records itself is `minicb.bench.harness`)."""

from __future__ import annotations

import gc
import inspect
import tempfile
import threading
import time
from pathlib import Path

import torch

from minicb.sim.workload import WORKLOADS, Workload, WorkloadRequest, get_workload

# Shapes of public checkpoints, built with random weights: the GPU numbers need a real model's
# size, not its knowledge, and nothing has to be downloaded.
RANDOM_MODELS = {
    "qwen2-0.5b": dict(architecture="Qwen2", vocab_size=151936, hidden_size=896,
                       intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                       eos_token_id=151643),
    # a Llama that costs almost nothing (one layer, hidden size 64): what a step costs with it
    # is the host's part, schedule, packing, sampling and bookkeeping (bench overhead)
    "llama-tiny": dict(architecture="Llama", vocab_size=512, hidden_size=64,
                       intermediate_size=160, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=2048, rope_theta=10000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=2),
    # a ~100M-parameter Llama with grouped-query attention, for CPU runs a size above the
    # default model: its matrix products, not the per-operation overhead, fill a step
    "llama-100m": dict(architecture="Llama", vocab_size=4096, hidden_size=1024,
                       intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=8, max_position_embeddings=1024, rope_theta=10000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=2),
}


# --- models -------------------------------------------------------------------------------------
def build_random_model(name: str, directory: str | Path, dtype: str = "bfloat16") -> str:
    """Save a checkpoint with `name`'s shape and random weights into `directory`; return its
    path."""
    if name not in RANDOM_MODELS:
        raise ValueError(f"unknown random model {name!r}; choose one of {sorted(RANDOM_MODELS)}.")
    import transformers

    spec = dict(RANDOM_MODELS[name])
    architecture = spec.pop("architecture")
    config = getattr(transformers, f"{architecture}Config")(**spec)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model_class = getattr(transformers, f"{architecture}ForCausalLM")
        model = model_class(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    return str(directory)


def resolve_model(model: str | None, random_model: str | None, dtype: str) -> tuple[str, str]:
    """(checkpoint path, label): --random-model builds one in a temporary directory."""
    if random_model is not None:
        directory = tempfile.mkdtemp(prefix=f"minicb-{random_model}-")
        return (build_random_model(random_model, directory, dtype),
                f"{random_model} (random weights)")
    from minicb.model.loader import resolve_model_path

    path = resolve_model_path(model)
    return str(path), path.name if model is not None else "minicb default model"


def load_hf_model(path: str, device: str, dtype: str):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()      # a progress bar per load: noise in logs and notebooks
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                 attn_implementation="sdpa")
    model = model.to(device).eval()
    ids = torch.tensor([[5, 6, 7]], device=device)   # warm-up
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                   pad_token_id=model.generation_config.pad_token_id or 0)
    return model


def display_path(path: str | Path) -> str:
    """A model path fit for a committed record: relative to the package for the shipped model,
    the temporary directory's name for a random one, else as given."""
    path = Path(path)
    package = Path(__file__).resolve().parent
    try:
        return str(Path("minicb") / path.resolve().relative_to(package))
    except ValueError:
        return path.name if str(path).startswith(tempfile.gettempdir()) else str(path)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct parameters: a tied embedding counts once, and so do weights
    that are views of one fused matrix (minicb's q/k/v and gate/up)."""
    storages = {}
    for p in model.parameters():
        storage = p.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


# --- workloads ----------------------------------------------------------------------------------
def load_workload(name: str, num_prompts: int | None = None) -> Workload:
    """A standard workload from minicb.sim.workload, optionally with fewer requests for a quick run.

    Generated workloads are drawn with n=num_prompts (the same seed, so a smaller run is a
    different draw of the same distribution); fixed ones keep their first num_prompts requests.
    """
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1 (got {num_prompts}).")
    if (name in WORKLOADS and num_prompts is not None and "n"
        in inspect.signature(WORKLOADS[name]).parameters):
        return get_workload(name, n=num_prompts)
    workload = get_workload(name)
    if num_prompts is not None:
        workload.requests = workload.requests[:num_prompts]
    return workload


def fit_to_context(workload: Workload, max_len: int) -> tuple[Workload, float]:
    """Scale every prompt and output length by one factor so the longest request fits `max_len`
    tokens: the distribution keeps its shape. Returns the workload and the factor (1.0 = as is)."""
    longest = max(r.prompt_len + r.output_len for r in workload.requests)
    if longest <= max_len:
        return workload, 1.0
    factor = max_len / longest
    requests = [WorkloadRequest(max(1, int(r.prompt_len * factor)),
                                max(1, int(r.output_len * factor)), r.arrival,
                                r.priority) for r in workload.requests]
    description = f"{workload.description}, lengths scaled by {factor:.3f} to fit {max_len} tokens"
    return (
        Workload(workload.name, requests, description, workload.ignore_eos, dict(workload.extra)),
        factor)


def workload_facts(workload: Workload, scale: float = 1.0) -> dict:
    return {"name": workload.name, "description": workload.description,
            "num_requests": len(workload), "length_scale": scale,
            "prompt_tokens": sum(workload.prompt_lens), "output_tokens": sum(workload.output_lens),
            "prompt_len_range": [min(workload.prompt_lens), max(workload.prompt_lens)],
            "output_len_range": [min(workload.output_lens), max(workload.output_lens)]}


# --- memory -------------------------------------------------------------------------------------
class PeakMemory:
    """Peak memory growth while the block runs: CUDA's allocator statistics on a GPU, the
    process's resident set (sampled every 10 ms) on a CPU.

        with PeakMemory("cpu") as probe:
            work()
        probe.peak_bytes
    """

    def __init__(self, device: str, interval: float = 0.01):
        self.device, self.interval = torch.device(device), interval
        self.peak_bytes = 0
        self._stop = threading.Event()

    def _used(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        import psutil

        return psutil.Process().memory_info().rss

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, self._used())

    def __enter__(self) -> PeakMemory:
        # free what earlier work left unreachable now: freed during the block, it would hide growth
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._start = self._used()
        self._peak = self._start
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._peak = max(self._peak, self._used())
        self.peak_bytes = self._peak - self._start


# --- timers ----------------------------------------------------------------------------------
def make_timer(device: str, rep_ms: int):
    """Median milliseconds per call: triton's do_bench on a GPU (CUDA events, L2 flushed between
    calls), one wall-clock call after a warm-up on the interpreter."""
    if device == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")

    def once(fn):
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return once


def copy_bandwidth_gbps(device: str, timer) -> float:
    """Device-to-device copy of a large buffer: bytes read + bytes written per second."""
    numel = (1 << 28) if device == "cuda" else (1 << 22)  # 1 GiB of float32 on a GPU
    src = torch.empty(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def log_model_steps(engine) -> list[tuple[float, int, int]]:
    """From now on, note every model step's CPU seconds, prefill tokens and rows."""
    log: list[tuple[float, int, int]] = []
    execute = engine.runner.execute

    def timed(plan):
        start = time.process_time()
        try:
            return execute(plan)
        finally:
            log.append((time.process_time() - start, plan.num_prefill_tokens, len(plan.seqs)))

    engine.runner.execute = timed
    return log
