"""The embedded default model: a tiny Llama trained on the Python standard library.

It ships inside the package (``minicb/assets/default_model``) so every example runs offline and
produces real text that stops by itself at natural, varied lengths. See ``MODEL_CARD.md`` there;
``scripts/train_default_model.py`` rebuilds it and ``scripts/evaluate_default_model.py`` measures
it.
"""

from __future__ import annotations

import json
from pathlib import Path

_ASSETS = Path(__file__).resolve().parents[1] / "assets"
_ASSET_DIR = _ASSETS / "default_model"
_REBUILD = (
    "python scripts/train_default_model.py --minutes 40 && python scripts/evaluate_default_model.py"
)
_REBUILD_DRAFT = (
    "python scripts/train_default_model.py --minutes 12 --hidden 128 --layers 2 --heads 2 "
    "--kv-heads 1 --intermediate 352 --tokenizer minicb/assets/default_model "
    "--out minicb/assets/draft_model"
)


def _asset_path(folder: Path, what: str, rebuild: str) -> str:
    needed = ("config.json", "model.safetensors", "tokenizer.json")
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"minicb's {what} is missing from {folder} (no {', '.join(missing)}). "
            f"Rebuild it from the repository root with:\n    {rebuild}"
        )
    return str(folder)


def default_model_path() -> str:
    """Absolute path of the embedded model's directory (loadable by ``from_pretrained``).

    Raises:
        FileNotFoundError: the weights or tokenizer are missing; the message says how to rebuild
        them.
    """
    return _asset_path(_ASSET_DIR, "default model", _REBUILD)


def draft_model_path() -> str:
    """Absolute path of the embedded draft model: a smaller model with the default model's
    tokenizer, for speculative decoding (``assets/draft_model/MODEL_CARD.md``)."""
    return _asset_path(_ASSETS / "draft_model", "draft model", _REBUILD_DRAFT)


def natural_output_lengths() -> list[int]:
    """Output lengths (in tokens) the default model chose by itself on held-out prompts.

    Greedy completions of a few hundred prompts from held-out standard-library files (function
    signatures, class headers, imports), each counted up to and including its end-of-text token;
    a completion that never ended is recorded at the cap, ``max_new_tokens`` (256). The values
    come from ``eval.json``, written by ``scripts/evaluate_default_model.py``.

    Raises:
        FileNotFoundError: ``eval.json`` is missing; the message says how to rebuild it.
    """
    path = Path(default_model_path()) / "eval.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing. Rebuild it from the repository root with:\n"
            "    python scripts/evaluate_default_model.py"
        )
    return [int(n) for n in json.loads(path.read_text())["natural_output_lengths"]]
