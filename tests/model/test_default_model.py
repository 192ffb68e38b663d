"""The embedded default model: loads offline, tokenizes exactly, and stops by itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minicb.model import default as default_model  # noqa: E402

MAX_ASSET_BYTES = 25_000_000   # 25 MB

SNIPPETS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n\tdef __init__(self, x):\n\t\tself.x = x\n",
    "if x:\n        y = {'k': [1, 2.5e-3, None]}  # comment\n\n\n    \n",
    's = "naïve café — 日本語 🐍"\nprint(f"{s!r:>10}")\n',
    "   leading spaces, trailing spaces   \r\nwindows line\r\n",
    "x = '<|endoftext' + '|>'\n",
    "",
]

# Prompts like the held-out ones: a signature, usually with the start of a docstring.
PROMPTS = [
    'def is_even(n):\n    """Return True if n is even."""\n',
    'def _get_name(obj):\n    """Return the name of obj."""\n',
    'def splitext(p):\n    """Split the extension from a pathname."""\n',
    'class Error(Exception):\n    """Base class for exceptions in this module."""\n',
    'def _check_arg(value):\n    """Raise TypeError if value is not a str."""\n',
    "def main():\n",
    'def isabs(s):\n    """Test whether a path is absolute"""\n',
    'def _stringify(value):\n    """Return value as a string."""\n',
]


@pytest.fixture(scope="module")
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def tokenizer(offline):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model.default_model_path())


@pytest.fixture(scope="module")
def model(offline):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(default_model.default_model_path())
    m.eval()
    return m


def test_path_is_absolute_model_dir():
    path = Path(default_model.default_model_path())
    assert path.is_absolute()
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert (path / "MODEL_CARD.md").is_file() and (path / "training_log.json").is_file()


def test_missing_assets_explain_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setattr(default_model, "_ASSET_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="train_default_model.py"):
        default_model.default_model_path()


def test_assets_fit_the_size_budget():
    root = Path(default_model.default_model_path())
    total = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert total <= MAX_ASSET_BYTES, f"{root} holds {total / 1e6:.1f} MB (limit 25 MB)"


@pytest.mark.parametrize("text", SNIPPETS)
def test_tokenizer_round_trips_exactly(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.eos_token_id not in ids  # no special tokens added, none parsed out of text
    assert tokenizer.decode(ids) == text


def test_eos_agrees_everywhere(tokenizer, model):
    eos = tokenizer.eos_token_id
    assert eos is not None
    assert model.config.eos_token_id == eos
    assert model.generation_config.eos_token_id == eos
    assert tokenizer.pad_token_id == eos and tokenizer.bos_token_id == eos
    assert tokenizer.decode([eos]) == "<|endoftext|>"
    assert len(tokenizer) == model.config.vocab_size


def test_architecture_is_a_small_gqa_llama(model):
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.tie_word_embeddings
    assert (model.get_input_embeddings().weight.data_ptr()
            == model.get_output_embeddings().weight.data_ptr())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) < 6_000_000


def test_greedy_generation_writes_lines_and_stops_by_itself(tokenizer, model):
    eos = tokenizer.eos_token_id
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "left"
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=160, do_sample=False)
    new = out[:, batch["input_ids"].shape[1] :].tolist()
    stopped = 0
    for prompt, ids in zip(PROMPTS, new):
        if eos in ids:
            end = ids.index(eos)
            assert all(t == eos for t in ids[end:]), "a finished row is padded with EOS"
            text = tokenizer.decode(ids[:end])
            # Training put the end-of-text token after a function's last line: a completion
            # that stops has written at least one line of code and ends with its newline.
            assert text.strip() and text.endswith("\n"), f"{prompt!r} -> {text!r}"
            stopped += 1
        else:
            assert tokenizer.decode(ids).strip(), f"{prompt!r} produced only whitespace"
    assert stopped >= len(PROMPTS) // 2, (f"only {stopped} of {len(PROMPTS)} completions ended by "
                                          "themselves")


def test_natural_output_lengths_vary():
    lengths = default_model.natural_output_lengths()
    assert len(lengths) >= 100
    assert all(isinstance(n, int) and 1 <= n <= 256 for n in lengths)
    natural = [n for n in lengths if n < 256]
    assert len(natural) >= len(lengths) // 5, "too few held-out prompts ended by themselves"
    assert len(set(natural)) >= 20, "natural lengths should vary"
