#!/usr/bin/env python
"""Train minicb's embedded default model: a tiny Llama that writes Python, on the CPU.

The book needs a real model that runs offline, produces real text and stops by itself at
natural, varied lengths. This script builds one from the Python standard library that ships
with the running interpreter:

1. **Data.** Every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``, minus test suites,
   ``site-packages``, ``lib2to3`` and a few data tables (codec tables, pydoc's topic strings).
   Each file is split at its top-level statements: every top-level function or class (with its
   decorators) is one chunk followed by the end-of-text token; the module-level code between them
   (docstring, imports, constants, comments) forms blocks with no end-of-text after them. Each file
   starts with an end-of-text token. A model trained on this stream ends a generated function or
   class with end-of-text, so requests stop on their own, at lengths that vary like real code.
   Files are split into training and validation by a hash of their path (stable across seeds).
2. **Tokenizer.** Byte-level BPE (the ``tokenizers`` library), trained on the training files, with
   a single special token ``<|endoftext|>`` serving as BOS, EOS and padding. Byte-level BPE
   round-trips any text exactly (indentation, unicode). Every newline is a token of its own: were
   it merged with the indentation after it (GPT-2's rule), a prompt ending in a newline would end
   in a token that training only ever saw at the end of a chunk, and the model would stop at once.
3. **Model.** ``transformers.LlamaForCausalLM``: RMSNorm, RoPE, SwiGLU, grouped-query attention,
   tied input/output embeddings, float32 weights.
4. **Training.** AdamW with linear warmup and cosine decay on packed windows of the token stream,
   single-threaded by default so it can share a small machine.

Budget and determinism: ``--minutes`` is CPU time of the training loop per thread (the same as
wall-clock time on an otherwise idle machine, and not stretched by other work sharing the cores).
The tokenizer, data order, initialisation and learning-rate schedule depend only on ``--seed`` and
the number of optimizer steps; that number is calibrated from the CPU time of the first steps and
recorded in ``training_log.json``, and ``--steps N`` (same seed, thread count and library versions)
repeats a run exactly.

Usage::

    python scripts/train_default_model.py --minutes 40            # writes
    minicb/assets/default_model
    python scripts/train_default_model.py --minutes 1 --out /tmp/m  # smoke run
    python scripts/train_default_model.py --minutes 12 --hidden 128 --layers 2 --heads 2 \
        --kv-heads 1 --intermediate 352 --tokenizer minicb/assets/default_model \
        --out minicb/assets/draft_model        # the draft model for speculative decoding
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "minicb" / "assets" / "default_model"
EOT = "<|endoftext|>"

# Directories (any path component) and files left out of the corpus.
EXCLUDED_DIRS = {
    "test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__", "lib-dynload",
    "encodings",   # generated codec tables
    "pydoc_data",  # one 750 kB file of documentation strings
    "ensurepip",   # bundled wheels and a bootstrap shim
}
EXCLUDED_FILES = {
    "html/entities.py",  # a 2,000-entry table of HTML entity names
    "stringprep.py",     # generated unicode tables
}


# ----------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------


def _repo_relative(path: Path) -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def stdlib_files(root: Path) -> list[Path]:
    """The standard library's ``.py`` files that make up the corpus, in sorted order."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = rel.parts
        if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in parts[:-1]):
            continue
        name = parts[-1]
        if name.startswith(("test_", "_sysconfigdata")) or rel.as_posix() in EXCLUDED_FILES:
            continue
        files.append(path)
    return files


def is_validation(rel_path: str, val_percent: float) -> bool:
    """Held-out files are chosen by a hash of their relative path: stable across seeds and runs."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big")
    return (h % 10_000) < val_percent * 100


def split_top_level(source: str) -> list[tuple[str, bool]]:
    """Split a module into ``(text, ends_with_eot)`` chunks at its top-level statements.

    Each top-level function or class, from its first decorator to its last line, is a chunk with
    ``ends_with_eot=True``. The lines between them (module docstring, imports, assignments,
    comments, ``if __name__ == "__main__":`` blocks) form chunks with ``ends_with_eot=False``;
    leading blank lines of such a chunk are dropped and whitespace-only chunks are skipped. The
    chunks' texts concatenated give back the module minus those blank lines.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    chunks: list[tuple[str, bool]] = []

    def add_module_block(a: int, b: int) -> None:
        text = "".join(lines[a:b]).lstrip("\r\n")
        if text.strip():
            chunks.append((text, False))

    cur = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            end = node.end_lineno
            add_module_block(cur, start)
            text = "".join(lines[start:end])
            if not text.endswith("\n"):
                text += "\n"
            chunks.append((text, True))
            cur = end
    add_module_block(cur, len(lines))
    return chunks


