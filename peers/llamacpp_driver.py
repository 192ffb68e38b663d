"""Runs one offline workload through llama.cpp's batched API; executed by `.venv-llamacpp`'s
python (`make peer-llamacpp`), never imported.

    .venv-llamacpp/bin/python peers/llamacpp_driver.py REQUEST.json RESULT.json
    .venv-llamacpp/bin/python peers/llamacpp_driver.py --version

It imports nothing from minicb (llama.cpp's environment does not have it). REQUEST.json holds
the GGUF file, the prompts as token ids, each request's output length and the settings
("parallel": requests decoded at once, "n_ctx_seq": KV cells per request, "threads",
"n_batch"), and optionally "texts" to tokenize with the GGUF's own vocabulary. RESULT.json
receives llama.cpp's version and system line, every request's output token ids, the time each
token appeared, the wall time and CPU seconds of the run, and the load average around it.

The loop is llama.cpp's own continuous batching (its `examples/parallel` and its server's slots)
through the C API: each `llama_decode` takes one batch holding the next token of every running
request and the whole prompt of each request admitted into a free slot (sequence id); a request
that has all its tokens frees its slot and its KV cells for the next waiting one. Sampling is
greedy (the argmax of the logits), with end-of-sequence ignored, as every other system runs it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque


def load(path: str, settings: dict, n_ctx: int):
    """(model, context) for the GGUF at `path`, with the request's threads and batch sizes."""
    import llama_cpp as ll

    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    params = ll.llama_context_default_params()
    threads = settings.get("threads") or os.cpu_count()
    params.n_ctx, params.n_seq_max = n_ctx, settings.get("parallel", 1)
    params.n_batch = settings.get("n_batch", 2048)
    params.n_ubatch = min(params.n_batch, settings.get("n_ubatch", 512))
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = True            # one KV pool every slot draws from, as minicb's blocks
    params.no_perf = True
    context = ll.llama_init_from_model(model, params)
    if not context:
        raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} cells")
    return model, context


def tokenize(model, texts: list[str]) -> list[list[int]]:
    """Each text as the GGUF's vocabulary splits it (no BOS, special tokens as plain text)."""
    import llama_cpp as ll

    vocab = ll.llama_model_get_vocab(model)
    out = []
    for text in texts:
        data = text.encode()
        buffer = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(vocab, data, len(data), buffer, len(buffer), False, False)
        if n < 0:
            raise RuntimeError(f"llama.cpp's tokenizer needs {-n} tokens for {text!r}")
        out.append(list(buffer[:n]))
    return out


def serve(model, context, prompts: list, lengths: list, parallel: int, capacity: int) -> dict:
    """Decode every request greedily, at most `parallel` at once, timing every token."""
    import llama_cpp as ll
    import numpy as np

    if prompts and max(map(len, prompts)) + parallel > capacity:
        raise ValueError(f"a batch of {capacity} tokens cannot hold a {max(map(len, prompts))}-"
                         f"token prompt beside {parallel - 1} running requests: raise n_batch")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    memory = ll.llama_get_memory(context)
    batch = ll.llama_batch_init(capacity, 0, 1)

    def put(row: int, token: int, position: int, seq: int, wants_logits: bool) -> None:
        batch.token[row], batch.pos[row], batch.n_seq_id[row] = token, position, 1
        batch.seq_id[row][0], batch.logits[row] = seq, wants_logits

    load_before, cpu_before = os.getloadavg(), time.process_time()
    arrival = time.perf_counter()
    waiting, free = deque(range(len(prompts))), list(range(parallel - 1, -1, -1))
    running: dict[int, int] = {}                     # sequence id -> request index
    outputs: list[list[int]] = [[] for _ in prompts]
    token_times: list[list[float]] = [[] for _ in prompts]
    finished: list[float | None] = [None] * len(prompts)
    while waiting or running:
        rows = []                                    # (batch row with logits, request index)
        n = 0
        for seq, index in running.items():           # the next token of each running request
            put(n, outputs[index][-1], len(prompts[index]) + len(outputs[index]) - 1, seq, True)
            rows.append((n, index))
            n += 1
        while waiting and free and n + len(prompts[waiting[0]]) <= capacity:
            index, seq = waiting.popleft(), free.pop()      # a prompt joins in a free slot
            running[seq] = index
            for position, token in enumerate(prompts[index]):
                put(n, token, position, seq, position == len(prompts[index]) - 1)
                n += 1
            rows.append((n - 1, index))
        batch.n_tokens = n
        status = ll.llama_decode(context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} with {n} tokens in the batch")
        for row, index in rows:
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(context, row), (n_vocab,))
            outputs[index].append(int(logits.argmax()))
        now = time.perf_counter()
        for seq, index in list(running.items()):
            token_times[index].append(now)
            if len(outputs[index]) >= lengths[index]:
                finished[index] = now
                ll.llama_memory_seq_rm(memory, seq, -1, -1)   # its cells go back to the pool
                del running[seq]
                free.append(seq)
    wall = time.perf_counter() - arrival
    ll.llama_batch_free(batch)
    # llama.cpp's threads are this process's threads: its CPU time is all of theirs
    return {"wall_s": wall, "arrival": arrival, "outputs": outputs, "token_times": token_times,
            "finished": finished, "cpu_seconds": time.process_time() - cpu_before,
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())}}


def run(request: dict) -> dict:
    import llama_cpp as ll

    settings = request["settings"]
    prompts, lengths = request.get("prompts", []), request.get("output_lens", [])
    parallel = settings.get("parallel", 1)
    n_ctx = parallel * settings["n_ctx_seq"]
    model, context = load(request["model"], settings, n_ctx)
    result = {"llama_cpp_version": ll.__version__, "settings": settings,
              "system_info": ll.llama_print_system_info().decode().strip()}
    if "texts" in request:
        result["tokens"] = tokenize(model, request["texts"])
    if prompts:
        capacity = settings.get("n_batch", 2048)
        # warm-up: one short request, so the first timed step does not pay for lazy set-up
        serve(model, context, prompts[:1], [2], 1, capacity)
        result.update(serve(model, context, prompts, lengths, parallel, capacity))
    ll.llama_free(context)
    ll.llama_model_free(model)
    return result


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        import llama_cpp

        print(llama_cpp.__version__)
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        request = json.load(f)
    result = run(request)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
