"""Writes a transformers checkpoint as GGUF files with the converter vendored in llama.cpp;
executed by `.venv-llamacpp`'s python, never imported.

    .venv-llamacpp/bin/python peers/llamacpp_convert.py REQUEST.json

REQUEST.json holds "checkpoint" (a transformers directory with its tokenizer), "outfiles"
({outtype: path}, outtypes as the converter names them: f32, bf16, q8_0) and "pre_tokenizer"
(the name llama.cpp's tokenizer knows the checkpoint's pre-tokenizer by).

The converter recognizes a byte-level BPE tokenizer's pre-tokenizer by the hash of how it
tokenizes one test string, and knows only the tokenizers of published models: any other (the
book's own model is one) makes it stop with "BPE pre-tokenizer was not recognized". minicb
works out which pre-tokenizer llama.cpp should use from the checkpoint's tokenizer.json
(minicb/bench/llamacpp_peer.py, `pre_tokenizer`); here the converter's recognizer answers that
name whenever its own table has none. It imports nothing from minicb.
"""

from __future__ import annotations

import glob
import json
import os
import sys


def vendored_llama_cpp() -> str:
    """The llama.cpp source tree inside the llama-cpp-python source `make peer-llamacpp` kept."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    found = sorted(glob.glob(os.path.join(venv, "src", "*", "vendor", "llama.cpp")))
    if not found:
        raise SystemExit(f"no llama.cpp source under {venv}/src: `make peer-llamacpp` keeps it")
    return found[-1]


def convert(request: dict) -> None:
    root = vendored_llama_cpp()
    sys.path[:0] = [root, os.path.join(root, "gguf-py")]
    import convert_hf_to_gguf
    from conversion import base

    recognize = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return recognize(self, tokenizer)
        except NotImplementedError:        # not one of the published models' tokenizers
            return request["pre_tokenizer"]

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    for outtype, outfile in request["outfiles"].items():
        sys.argv = ["convert_hf_to_gguf.py", request["checkpoint"], "--outtype", outtype,
                    "--outfile", outfile]
        convert_hf_to_gguf.main()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        convert(json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
