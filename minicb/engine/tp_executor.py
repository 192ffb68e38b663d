"""Tensor parallelism: one model split over `tensor_parallel_size` processes, one of them this one.

The scheduling process is rank 0, as in nano-vllm: it schedules, runs its own shard and samples.
Ranks 1..N-1 are worker processes, started with torch.multiprocessing's *spawn* (a fresh
interpreter: a forked copy of a process that already runs threads and holds an engine's state is
unsafe). Each step:

1. rank 0 packs the plan as usual (ModelRunner.prepare) and, just before its forward, sends every
   worker the packed step (token ids, positions, the attention metadata; `step_message`) through
   the group's broadcast (minicb/engine/tp_group.py);
2. every rank runs the same layers on its shard; the row-parallel linears all-reduce twice per
   layer, which keeps the ranks in lockstep;
3. rank 0 alone runs the LM head and samples: the requests' generators, logits processors and
   grammar states live here, so nothing but the packed step ever leaves this process.

So a worker never sees a request, a scheduler or a KV manager: it holds its shard and its share of
the KV pool (its own KV heads, as many blocks as rank 0's), and applies the plan's block copies.

Faults: a worker that dies closes its sockets; rank 0's next collective raises, and the runner
turns that into a `TensorParallelError` naming the rank, its process id and its exit code. The
runner is then stopped: every later step raises the same error at once, so the engine fails its
requests instead of hanging, and a server answers 500 with the cause. Workers ignore Ctrl-C (the
scheduling process handles it) and exit when their parent is gone; the runner's finalizer stops
them when the engine is garbage collected, and at interpreter exit.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from multiprocessing.connection import wait
from pathlib import Path
from typing import NoReturn

import torch
import torch.multiprocessing as mp

from minicb.config import ResolvedConfig
from minicb.engine.tp_group import TPGroup, master_store
from minicb.model.attention import AttentionMetadata
from minicb.model.fused_cpu import use_small_batch_linear
from minicb.model.llama import LlamaForCausalLM
from minicb.model.loader import load_model
from minicb.model.parallel_layers import check_split, shard_model
from minicb.runner.model_runner import ModelRunner

log = logging.getLogger("minicb.engine.tp_executor")
START_TIMEOUT = 600.0      # seconds a worker may take to load its shard


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel engine failed; the engine has stopped."""


