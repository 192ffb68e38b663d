"""minicb: a small, real LLM serving engine that teaches continuous batching.

    from minicb import LLM, SamplingParams
    llm = LLM(scheduler="continuous", kv_cache="paged")
    outs = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=32, temperature=0))
"""

import logging

from minicb.config import EngineConfig
from minicb.engine.llm import LLM
from minicb.engine.llm_engine import LLMEngine
from minicb.engine.outputs import CompletionOutput, RequestOutput
from minicb.params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
           "CompletionOutput", "default_model_path"]
__version__ = "0.1.0"

# transformers imports torchao (installed for the int8 proofs) when it loads a model. On a CPU
# build of torch, torchao logs a warning for each CUDA extension it cannot load, and torch one
# for each enum it registers the old way; both would land, with paths and process ids, in every
# notebook that loads a model. minicb uses neither; these two messages alone are dropped.
def _drop(logger: str, text: str) -> None:
    logging.getLogger(logger).addFilter(lambda record: text not in record.getMessage())


_drop("torchao", "Failed to load")
_drop("torch.utils._pytree", "register_constant()")


def default_model_path() -> str:
    """Path of the small model shipped inside the package (see minicb/assets/default_model)."""
    from minicb.model.default import default_model_path as path

    return path()
