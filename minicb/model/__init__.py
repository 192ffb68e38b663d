"""The Llama-family decoder, its attention backends and the checkpoint loader."""

from minicb.model.llama import LlamaForCausalLM, ModelArgs
from minicb.model.loader import (
           SUPPORTED_ARCHITECTURES,
           load_model,
           load_tokenizer,
           resolve_model_path,
)

__all__ = ["LlamaForCausalLM", "ModelArgs", "SUPPORTED_ARCHITECTURES", "load_model",
           "load_tokenizer", "resolve_model_path"]