def rank_threads(config: ResolvedConfig) -> int:
    """Each rank's CPU threads: the engine's share of the cores, split evenly between ranks. The
    count is fixed: the load-following policy would count the sibling ranks as neighbours."""
    from minicb.runner.threads import ceiling

    return config.cpu_threads or max(1, ceiling() // config.tensor_parallel_size)


def step_message(input_ids: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata) -> tuple:
    """What a worker's forward needs of a packed step, as host arrays (they pickle in
    microseconds, where a tensor pickles through torch.save)."""
    def host(tensor: torch.Tensor):
        return tensor.cpu().numpy()

    return ("step", host(input_ids), host(positions), host(meta.slot_mapping),
            host(meta.cu_seqlens_q), host(meta.seq_lens), host(meta.block_tables),
            meta.max_seqlen_q, meta.max_seqlen_k, meta.q_lens_host, meta.seq_lens_host,
            meta.decode_rows, meta.num_decode_rows, meta.num_splits)


def _run_step(runner: ModelRunner, message: tuple) -> None:
    """A worker's part of a step: the layers on its shard (their all-reduces meet rank 0's); the
    final norm and LM head are rank 0's alone."""
    device = runner.device
    input_ids, positions, slots, cu_q, seq_lens, tables = (
        torch.from_numpy(array).to(device) for array in message[1:7])
    meta = AttentionMetadata(slots, cu_q, seq_lens, tables, *message[7:])
    runner.model.model(input_ids, positions, runner.kv_caches, meta)


def _exit_with_parent(parent: int) -> None:
    """A worker whose scheduling process is gone (killed, crashed) exits too: no orphans."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="minicb-tp-parent").start()


def _worker(rank: int, port: int, config: ResolvedConfig, model_path: str, threads: int,
            parent: int, ready) -> None:
    """A worker process: load and split the model, report ready, then run the plans it receives
    until rank 0 says stop (or goes away)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the scheduling process's
    _exit_with_parent(parent)
    size = config.tensor_parallel_size
    device = f"cuda:{rank}" if config.device.startswith("cuda") else config.device
    try:
        torch.set_num_threads(threads)
        if device.startswith("cuda"):      # NCCL and the shard's tensors on this rank's GPU
            torch.cuda.set_device(rank)
        group = TPGroup(rank, size, port, device)
        model = load_model(Path(model_path), device, config.dtype, config.attention)
        runner = _shard_runner(model, rank, group, config, device)
    except BaseException as error:   # whatever it is, rank 0 reports it
        ready.send(f"{type(error).__name__}: {error}")
        return
    ready.send(None)
    group.connect()
    with torch.inference_mode():
        while True:
            try:
                message = group.receive()
            except RuntimeError:      # rank 0 went away without a word: nothing left to serve
                return
            if message[0] == "stop":
                return
            if message[0] == "copy":
                runner.copy_blocks(message[1])
            else:
                _run_step(runner, message)


def _shard_runner(model: LlamaForCausalLM, rank: int, group: TPGroup, config: ResolvedConfig,
                  device: str, runner_class=ModelRunner, **kwargs) -> ModelRunner:
    """Split `model` for `rank` and build the runner over the shard: its KV pool holds this rank's
    KV heads. With the C kernels (attention='cpu'), small products go through the small-batch
    kernel; the fused decode layer is not used, since it runs a whole layer, both all-reduces'
    places included, as one C call."""
    from dataclasses import replace

    shard_model(model, rank, config.tensor_parallel_size, group)
    if config.attention == "cpu":
        use_small_batch_linear(model)
    return runner_class(model, replace(config, device=device), **kwargs)


class Workers:
    """Rank 0's handle on the worker processes: send them the plan, tell why one failed, stop
    them. Holds no reference to the runner, so the runner's finalizer can call `shutdown`."""

    def __init__(self, processes: list, group: TPGroup):
        self.processes = processes
        self.group = group
        self.error: str | None = None     # set once a rank failed: the engine has stopped
        self.closed = False

    def send(self, message: tuple) -> None:
        self.check()
        try:
            self.group.send(message)
        except RuntimeError as error:
            self.fail(error)

    def check(self) -> None:
        """Raise the stored failure, or a worker's death noticed between steps."""
        if self.error is None:
            dead = [p for p in self.processes if p.exitcode is not None]
            if dead:
                self.error = self._describe(dead)
        if self.error is not None:
            raise TensorParallelError(self.error)

    def fail(self, error: BaseException) -> NoReturn:
        """A collective raised: find the rank that died (its sockets closed first, its exit code
        comes a moment later), record why, and raise that."""
        deadline = time.monotonic() + 5.0
        dead: list = []
        while not dead and time.monotonic() < deadline:
            dead = [p for p in self.processes if p.exitcode is not None]
            if not dead:
                time.sleep(0.05)
        self.error = (self._describe(dead) if dead else
                      f"a tensor-parallel collective failed ({error}); the engine has stopped.")
        raise TensorParallelError(self.error) from error

    @staticmethod
    def _describe(dead: list) -> str:
        parts = []
        for process in dead:
            code = process.exitcode
            how = (f"was killed by {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            parts.append(f"{process.name} (pid {process.pid}) {how}")
        return (f"tensor-parallel worker {', '.join(parts)}; the engine has stopped: its "
                "requests fail and it runs no more steps. Start a new engine.")

    def shutdown(self) -> None:
        """Stop every worker: ask, wait a moment, then kill what is left."""
        if self.closed:
            return
        self.closed = True
        # no stop message: a worker may be inside a collective rank 0 left (a Ctrl-C mid-step),
        # where a broadcast would wait for it forever; a worker holds nothing worth saving
        for process in self.processes:
            process.join(timeout=0.1)
            if process.is_alive():
                process.kill()
                process.join()


class TensorParallelRunner(ModelRunner):
    """Rank 0's runner: ModelRunner over its shard, which sends each step's forward (and block
    copies) to the workers before running its own part. The forward is the last moment before
    the ranks compute, so an overlapped step's placeholders are already filled in."""

    def __init__(self, model: LlamaForCausalLM, config: ResolvedConfig, workers: Workers,
                 pad_token_id: int = 0, proposer=None):
        super().__init__(model, config, pad_token_id=pad_token_id, proposer=proposer)
        self.workers = workers

    def use_cuda_graphs(self, capture: bool = True) -> None:
        log.warning("tensor_parallel_size > 1 runs every step eagerly: a captured decode step "
                    "would skip sending the plan to the other ranks.")

    def eager_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        self.workers.check()           # a failure noticed between steps raises its own error
        try:
            # from the moment the plan goes out the workers are in this step's collectives, so
            # an interruption anywhere after it leaves the ranks out of step
            self.workers.send(step_message(input_ids, positions, meta))
            return super().eager_forward(input_ids, positions, meta, logits_indices)
        except RuntimeError as error:      # a collective failed: most likely a rank died
            self.workers.fail(error)
        except BaseException:
            # interrupted between collectives (Ctrl-C, an error of this rank's own): the other
            # ranks wait in this step's next collective, and a new plan would meet them there
            self.workers.error = ("a step was interrupted on rank 0, so the ranks are out of "
                                  "step; the engine has stopped. Start a new engine.")
            raise

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.workers.send(("copy", pairs))
        super().copy_blocks(pairs)

    def shutdown(self) -> None:
        """Stop the workers now (the finalizer does it when the runner is collected)."""
        self.workers.shutdown()


def start_tensor_parallel(model: LlamaForCausalLM, config: ResolvedConfig, model_path: str,
                          pad_token_id: int = 0, proposer=None) -> TensorParallelRunner:
    """Spawn ranks 1..N-1, split this process's `model` as rank 0 meanwhile, wait until every
    worker has loaded its shard (or report why one could not), join the group, and return rank
    0's runner."""
    size = config.tensor_parallel_size
    check_split(model, size)              # before any process starts: the sizes that work
    if config.device.startswith("cuda") and torch.cuda.device_count() < size:
        raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs, one per rank; this "
                         f"machine has {torch.cuda.device_count()}.")
    threads = rank_threads(config)            # decided here, once, for every rank
    store = master_store(size)
    context = mp.get_context("spawn")
    processes, pipes = [], []
    for rank in range(1, size):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=_worker, name=f"rank {rank}", daemon=True,
                                  args=(rank, store.port, config, model_path, threads,
                                        os.getpid(), sender))
        process.start()
        sender.close()
        processes.append(process)
        pipes.append(receiver)
    group = TPGroup(0, size, store.port, config.device, store)
    workers = Workers(processes, group)
    try:
        torch.set_num_threads(threads)
        runner = _shard_runner(model, 0, group, config, config.device, TensorParallelRunner,
                               workers=workers, pad_token_id=pad_token_id, proposer=proposer)
        _wait_ready(processes, pipes)
        group.connect()
    except BaseException:
        workers.error = "the engine did not start"
        workers.shutdown()
        raise
    weakref.finalize(runner, workers.shutdown)
    return runner


def _wait_ready(processes: list, pipes: list) -> None:
    """Wait for every worker's report: None once its shard is loaded, or the error that stopped
    it; a worker that dies without a word is reported by its exit code."""
    waiting = dict(zip(pipes, processes))
    deadline = time.monotonic() + START_TIMEOUT
    while waiting:
        ready = wait([*waiting, *(p.sentinel for p in waiting.values())],
                     timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            names = ", ".join(p.name for p in waiting.values())
            raise TensorParallelError(f"tensor-parallel workers {names} did not load their "
                                      f"shards in {START_TIMEOUT:.0f} s.")
        for pipe, process in list(waiting.items()):
            if pipe in ready or process.sentinel in ready:
                try:
                    report = pipe.recv()
                except EOFError:
                    process.join()
                    report = f"it exited with code {process.exitcode} before loading its shard"
                if report is not None:
                    raise TensorParallelError(f"tensor-parallel worker {process.name} could not "
                                              f"start: {report}")
                del waiting[pipe]
