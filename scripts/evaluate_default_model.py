#!/usr/bin/env python
"""Evaluate minicb's embedded default model on held-out standard-library files.

Writes ``eval.json`` next to the model with three measurements, all on the files that
``train_default_model.py`` held out (the list is read from ``training_log.json``):

(a) **Validation loss**: mean next-token cross-entropy (nats/token) over the held-out token
    stream, built exactly like the training stream and cut into windows of the model's context.

(b) **Parse rate**: for every top-level function with a docstring in the held-out files, the prompt
    is the source from its first decorator (or ``def``) line through the line where its docstring
    starts. The model completes it greedily until ``<|endoftext|>`` or ``--parse-max-new`` tokens.
    The text ``T = prompt + completion`` (the end-of-text token itself left out) *parses* when
    ``ast.parse`` accepts one of these three texts, tried in order:

    1. ``T`` as it is (the *strict* rate counts only this one);
    2. ``T`` cut after its last newline (dropping an unfinished last line), and, if the last
       non-blank line then ends with ``:``, followed by ``pass`` indented four spaces deeper;
    3. ``textwrap.dedent`` of 2,

    and the function it defines has at least one statement after its docstring (so an empty
    completion, or one cut back to the prompt, never counts). Nothing else is repaired: an
    unterminated string or bracket, or a body broken in the middle, fails. ``parse_rate`` counts
    1-3; ``parse_rate_strict`` counts 1.

(c) **Natural output lengths**: prompts from the held-out files of three kinds, in file order:
    function signatures (a top-level ``def`` through its colon line), class headers (``class``
    through its colon line) and imports (a module's first ``import``/``from`` line). Each is
    completed greedily until ``<|endoftext|>`` or ``--length-max-new`` (256) new tokens. A
    request's length counts the tokens it generated, the end-of-text token included (a serving
    engine computes that token too); a request that never produced it is recorded at the cap.

Prompts are fed as the tokenizer encodes them (no BOS token), which is how a serving engine
receives a text prompt; ``--bos`` prepends ``<|endoftext|>`` instead, as every chunk had in
training. (b) and (c) are then repeated with the other setting and summarised under
``other_bos_setting`` (``--no-compare`` skips that). Generation uses ``transformers``'
``generate`` (greedy, ``do_sample=False``) on left-padded batches.

Usage::

    python scripts/evaluate_default_model.py            # minicb/assets/default_model/eval.json
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import platform
import statistics
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import train_default_model as T  # noqa: E402  (shared corpus code)

DEFAULT_MODEL = T.DEFAULT_OUT


# ----------------------------------------------------------------------------------------------
# Prompts
# ----------------------------------------------------------------------------------------------


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def docstring_prompts(files: dict[str, str]) -> list[dict]:
    """(b): each top-level function with a docstring, through the line where the docstring
    starts."""
    prompts = []
    for rel, source in files.items():
        lines = source.splitlines(keepends=True)
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if ast.get_docstring(node, clean=False) is None:
                continue
            doc = node.body[0]
            if doc.lineno == node.lineno:  # one-liner: def f(): "doc"
                continue
            prompts.append({"file": rel, "line": node.lineno, "kind": "docstring",
                            "text": "".join(lines[_first_line(node) - 1 : doc.lineno])})
    return prompts


def length_prompts(files: dict[str, str]) -> list[dict]:
    """(c): function signatures, class headers and each module's first import line."""
    prompts = []
    for rel, source in files.items():
        lines = source.splitlines(keepends=True)
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                prompts.append({"file": rel, "line": node.lineno, "kind": "import",
                                "text": lines[node.lineno - 1]})
                break
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                body_line = node.body[0].lineno
                if body_line == node.lineno:  # header and body on one line
                    continue
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                body = "".join(lines[body_line - 1 : node.end_lineno])
                prompts.append({"file": rel, "line": node.lineno, "kind": kind,
                                "text": "".join(lines[_first_line(node) - 1 : body_line - 1]),
                                "reference": body if body.endswith("\n") else body + "\n"})
    # Header lines of a multi-line signature end at the colon line; drop stray comment lines.
    return [p for p in prompts if p["text"].rstrip().endswith(":") or p["kind"] == "import"]


def spread(items: list, n: int) -> list:
    """At most ``n`` items, evenly spaced through the list (deterministic)."""
    if len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


# ----------------------------------------------------------------------------------------------
# Generation and scoring
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_complete(model, tok, prompts: list[str], max_new: int, batch_size: int,
                    bos: bool) -> list[dict]:
    """Greedy completions in left-padded batches: ``[{"ids": [...], "eos": bool}]`` per prompt."""
    eos = tok.eos_token_id
    encoded = [([tok.bos_token_id] if bos else []) + tok.encode(p, add_special_tokens=False) for p
               in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    results: list[dict] = [{}] * len(prompts)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in idx)
        input_ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = encoded[i]
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new,
                             do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id)
        for row, i in enumerate(idx):
            new = out[row, width:].tolist()
            if eos in new:
                results[i] = {"ids": new[: new.index(eos) + 1], "eos": True}
            else:
                results[i] = {"ids": new[:max_new], "eos": False}
    return results


