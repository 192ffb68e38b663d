"""minicb loads a checkpoint's tokenizer as AutoTokenizer does, without importing the model's
configuration class (whose imports cost seconds of CPU in every process that starts an engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from minicb.model.loader import _light_config, load_tokenizer, resolve_model_path

TEXTS = ["def add(a, b):\n    return a + b  # ü", "<|endoftext|> class Stack:", ""]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}]


def _same_tokenizer(ours, theirs) -> None:
    assert type(ours) is type(theirs)
    assert ours.init_kwargs == theirs.init_kwargs
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids
    ids = ours(TEXTS[0]).input_ids
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert (ours.eos_token_id, ours.pad_token_id, ours.padding_side, ours.model_max_length) == (
        theirs.eos_token_id, theirs.pad_token_id, theirs.padding_side, theirs.model_max_length)
    assert ours.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_the_default_models_tokenizer_is_the_one_autotokenizer_loads():
    path = resolve_model_path(None)
    assert "config" in _light_config(path)          # the shipped model takes the light path
    _same_tokenizer(load_tokenizer(path), AutoTokenizer.from_pretrained(str(path)))


def test_loading_it_leaves_the_models_configuration_class_unimported():
    code = ("import sys; from minicb.model.loader import load_tokenizer, resolve_model_path; "
            "load_tokenizer(resolve_model_path(None)); "
            "print(sorted(m for m in sys.modules if m.startswith("
            "('transformers.models.llama', 'torch._dynamo'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout


@pytest.mark.parametrize("change", ["no tokenizer_class", "auto_map in tokenizer_config",
                                    "auto_map in config"])
def test_a_checkpoint_the_light_path_cannot_vouch_for_gets_autotokenizers_own(tmp_path, change):
    """Without a named tokenizer class AutoTokenizer chooses by the config's class, and with code
    of the checkpoint's own it runs that: then minicb passes no config, and the full one loads."""
    shutil.copytree(resolve_model_path(None), tmp_path, dirs_exist_ok=True)
    name = "config.json" if change == "auto_map in config" else "tokenizer_config.json"
    data = json.loads((tmp_path / name).read_text())
    if change == "no tokenizer_class":
        del data["tokenizer_class"]
    else:
        data["auto_map"] = {"AutoTokenizer": ["nowhere.Tokenizer", None]}
    (tmp_path / name).write_text(json.dumps(data))
    assert _light_config(tmp_path) == {}
    if change == "no tokenizer_class":
        _same_tokenizer(load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path)))
