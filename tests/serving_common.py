"""What the serving tests share: checkpoint copies with a tokenizer of our choosing (and maybe
a chat template), a small byte-level BPE tokenizer, and a runner with a timeout.

The BPE tokenizer is trained in a second on a few lines of code and accented text, so
characters such as "é" and "😀" are split across tokens: exactly what incremental
detokenisation must get right.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

CORPUS = ["def add(a, b):\n    return a + b\n", "for index in range(10):\n    print(index)\n",
          "class Point:\n    x: int = 0\n", "café naïve résumé 中文 😀 — “quotes”\n"] * 20

SIMPLE_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def train_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (GPT-2 style) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def checkpoint_copy(source_dir: str, out_dir: Path, tokenizer=None,
                    chat_template: str | None = None) -> str:
    """A copy of a checkpoint's weights and config with `tokenizer` (default: its own) beside them,
    given `chat_template` if one is passed."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (Path(source_dir) / name).exists():
            shutil.copy(Path(source_dir) / name, out_dir / name)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(source_dir)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def text_checkpoint(weights_dir: str, out_dir: Path) -> str:
    """A tokenizer-less random-weight checkpoint with the trained BPE tokenizer beside it."""
    return checkpoint_copy(weights_dir, out_dir, train_tokenizer())


def run(coroutine, timeout: float = 120.0):
    """Run a coroutine to completion, failing (not hanging) after `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))