def parses(prompt: str, completion: str) -> tuple[bool, bool]:
    """``(strict, lenient)`` parse result of ``prompt + completion``; see the module docstring."""

    def ok(src: str) -> bool:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            return False
        fn = tree.body[0] if tree.body else None
        return isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and len(fn.body) > 1

    text = prompt + completion
    if ok(text):
        return True, True
    cut = text[: text.rfind("\n") + 1] if "\n" in text else text
    code_lines = [ln for ln in cut.splitlines() if ln.strip()]
    if code_lines and code_lines[-1].rstrip().endswith(":"):
        last = code_lines[-1]
        cut += " " * (len(last) - len(last.lstrip()) + 4) + "pass\n"
    return False, ok(cut) or ok(textwrap.dedent(cut))


@torch.no_grad()
def validation_loss(model, tok, val_files: dict[str, str],
                    seq_len: int) -> tuple[float, int, float]:
    """Mean cross-entropy over the held-out stream (windows of ``seq_len`` predictions).

    Returns ``(nats per token, tokens scored, bytes per token of the stream)``; the last converts
    the loss to bits per byte, a figure that does not depend on the tokenizer.
    """
    files = [(rel, T.split_top_level(src)) for rel, src in val_files.items()]
    docs = T.tokenize_files(tok.backend_tokenizer, files, tok.eos_token_id)
    windows = T.validation_windows(docs, seq_len)
    n_bytes = sum(len(text.encode()) for _, chunks in files for text, _ in chunks)
    bytes_per_token = n_bytes / sum(map(len, docs))
    return T.evaluate_loss(model, windows, 8), int(windows[:, 1:].numel()), bytes_per_token


def summarize(lengths: list[int]) -> dict:
    s = sorted(lengths)
    return {
        "min": s[0],
        "median": statistics.median(s),
        "mean": round(statistics.fmean(s), 1),
        "p90": s[min(len(s) - 1, int(0.9 * len(s)))],
        "max": s[-1],
    }


def parse_rate(model, tok, prompts: list[dict], args, bos: bool, show: int = 0) -> dict:
    """(b): greedy completions of docstring prompts, scored by :func:`parses`."""
    outs = greedy_complete(model, tok, [d["text"] for d in prompts], args.parse_max_new,
                           args.batch_size, bos)
    strict = lenient = 0
    samples = []
    for d, o in zip(prompts, outs):
        completion = tok.decode([t for t in o["ids"] if t != tok.eos_token_id])
        s, ln = parses(d["text"], completion)
        strict += s
        lenient += ln
        samples.append({"file": d["file"], "line": d["line"], "parses": ln, "parses_strict": s,
                        "eos": o["eos"], "new_tokens": len(o["ids"])})
    n = len(prompts)
    print(f"parse rate {lenient}/{n} = {lenient / n:.3f} (strict {strict / n:.3f}), "
          f"{sum(o['eos'] for o in outs)} stopped at EOS", flush=True)
    for d, o in list(zip(prompts, outs))[:show]:
        print("-" * 60 + "\n" + d["text"] + tok.decode(o["ids"]))
    return {
        "n": n,
        "parse_rate": round(lenient / n, 4),
        "parse_rate_strict": round(strict / n, 4),
        "stopped_at_eos": sum(o["eos"] for o in outs),
        "max_new_tokens": args.parse_max_new,
        "samples": samples,
    }


