"""One registry per family of swappable parts: schedulers, KV caches, attention backends.

A registry maps a name to the class (or function) that builds the part. The config's allowed
values, the command line's choices and the error message for an unknown name all come from it,
so adding a part is one line here. Targets are named as "module:attribute" and imported on first
use: the config can list the names without importing torch kernels or the scheduler.
"""

from __future__ import annotations

import importlib


class Registry(dict):
    """name → the part (a "module:attribute" string until first used). A dict, so a test or a
    grader can swap in its own part for a name (`monkeypatch.setitem`)."""

    def __init__(self, knob: str, entries: dict[str, str], aliases: tuple[str, ...] = ()):
        super().__init__(entries)
        self.knob = knob                  # the EngineConfig field that picks one
        self.aliases = aliases            # choices resolved to a registered name (e.g. "auto")

    @property
    def choices(self) -> tuple[str, ...]:
        return (*self.aliases, *self)

    def check(self, name: object) -> None:
        """Raise ValueError naming the knob and every choice if `name` is not one of them."""
        if name not in self.choices:
            raise ValueError(f"{self.knob}={name!r} is not one of {self.choices}; pick one of "
                             "those.")

    def get_part(self, name: str):
        """The class or function registered as `name`, imported if it is not yet."""
        if name not in self:
            self.check(name)
            raise ValueError(f"{self.knob}={name!r} must be resolved to one of {tuple(self)} "
                             "before it is built.")
        target = self[name]
        if isinstance(target, str):
            module, attribute = target.split(":")
            target = getattr(importlib.import_module(module), attribute)
            self[name] = target
        return target


SCHEDULERS = Registry("scheduler", {"naive": "minicb.scheduler.static:NaiveScheduler",
                                    "static": "minicb.scheduler.static:StaticScheduler",
                                    "continuous": "minicb.scheduler.continuous:"
                                                  "ContinuousScheduler"})
KV_CACHES = Registry("kv_cache", {"contiguous": "minicb.kv.contiguous:ContiguousKVManager",
                                  "paged": "minicb.kv.paged:PagedKVManager"})
# each backend: a function returning its (write K/V, attend) pair (minicb.model.attention)
ATTENTION_BACKENDS = Registry("attention", {"torch": "minicb.model.attention:torch_backend",
                                            "triton": "minicb.model.attention:triton_backend",
                                            "cpu": "minicb.model.attention:cpu_backend"},
                              aliases=("auto",))
# the experts' part of the fused mixture-of-experts product (minicb.model.moe): torch on a CPU
# (the reference), C for a CPU engine's small steps, Triton on a GPU
MOE_KERNELS = Registry("moe_kernel",
                       {"torch": "minicb.kernels.fused_moe_reference:moe_experts_torch",
                        "cpu": "minicb.kernels.cpu_moe:moe_experts_cpu",
                        "triton": "minicb.kernels.fused_moe:moe_experts_triton"})
