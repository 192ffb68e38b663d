"""minicb: a small, real LLM serving engine that teaches continuous batching.

    from minicb import LLM, SamplingParams
    llm = LLM(scheduler="continuous", kv_cache="paged")
    outs = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=32, temperature=0))
"""

from minicb.config import EngineConfig
from minicb.engine.llm import LLM
from minicb.engine.llm_engine import LLMEngine
from minicb.engine.outputs import CompletionOutput, RequestOutput
from minicb.params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
           "CompletionOutput", "default_model_path"]
__version__ = "0.1.0"


def default_model_path() -> str:
    """Path of the small model shipped inside the package (see minicb/assets/default_model)."""
    from minicb.model.default import default_model_path as path

    return path()