def output_lengths(model, tok, prompts: list[dict], args, bos: bool) -> dict:
    """(c): how many tokens each prompt's greedy completion runs to, end-of-text included."""
    outs = greedy_complete(model, tok, [d["text"] for d in prompts], args.length_max_new,
                           args.batch_size, bos)
    lengths = [len(o["ids"]) for o in outs]
    capped = sum(not o["eos"] for o in outs)
    by_kind = {}
    for kind in ("def", "class", "import"):
        ks = [ln for d, ln in zip(prompts, lengths) if d["kind"] == kind]
        kc = sum(not o["eos"] for d, o in zip(prompts, outs) if d["kind"] == kind)
        if ks:
            by_kind[kind] = {"n": len(ks), "hit_cap": kc, **summarize(ks)}
    # What the real files do: the body that follows each def/class header, plus end-of-text.
    reference = [
        min(len(tok.encode(d["reference"], add_special_tokens=False)) + 1, args.length_max_new)
        for d in prompts if "reference" in d]
    ref_capped = sum(n >= args.length_max_new for n in reference)
    print(f"lengths over {len(lengths)} prompts: {summarize(lengths)}, {capped} hit the cap",
          flush=True)
    for kind, s in by_kind.items():
        print(f"  {kind}: {s}")
    print(f"  the real bodies of the def/class prompts: {summarize(reference)}, "
          f"{ref_capped}/{len(reference)} at or over the cap")
    return {
        "n": len(lengths),
        "max_new_tokens": args.length_max_new,
        "hit_cap": capped,
        "share_hit_cap": round(capped / len(lengths), 4),
        "summary": summarize(lengths),
        "by_kind": by_kind,
        "reference_from_source": {
            "about": "def/class prompts only: tokens of the real body + end-of-text, capped like "
                     "the model",
            "n": len(reference),
            "hit_cap": ref_capped,
            **summarize(reference),
        },
        "natural_output_lengths": lengths,
        "stopped_at_eos": [o["eos"] for o in outs],
        "prompt_kinds": [d["kind"] for d in prompts],
    }


def to_json(obj, indent: int = 0) -> str:
    """JSON with one key per line, but lists of plain values and small records on one line."""
    pad = " " * (indent + 1)
    flat = (str, int, float, bool, type(None))
    if isinstance(obj, dict) and not all(isinstance(v, flat) for v in obj.values()):
        items = [f"{pad}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and not all(isinstance(v, flat) for v in obj):
        return ("[\n" + ",\n".join(pad + to_json(v, indent + 1) for v in obj) + "\n" + " " * indent
                + "]")
    return json.dumps(obj)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--out", type=Path, default=None, help="default: <model>/eval.json")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--parse-max-new", type=int, default=200)
    p.add_argument("--length-max-new", type=int, default=256)
    p.add_argument("--max-parse-prompts", type=int, default=300)
    p.add_argument("--max-length-prompts", type=int, default=300)
    p.add_argument("--bos", action="store_true", help="prepend <|endoftext|> to every prompt")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the run with the other BOS setting")
    p.add_argument("--skip-loss", action="store_true")
    p.add_argument("--show", type=int, default=3, help="print this many sample completions")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    log = json.loads((args.model / "training_log.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    val_files = {}
    for rel in log["data"]["val_file_list"]:
        path = stdlib / rel
        if path.exists():
            val_files[rel] = path.read_text(encoding="utf-8")
    result: dict = {"model": str(args.model.name), "python": platform.python_version(),
                    "held_out_files": len(val_files), "bos_prepended": args.bos}

    if not args.skip_loss:
        loss, n_tok, bpt = validation_loss(model, tok, val_files,
                                           model.config.max_position_embeddings)
        result["val_loss"] = round(loss, 4)
        result["val_bits_per_byte"] = round(loss / math.log(2) / bpt, 4)
        result["val_tokens"] = n_tok
        print(f"validation loss {loss:.4f} nats/token ({result['val_bits_per_byte']} bits/byte) "
              f"over "
              f"{n_tok:,} tokens ({time.time() - t0:.0f}s)", flush=True)

    # (b) parse rate and (c) natural output lengths, with the chosen BOS setting ...
    dprompts = spread(docstring_prompts(val_files), args.max_parse_prompts)
    lprompts = spread(length_prompts(val_files), args.max_length_prompts)
    result["parse"] = parse_rate(model, tok, dprompts, args, args.bos, show=args.show)
    result["lengths"] = output_lengths(model, tok, lprompts, args, args.bos)
    n, lengths = result["parse"]["n"], result["lengths"]["natural_output_lengths"]
    capped = result["lengths"]["hit_cap"]
    print(f"({time.time() - t0:.0f}s)", flush=True)
    # ... and, for comparison, the other one.
    if not args.no_compare:
        other = not args.bos
        print(f"with bos_prepended={other}:")
        po = parse_rate(model, tok, dprompts, args, other, show=0)
        lo = output_lengths(model, tok, lprompts, args, other)
        result["other_bos_setting"] = {
            "bos_prepended": other,
            "parse_rate": po["parse_rate"],
            "parse_rate_strict": po["parse_rate_strict"],
            "hit_cap": lo["hit_cap"],
            "share_hit_cap": lo["share_hit_cap"],
            "summary": lo["summary"],
            "by_kind": lo["by_kind"],
        }
    result["seconds"] = round(time.time() - t0, 1)
    # The headline numbers, flat, first in the file.
    head = {k: result[k] for k in ("val_loss", "val_bits_per_byte") if k in result}
    head.update(parse_rate=result["parse"]["parse_rate"], parse_n=n,
                natural_output_lengths=lengths, hit_cap=capped)
    result = {**head, **result}

    out = args.out or args.model / "eval.json"
    out.write_text(to_json(result) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
