"""llama.cpp as a peer in `python -m minicb bench offline --peers llamacpp-q8_0 ...`: the side of
it that runs in minicb's environment.

llama.cpp runs through llama-cpp-python, built from source for this CPU in its own environment
(`make peer-llamacpp` builds `.venv-llamacpp`). It reads GGUF files, not transformers
checkpoints, so a checkpoint is first converted by the converter vendored in llama.cpp's source
(`peers/llamacpp_convert.py`), once per weight format, into a cache keyed by the checkpoint.
Two things minicb decides before that, tested here without llama.cpp:

- which tokenizer the GGUF carries: the checkpoint's own, or, for a random-weight checkpoint
  that has none (`--random-model llama-100m`), the shipped model's when the vocabularies are the
  same size (the prompts are token ids, so only the ids must line up);
- which llama.cpp pre-tokenizer stands for the checkpoint's (`pre_tokenizer`): the converter
  recognizes only published models' tokenizers and stops on any other.

Then `peers/llamacpp_driver.py` serves the workload through llama.cpp's batched C API with
continuous batching, as many requests at once as minicb's request slots, and returns every
token with its time: a `SystemRun` like any other system's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

from minicb.bench.peers import SystemRun, external_run, peer_environment, run_driver

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "peers"
DRIVER = PEERS / "llamacpp_driver.py"
CONVERTER = PEERS / "llamacpp_convert.py"
# the weight formats compared, as the converter names them -> as llama.cpp prints them
OUTTYPES = {"f32": "F32", "bf16": "BF16", "q8_0": "Q8_0"}
NEWLINE = "\u010a"          # "\n" as a byte-level BPE vocabulary spells it


class LlamaCppUnavailable(RuntimeError):
    pass


def venv_dir() -> Path:
    return Path(os.environ.get("MINICB_LLAMACPP_VENV") or ROOT / ".venv-llamacpp")


def python() -> Path:
    return venv_dir() / "bin" / "python"


def check_available() -> None:
    """Raise LlamaCppUnavailable, naming the fix, unless llama.cpp's environment is built."""
    if not (venv_dir() / ".installed").exists():
        raise LlamaCppUnavailable(
            f"llama.cpp's environment {venv_dir()} is not built; build it with "
            "`make peer-llamacpp` (about 7 minutes: llama.cpp is compiled for this CPU).")


def pre_tokenizer(tokenizer: dict) -> str:
    """The llama.cpp pre-tokenizer that splits text as `tokenizer` (a tokenizer.json) does.

    llama.cpp's "gpt-2" is GPT-2's regular expression over UTF-8 bytes, with no space put in
    front. A tokenizer may also cut every newline out on its own before that regex runs (the
    shipped model's does). GPT-2's regex can put a newline only into a piece of pure white
    space, so the cut changes nothing unless a merge joins a newline to another symbol: with no
    such merge a newline is a token by itself either way.
    """
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"a {model.get('type')} tokenizer has no llama.cpp BPE pre-tokenizer "
                         "here; only byte-level BPE tokenizers are mapped.")
    pre = tokenizer.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or not steps[-1].get("use_regex", True):
        raise ValueError(f"pre-tokenizer {pre} does not end in a byte-level split by GPT-2's "
                         "regular expression, the only one mapped to llama.cpp's ('gpt-2').")
    if steps[-1].get("add_prefix_space"):
        raise ValueError("a byte-level pre-tokenizer with add_prefix_space puts a space before "
                         "the text, which llama.cpp's 'gpt-2' does not.")
    for step in steps[:-1]:
        if not (step.get("type") == "Split" and step.get("pattern") == {"String": "\n"}
                and step.get("behavior") == "Isolated"):
            raise ValueError(f"pre-tokenizer step {step} has no llama.cpp counterpart; only a "
                             "split isolating each newline is mapped.")
        merges = model.get("merges") or []
        joined = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges]
        if any(NEWLINE in merged for merged in joined):
            raise ValueError("a merge joins a newline to another symbol, so isolating newlines "
                             "splits text differently from llama.cpp's 'gpt-2'.")
    return "gpt-2"


def conversion_checkpoint(model_path: str | Path, work: Path) -> Path:
    """A transformers directory the converter can read: `model_path` itself when it has a
    tokenizer, else `work` holding links to its files plus the shipped model's tokenizer (only
    when the vocabularies are the same size: the workload's prompts are token ids)."""
    model_path = Path(model_path)
    if (model_path / "tokenizer.json").exists():
        return model_path
    from minicb.model.default import default_model_path

    shipped = Path(default_model_path())
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    shipped_vocab = json.loads((shipped / "config.json").read_text())["vocab_size"]
    if vocab != shipped_vocab:
        raise ValueError(f"{model_path} has no tokenizer.json and its vocabulary ({vocab}) is not "
                         f"the shipped tokenizer's ({shipped_vocab}); add a tokenizer to it.")
    work.mkdir(parents=True, exist_ok=True)
    for source in [*model_path.iterdir(), shipped / "tokenizer.json",
                   shipped / "tokenizer_config.json"]:
        link = work / source.name
        if not link.exists():
            link.symlink_to(source.resolve())
    return work