def load_corpus(root: Path, val_percent: float) -> dict[str, list]:
    """Read and split the corpus: ``{"train": [(rel, chunks)], "val": [(rel, chunks)]}``."""
    out: dict[str, list] = {"train": [], "val": []}
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            source = path.read_text(encoding="utf-8")
            chunks = split_top_level(source)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if not chunks:
            continue
        out["val" if is_validation(rel, val_percent) else "train"].append((rel, chunks))
    return out


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with one special token, ``<|endoftext|>`` (id 0); newlines stand alone."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap_tokenizer(tok, model_max_length: int):
    """The ``transformers`` tokenizer that gets saved: EOS = BOS = PAD = ``<|endoftext|>``.

    No special tokens are added on encode, so ``decode(encode(text)) == text`` for any text.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def tokenize_files(tok, files: list, eot_id: int) -> list[list[int]]:
    """One token list per file: ``EOT chunk [EOT] chunk [EOT] ...`` (EOT after
    functions/classes)."""
    flat = [text for _, chunks in files for text, _ in chunks]
    encoded = tok.encode_batch(flat, add_special_tokens=False)
    out, i = [], 0
    for _, chunks in files:
        ids = [eot_id]
        for _, ends in chunks:
            ids.extend(encoded[i].ids)
            i += 1
            if ends:
                ids.append(eot_id)
        out.append(ids)
    return out


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------


class WindowSampler:
    """Packed training windows of ``seq_len + 1`` tokens, reshuffled every epoch.

    Epoch ``e`` shuffles the files (seeded by ``seed`` and ``e``), concatenates them, starts at a
    random offset, cuts the stream into windows and shuffles the windows.
    """

    def __init__(self, docs: list[list[int]], seq_len: int, batch_size: int, seed: int):
        self.docs, self.seq_len, self.batch_size, self.seed = docs, seq_len, batch_size, seed
        self.epoch, self.windows, self.pos = -1, None, 0
        self.tokens_per_epoch = sum(len(d) for d in docs)

    def _new_epoch(self) -> None:
        self.epoch += 1
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.docs), generator=g).tolist()
        stream = torch.tensor([t for i in order for t in self.docs[i]], dtype=torch.long)
        offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
        n = (len(stream) - offset) // (self.seq_len + 1)
        windows = stream[offset : offset + n * (self.seq_len + 1)].view(n, self.seq_len + 1)
        self.windows = windows[torch.randperm(n, generator=g)]
        self.pos = 0

    def next_batch(self) -> torch.Tensor:
        if self.windows is None or self.pos + self.batch_size > len(self.windows):
            self._new_epoch()
        batch = self.windows[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return batch


def validation_windows(docs: list[list[int]], seq_len: int) -> torch.Tensor:
    """The held-out stream (files in sorted order) cut into non-overlapping windows."""
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    n = len(stream) // (seq_len + 1)
    return stream[: n * (seq_len + 1)].view(n, seq_len + 1)


@torch.no_grad()
def evaluate_loss(model, windows: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats/token) over ``windows``."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i : i + batch_size]
        logits = model(input_ids=w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1),
                               reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def lr_at(step: int, total: int, peak: float, warmup: int, min_frac: float) -> float:
    """Linear warmup for ``warmup`` steps, then cosine decay to ``min_frac * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tokenizers
    import transformers

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "platform": platform.platform(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--minutes", type=float, default=40.0,
        help="CPU-time budget per thread of the training loop (steps + periodic validation)")
    p.add_argument("--steps", type=int, default=None,
                   help="fixed number of optimizer steps "
                        "(overrides the calibration from --minutes)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    # data / tokenizer
    p.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    p.add_argument("--val-percent", type=float, default=8.0)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="reuse the tokenizer.json of this model directory instead of training one "
                        "(a draft model for speculative decoding shares its target's tokenizer)")
    # model
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--max-positions", type=int, default=512)
    # optimisation
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=4, help="windows per optimizer step")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--evals", type=int, default=16, help="periodic validations over the run")
    p.add_argument("--eval-windows", type=int, default=48,
                   help="validation windows per periodic check")
    p.add_argument("--log-every", type=int, default=25)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()

    def cpu_clock() -> float:
        """Seconds of CPU time this process has used, per torch thread."""
        return time.process_time() / args.threads

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    # ---- data and tokenizer -------------------------------------------------------------------
    corpus = load_corpus(args.stdlib, args.val_percent)
    train_texts = [text for _, chunks in corpus["train"] for text, _ in chunks]
    n_bytes = {k: sum(len(t.encode()) for _, ch in v for t, _ in ch) for k, v in corpus.items()}
    log(f"corpus: {len(corpus['train'])} train files ({n_bytes['train'] / 1e6:.2f} MB), "
        f"{len(corpus['val'])} validation files ({n_bytes['val'] / 1e6:.2f} MB)")

    if args.tokenizer is not None:     # a draft model must share its target's tokenizer exactly
        from tokenizers import Tokenizer

        raw_tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    else:
        raw_tok = train_tokenizer(train_texts, args.vocab_size)
    eot_id = raw_tok.token_to_id(EOT)
    vocab_size = raw_tok.get_vocab_size()
    train_docs = tokenize_files(raw_tok, corpus["train"], eot_id)
    val_docs = tokenize_files(raw_tok, corpus["val"], eot_id)
    n_train_tok = sum(map(len, train_docs))
    n_val_tok = sum(map(len, val_docs))
    log(f"tokenizer: vocab {vocab_size}, {EOT}={eot_id}; train {n_train_tok:,} tokens "
        f"({n_bytes['train'] / n_train_tok:.2f} bytes/token), validation {n_val_tok:,} tokens")

    # ---- model --------------------------------------------------------------------------------
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        initializer_range=0.02,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )
    model = LlamaForCausalLM(config)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: Llama d={args.hidden} layers={args.layers} heads={args.heads}/{args.kv_heads} "
        f"ffn={args.intermediate} vocab={vocab_size}: {n_params:,} parameters "
        f"({n_params * 4 / 2**20:.1f} MiB in float32)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    sampler = WindowSampler(train_docs, args.seq_len, args.batch_size, args.seed)
    val_all = validation_windows(val_docs, args.seq_len)
    stride = max(1, len(val_all) // args.eval_windows)
    val_probe = val_all[::stride][: args.eval_windows]
    tokens_per_step = args.batch_size * args.seq_len

    # ---- loop ---------------------------------------------------------------------------------
    t_loop, c_loop = time.time(), cpu_clock()
    c_eval = cpu_clock()
    val0 = evaluate_loss(model, val_probe, 8)
    eval_seconds = cpu_clock() - c_eval
    log(f"step 0: val loss {val0:.3f} (probe of {len(val_probe)} windows, {eval_seconds:.1f}s)")
    curve_val = [{"step": 0, "tokens": 0, "val_loss": round(val0, 4)}]
    curve_train: list[dict] = []

    total_steps = args.steps
    calib_from, calib_to = 3, 23
    eval_every = None if total_steps is None else max(1, total_steps // args.evals)
    step, running, running_n = 0, 0.0, 0
    t_calib = None
    while total_steps is None or step < total_steps:
        if total_steps is None and step == calib_from:
            t_calib = cpu_clock()
        if total_steps is None and step == calib_to:
            per_step = (cpu_clock() - t_calib) / (calib_to - calib_from)
            budget = args.minutes * 60 - (cpu_clock() - c_loop)
            total_steps = max(calib_to + 1,
                              int((budget - args.evals * eval_seconds) / per_step) + step)
            eval_every = max(1, total_steps // args.evals)
            log(f"calibrated: {per_step:.3f} CPU s/step, {tokens_per_step / per_step:.0f} "
                f"tokens/CPU s -> {total_steps} steps ({total_steps * tokens_per_step / 1e6:.2f}M "
                f"tokens, {total_steps * tokens_per_step / n_train_tok:.2f} epochs)")

        lr = lr_at(step, total_steps or 10**9, args.lr, args.warmup, args.min_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = sampler.next_batch()
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        running += loss.item()
        running_n += 1

        if step % args.log_every == 0:
            avg = running / running_n
            curve_train.append({"step": step, "tokens": step * tokens_per_step,
                                "loss": round(avg, 4), "lr": lr,
                                "grad_norm": round(float(grad_norm), 3),
                                "elapsed_s": round(time.time() - t_loop, 1),
                                "cpu_s": round(cpu_clock() - c_loop, 1)})
            log(f"step {step}/{total_steps or '?'}  loss {avg:.3f}  lr {lr:.2e}  |g| "
                f"{float(grad_norm):.2f}  {step * tokens_per_step / (cpu_clock() - c_loop):.0f} "
                "tok/CPU s")
            running, running_n = 0.0, 0
        if eval_every and (step % eval_every == 0 or step == total_steps):
            if curve_val[-1]["step"] != step:
                v = evaluate_loss(model, val_probe, 8)
                curve_val.append({"step": step, "tokens": step * tokens_per_step,
                                  "val_loss": round(v, 4),
                                  "elapsed_s": round(time.time() - t_loop, 1),
                                  "cpu_s": round(cpu_clock() - c_loop, 1)})
                log(f"step {step}: val loss {v:.3f}")

    train_seconds, train_cpu = time.time() - t_loop, cpu_clock() - c_loop
    log(f"training done: {step} steps in {train_cpu / 60:.1f} CPU min ({train_seconds / 60:.1f} "
        "min wall)")

    # ---- final numbers ------------------------------------------------------------------------
    final_val = evaluate_loss(model, val_all, 8)
    tail = [c["loss"] for c in curve_train[-4:]] or [running / max(1, running_n)]
    final_train = sum(tail) / len(tail)
    log(f"final: train loss {final_train:.3f} (mean of last {len(tail)} logged), "
        f"validation loss {final_val:.3f} over {val_all[:, 1:].numel():,} tokens")

    # ---- save ---------------------------------------------------------------------------------
    args.out.mkdir(parents=True, exist_ok=True)
    hf_tok = wrap_tokenizer(raw_tok, args.max_positions)
    model.config.use_cache = True
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id,
                     do_sample=False).save_pretrained(args.out)
    hf_tok.save_pretrained(args.out)
    # Name the class every transformers release knows (5.x loads it as its TokenizersBackend).
    tok_cfg_path = args.out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")

    record = {
        "seed": args.seed,
        "minutes_budget": args.minutes,
        "train_cpu_minutes": round(train_cpu / 60, 2),
        "train_wall_minutes": round(train_seconds / 60, 2),
        "steps": step,
        "tokens_per_step": tokens_per_step,
        "tokens_seen": step * tokens_per_step,
        "epochs": round(step * tokens_per_step / n_train_tok, 3),
        "threads": args.threads,
        # paths relative to the repository, so the committed log names no one's machine
        "args": {k: (_repo_relative(v) if isinstance(v, Path) else v) for k, v
                 in vars(args).items()},
        "data": {
            "source": "CPython standard library (" + sysconfig.get_paths()["stdlib"] + ")",
            "python": platform.python_version(),
            "train_files": len(corpus["train"]),
            "val_files": len(corpus["val"]),
            "train_bytes": n_bytes["train"],
            "val_bytes": n_bytes["val"],
            "train_tokens": n_train_tok,
            "val_tokens": n_val_tok,
            "val_file_list": [rel for rel, _ in corpus["val"]],
        },
        "model": {
            "architecture": "LlamaForCausalLM",
            "parameters": n_params,
            "hidden_size": args.hidden,
            "num_hidden_layers": args.layers,
            "num_attention_heads": args.heads,
            "num_key_value_heads": args.kv_heads,
            "intermediate_size": args.intermediate,
            "vocab_size": vocab_size,
            "max_position_embeddings": args.max_positions,
            "dtype": "float32",
        },
        "final_train_loss": round(final_train, 4),
        "final_val_loss": round(final_val, 4),
        "val_loss_tokens": int(val_all[:, 1:].numel()),
        "train_curve": curve_train,
        "val_curve": curve_val,
        "machine": machine_info(),
    }
    (args.out / "training_log.json").write_text(json.dumps(record, indent=1) + "\n")
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    log(f"saved to {args.out} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
