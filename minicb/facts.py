"""The book's cited facts: numbers that come from outside this project.

A number from a paper, a data sheet or another engine's defaults lives here once, with its unit
and its source, and the chapters, the simulator and the benchmarks read it from here
(`fact("a100_hbm_bandwidth").value`), so a sentence that quotes it and the code that uses it can
never disagree. Numbers this project measures, simulates or fits do not belong here: they are
rendered from the values that produced them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    value: float | int | str
    unit: str
    source: str            # a link, or a paper with its section or table
    note: str = ""

    def __str__(self) -> str:
        return f"{self.value} {self.unit}".strip()


KIB = 1024

FACTS: dict[str, Fact] = {
    # --- GPUs (vendor data sheets) ---
    "a100_hbm_bandwidth": Fact(2039, "GB/s", "NVIDIA A100 Tensor Core GPU data sheet (A100 80GB SXM), "
                               "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/"
                               "pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "a100_fp16_tflops": Fact(312, "TFLOP/s", "NVIDIA A100 data sheet (dense FP16/BF16 Tensor Core), "
                             "same document as a100_hbm_bandwidth"),
    "h100_sxm_hbm_bandwidth": Fact(3350, "GB/s", "NVIDIA H100 Tensor Core GPU data sheet (H100 SXM), "
                                   "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "a100_nvlink_bandwidth": Fact(600, "GB/s", "NVIDIA A100 data sheet: NVLink 600 GB/s "
                                  "(both directions together), same document as a100_hbm_bandwidth"),
}


def fact(name: str) -> Fact:
    """One cited fact by name; an unknown name is an error that lists the known ones."""
    try:
        return FACTS[name]
    except KeyError:
        raise KeyError(f"no cited fact named {name!r}; known facts: {', '.join(sorted(FACTS))}. "
                       "Add it to minicb/facts.py with its unit and source.") from None


def facts_table(names: list[str] | None = None) -> str:
    """The facts as a markdown table (value, unit, source), for a notebook or the site."""
    rows = ["| fact | value | unit | source |", "|---|---:|---|---|"]
    for name in names or sorted(FACTS):
        f = fact(name)
        rows.append(f"| `{name}` | {f.value} | {f.unit} | {f.source} |")
    return "\n".join(rows)