def cache_dir(model_path: str | Path) -> Path:
    """Where a checkpoint's GGUF files are kept: keyed by its path and its weights' size and
    time, so a rebuilt checkpoint is converted again."""
    model_path = Path(model_path).resolve()
    stamp = [str(model_path)] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                                 for p in sorted(model_path.glob("*.safetensors"))]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "minicb-gguf" / f"{model_path.name}-{key}"


def gguf_path(model_path: str | Path, outtype: str) -> Path:
    if outtype not in OUTTYPES:
        raise ValueError(f"unknown GGUF weight format {outtype!r}; choose one of {list(OUTTYPES)}")
    return cache_dir(model_path) / f"model-{outtype}.gguf"


def convert(model_path: str | Path, outtypes: list[str], timeout: float = 1800) -> dict[str, Path]:
    """The checkpoint's GGUF file in each format, converted in llama.cpp's environment where
    not already cached."""
    check_available()
    files = {t: gguf_path(model_path, t) for t in outtypes}
    missing = {t: str(p) for t, p in files.items() if not p.exists()}
    if missing:
        cache_dir(model_path).mkdir(parents=True, exist_ok=True)
        checkpoint = conversion_checkpoint(model_path, cache_dir(model_path) / "checkpoint")
        tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
        request = {"checkpoint": str(checkpoint), "outfiles": missing,
                   "pre_tokenizer": pre_tokenizer(tokenizer)}
        with tempfile.TemporaryDirectory(prefix="minicb-gguf-") as work:
            request_file = Path(work) / "request.json"
            request_file.write_text(json.dumps(request))
            done = subprocess.run([str(python()), str(CONVERTER), str(request_file)],
                                  capture_output=True, text=True, timeout=timeout,
                                  env=peer_environment())
        if done.returncode != 0 or not all(Path(p).exists() for p in missing.values()):
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"llama.cpp's converter failed (exit {done.returncode}):\n{tail}")
    return files


def driver_request(gguf: str | Path, prompts: list[list[int]], output_lens: list[int],
                   settings: dict) -> dict:
    """The JSON the driver reads. settings: "parallel" (requests at once), "n_ctx_seq" (KV
    cells each), "n_batch" (tokens per decode call), "threads"."""
    if len(prompts) != len(output_lens):
        raise ValueError(f"{len(prompts)} prompts but {len(output_lens)} output lengths")
    longest = max((len(p) + n for p, n in zip(prompts, output_lens)), default=0)
    if settings["n_ctx_seq"] < longest:
        raise ValueError(f"n_ctx_seq={settings['n_ctx_seq']} holds fewer than the longest "
                         f"request's {longest} tokens")
    return {"model": str(gguf), "prompts": [list(map(int, p)) for p in prompts],
            "output_lens": [int(n) for n in output_lens], "settings": dict(settings)}


def drive(request: dict, timeout: float = 3600) -> dict:
    check_available()
    return run_driver("llama.cpp", lambda request_file, result_file: [
        str(python()), str(DRIVER), str(request_file), str(result_file)], request,
                      peer_environment(), timeout)


def parse_result(result: dict, prompts: list[list[int]], output_lens: list[int],
                 outtype: str) -> SystemRun:
    """llama.cpp's result as a SystemRun, its settings naming the version, the weight format
    and the instruction sets llama.cpp was built for."""
    settings = {"llama_cpp_version": result["llama_cpp_version"], "weights": OUTTYPES[outtype],
                "api": "llama_decode batches, one sequence per request (continuous batching)",
                **result["settings"], "system_info": result.get("system_info", "")}
    if "load_average" in result:
        settings["load_average"] = result["load_average"]
    return external_run("llama.cpp", result, prompts, output_lens, settings)


def run_llamacpp(model_path: str | Path, prompts: list[list[int]], output_lens: list[int],
                 outtype: str, settings: dict, timeout: float = 3600) -> SystemRun:
    """Serve the workload with llama.cpp on the checkpoint's weights in format `outtype`."""
    gguf = convert(model_path, [outtype])[outtype]
    request = driver_request(gguf, prompts, output_lens, settings)
    return parse_result(drive(request, timeout), prompts, output_lens, outtype)


def tokenize(model_path: str | Path, texts: list[str], outtype: str = "q8_0") -> list[list[int]]:
    """`texts` as llama.cpp's tokenizer splits them with the vocabulary the GGUF carries."""
    gguf = convert(model_path, [outtype])[outtype]
    request = {"model": str(gguf), "texts": list(texts),
               "settings": {"parallel": 1, "n_ctx_seq": 64, "threads": 1}}
    return drive(request)["tokens"]


def version() -> str:
    done = subprocess.run([str(python()), str(DRIVER), "--version"], capture_output=True,
                          text=True, env=peer_environment())
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"
