"""The book's cited facts: numbers that come from outside this project.

A number from a paper, a data sheet or another engine's defaults lives here once, with its unit
and its source, and the chapters, the simulator and the benchmarks read it from here
(`fact("a100_hbm_bandwidth").value`), so a sentence that quotes it and the code that uses it can
never disagree. Numbers this project measures, simulates or fits do not belong here: they are
rendered from the values that produced them. The one exception is an input the cost model needs
beside a cited one (gloo's all-reduce on the book's machine, beside NCCL's): its source is the
committed JSON that measured it, and tests/book/test_facts.py holds the two equal.
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
_NCCL_TUNING = ("NVIDIA/nccl, src/graph/tuning.cc (commit b6475625), "
                "https://github.com/NVIDIA/nccl/blob/b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2/"
                "src/graph/tuning.cc")
_VLLM_CUSTOM_AR = ("vllm-project/vllm, csrc/custom_all_reduce.cuh and vllm/distributed/"
                   "device_communicators/custom_all_reduce.py (world sizes 2, 4, 6, 8; messages "
                   "under 8 MiB), https://github.com/vllm-project/vllm")
_CUSTOM_AR_TIMES = ("sgl-project/sglang pull request 2904 (2025-01-15), table 'vllm': vLLM's custom "
                    "all-reduce measured on H100s (NVSwitch), without CUDA graphs, "
                    "https://github.com/sgl-project/sglang/pull/2904")

_GLOO_MEASURED = ("measured on this project's 2-core CPU machine by scripts/bench_tensor_parallel.py, "
                  "benchmarks/results/gloo_allreduce.json")

_VLLM_CPU_TP = ("vllm-project/vllm pull request 32792 (2026-01-21), its benchmark table: "
                "c8g.metal.48xlarge (Arm, two NUMA domains of 96 cores), baseline one NUMA domain "
                "at tp=1, https://github.com/vllm-project/vllm/pull/32792")

_HF_ASYNC = ("Ouazan Reboul, Cuenca, Roy Gosthipaty, Unlocking asynchronicity in continuous "
             "batching, Hugging Face blog (2026-05-14), the section 'Does it actually work?', "
             "https://huggingface.co/blog/continuous_async")

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
    "a100_pcie_bandwidth": Fact(64, "GB/s", "NVIDIA A100 data sheet: PCIe Gen4 64 GB/s (both "
                                "directions together), same document as a100_hbm_bandwidth"),
    "a100_memory": Fact(80, "GB", "NVIDIA A100 data sheet (A100 80GB SXM: 80 GB HBM2e), same "
                        "document as a100_hbm_bandwidth"),
    "infiniband_hdr_bandwidth": Fact(200, "Gb/s", "NVIDIA DGX A100 data sheet: networking 8x "
                                     "single-port ConnectX-6 VPI 200 Gb/s HDR InfiniBand (one per "
                                     "GPU), https://www.nvidia.com/content/dam/en-zz/Solutions/"
                                     "Data-Center/nvidia-dgx-a100-datasheet.pdf"),
    "ethernet_25g_bandwidth": Fact(25, "Gb/s", "IEEE Std 802.3by-2016, the 25 Gb/s Ethernet "
                                   "standard (25GBASE-R)"),
    # NCCL's own latency model for a ring all-reduce: a base latency plus one hop latency per
    # step, 2(n-1) steps, for each of its three protocols; NCCL runs whichever its model says is
    # fastest for the message. Simple carries large messages at the link's full bandwidth; LL and
    # LL128 send flags with the data, for lower latency and less bandwidth: small messages
    "nccl_ring_base_latency": Fact(8.4, "us", _NCCL_TUNING + ", table baseLat (Ring, Simple)"),
    "nccl_hop_latency_nvlink": Fact(3.4, "us", _NCCL_TUNING + ", table hwLat (NVLINK, Ring, "
                                    "Simple)"),
    "nccl_hop_latency_pcie": Fact(5.7, "us", _NCCL_TUNING + ", table hwLat (PCI, Ring, Simple)"),
    "nccl_hop_latency_network": Fact(14.0, "us", _NCCL_TUNING + ", table hwLat (NET, Ring, "
                                     "Simple)"),
    "nccl_ll_base_latency": Fact(6.6, "us", _NCCL_TUNING + ", table baseLat (Ring, LL)"),
    "nccl_ll_hop_latency_nvlink": Fact(0.6, "us", _NCCL_TUNING + ", table hwLat (NVLINK, Ring, "
                                       "LL)"),
    "nccl_ll_hop_latency_pcie": Fact(1.0, "us", _NCCL_TUNING + ", table hwLat (PCI, Ring, LL)"),
    "nccl_ll_hop_latency_network": Fact(2.7, "us", _NCCL_TUNING + ", table hwLat (NET, Ring, LL)"),
    "nccl_ll_bandwidth_share": Fact(0.25, "fraction", _NCCL_TUNING + ", ncclTopoTuneModel: a ring "
                                    "all-reduce's LL bus bandwidth is busBw * 1.0/4.0"),
    "nccl_ll128_base_latency": Fact(14.0, "us", _NCCL_TUNING + ", table baseLat (Ring, LL128)"),
    "nccl_ll128_hop_latency_nvlink": Fact(1.9, "us", _NCCL_TUNING + ", table hwLat (NVLINK, Ring, "
                                          "LL128); LL128 is enabled by default only over NVLink"),
    "nccl_ll128_bandwidth_share": Fact(0.92, "fraction", _NCCL_TUNING + ", ncclTopoTuneModel: a "
                                       "ring's LL128 bus bandwidth is busBw * 0.92 (120/128)"),
    # vLLM's own all-reduce inside one node whose GPUs all reach each other (NVSwitch, or two
    # GPUs): one kernel; below a size, every GPU reads its peers' whole messages at once
    # (one-shot), above it a reduce-scatter then an all-gather (two-shot)
    "vllm_custom_allreduce_one_shot_max_4gpus": Fact(512, "KiB", _VLLM_CUSTOM_AR + ", "
                                                     "CustomAllreduce::allreduce: one-stage "
                                                     "kernel below 512 KiB for up to 4 GPUs"),
    "vllm_custom_allreduce_one_shot_max_8gpus": Fact(256, "KiB", _VLLM_CUSTOM_AR + ", "
                                                     "CustomAllreduce::allreduce: one-stage "
                                                     "kernel below 256 KiB for up to 8 GPUs"),
    "vllm_custom_allreduce_tp2_4kib": Fact(8.8, "us", _CUSTOM_AR_TIMES + ": TP 2, 4,096 bytes"),
    "vllm_custom_allreduce_tp4_4kib": Fact(8.5, "us", _CUSTOM_AR_TIMES + ": TP 4, 4,096 bytes"),
    "vllm_custom_allreduce_tp8_4kib": Fact(9.3, "us", _CUSTOM_AR_TIMES + ": TP 8, 4,096 bytes"),
    "vllm_custom_allreduce_tp2_1mib": Fact(26.6, "us", _CUSTOM_AR_TIMES + ": TP 2, 1,048,576 "
                                           "bytes"),
    "vllm_custom_allreduce_tp4_1mib": Fact(40.2, "us", _CUSTOM_AR_TIMES + ": TP 4, 1,048,576 "
                                           "bytes"),
    "vllm_custom_allreduce_tp8_1mib": Fact(45.0, "us", _CUSTOM_AR_TIMES + ": TP 8, 1,048,576 "
                                           "bytes"),
    # gloo's all-reduce between two processes on the book's 2-core CPU machine: measured here,
    # not cited (the medians of the repeats in the JSON; its load average is beside them there)
    "gloo_allreduce_4kib": Fact(345.8, "us", _GLOO_MEASURED + ": median all-reduce of "
                                 "4 KiB of float32 between two processes"),
    "gloo_allreduce_32kib": Fact(349.7, "us", _GLOO_MEASURED + ": median all-reduce of "
                                 "32 KiB of float32 between two processes"),
    "gloo_allreduce_128kib": Fact(370.6, "us", _GLOO_MEASURED + ": median all-reduce of "
                                 "128 KiB of float32 between two processes"),
    "gloo_allreduce_1mib": Fact(710.4, "us", _GLOO_MEASURED + ": median all-reduce of "
                                 "1 MiB of float32 between two processes"),
    "gloo_allreduce_8mib": Fact(5802.8, "us", _GLOO_MEASURED + ": median all-reduce of "
                                 "8 MiB of float32 between two processes"),
    # vLLM's CPU backend, tensor parallelism over two NUMA domains of one Arm server: median TPOT
    # as a share of one rank on one NUMA domain, through torch.distributed and through vLLM's
    # shared-memory communicator
    "vllm_cpu_tp2_torch_distributed_tpot": Fact(196.4, "% of TP=1", _VLLM_CPU_TP + ": 2 NUMA, "
                                                "tp=2 with thread binding, torch.distributed"),
    "vllm_cpu_tp2_shared_memory_tpot": Fact(53.6, "% of TP=1", _VLLM_CPU_TP + ": 2 NUMA, tp=2, "
                                            "vLLM's shared-memory communicator (the pull request)"),
    # --- models (the checkpoints' config.json on the Hugging Face hub) ---
    "qwen3_30b_a3b_layers": Fact(48, "layers", "Qwen/Qwen3-30B-A3B config.json: "
                                 "num_hidden_layers, https://huggingface.co/Qwen/Qwen3-30B-A3B"),
    "qwen3_30b_a3b_hidden_size": Fact(2048, "elements", "Qwen/Qwen3-30B-A3B config.json: "
                                      "hidden_size"),
    "qwen3_30b_a3b_experts": Fact(128, "experts", "Qwen/Qwen3-30B-A3B config.json: "
                                  "num_experts (every layer sparse)"),
    "qwen3_30b_a3b_experts_per_token": Fact(8, "experts", "Qwen/Qwen3-30B-A3B config.json: "
                                            "num_experts_per_tok"),
    "qwen3_30b_a3b_expert_size": Fact(768, "elements", "Qwen/Qwen3-30B-A3B config.json: "
                                      "moe_intermediate_size"),
    "llama2_7b_params": Fact(6_738_415_616, "parameters", "meta-llama/Llama-2-7b-hf config.json's "
                             "shapes (32 layers of 4 x 4096^2 attention + 3 x 4096 x 11008 MLP "
                             "+ 2 norms, two 32000 x 4096 embeddings, a final norm); Touvron et "
                             "al., Llama 2 (2023), Table 1: 7B"),
    "llama2_7b_layers": Fact(32, "layers", "meta-llama/Llama-2-7b-hf config.json: "
                             "num_hidden_layers"),
    "llama2_7b_hidden_size": Fact(4096, "elements", "meta-llama/Llama-2-7b-hf config.json: "
                                  "hidden_size"),
    "llama2_7b_kv_heads": Fact(32, "heads", "meta-llama/Llama-2-7b-hf config.json: "
                               "num_key_value_heads (no grouped-query attention at 7B)"),
    "llama2_7b_head_dim": Fact(128, "elements", "meta-llama/Llama-2-7b-hf config.json: "
                               "hidden_size 4096 "
                               "/ num_attention_heads 32"),
    "llama2_70b_params": Fact(68_976_648_192, "parameters", "meta-llama/Llama-2-70b-hf "
                              "config.json's "
                              "shapes (80 layers of 2 x 8192^2 + 2 x 8192 x 1024 attention + 3 x "
                              "8192 x 28672 MLP + 2 norms, two 32000 x 8192 embeddings, a final "
                              "norm); Touvron et al., Llama 2 (2023), Table 1: 70B"),
    "llama2_70b_layers": Fact(80, "layers", "meta-llama/Llama-2-70b-hf config.json: "
                              "num_hidden_layers"),
    "llama2_70b_hidden_size": Fact(8192, "elements", "meta-llama/Llama-2-70b-hf config.json: "
                                   "hidden_size"),
    "llama2_70b_kv_heads": Fact(8, "heads", "meta-llama/Llama-2-70b-hf config.json: "
                                "num_key_value_heads (grouped-query attention, Llama 2 paper "
                                "section 2.2)"),
    "llama2_70b_head_dim": Fact(128, "elements", "meta-llama/Llama-2-70b-hf config.json: "
                                "hidden_size "
                                "8192 / num_attention_heads 64"),
    "vllm_gpu_memory_utilization": Fact(0.9, "fraction", "vLLM engine arguments, "
                                        "--gpu-memory-utilization default, "
                                        "https://docs.vllm.ai/en/latest/configuration/engine_args.html"),
    # --- DistServe (Zhong et al., OSDI 2024) ---
    "distserve_slo_attainment": Fact(90, "%", "Zhong et al., DistServe: Disaggregating Prefill "
                                     "and Decoding for Goodput-optimized LLM Serving, OSDI 2024, "
                                     "abstract and introduction (goodput: the highest request rate "
                                     "per GPU at which this share of requests meets both the "
                                     "TTFT and the TPOT target)"),
    "distserve_goodput_gain": Fact(4.48, "x", "DistServe's reported best case against vLLM, "
                                   "https://hao-ai-lab.github.io/summary/distserve (\"up to 4.48x "
                                   "goodput or 10.2x tighter SLO\"), on OPT models, ShareGPT, "
                                   "HumanEval and LongBench traces"),
}

# --- other engines' scheduler knobs, and the gains reported for continuous batching ---
_TGI_LAUNCHER = ("Hugging Face text-generation-inference, launcher arguments, "
                 "https://huggingface.co/docs/text-generation-inference/reference/launcher")
_SGLANG_ARGS = ("SGLang server arguments, "
                "https://docs.sglang.io/advanced_features/server_arguments.html")
FACTS.update({
    "tgi_per_step_budget_flag": Fact("--max-batch-prefill-tokens", "flag", _TGI_LAUNCHER + ": "
                                     "limits the tokens of one prefill operation, the closest "
                                     "match to a per-step token budget"),
    "tgi_kv_capacity_flag": Fact("--max-batch-total-tokens", "flag", _TGI_LAUNCHER + ": the "
                                 "tokens (prompt and generated) of every request in the batch "
                                 "together, the batch's KV capacity, not a per-step budget"),
    "tgi_max_batch_size_flag": Fact("--max-batch-size", "flag", _TGI_LAUNCHER + ": the most "
                                    "requests in one batch"),
    "sglang_mixed_chunk_flag": Fact("--enable-mixed-chunk", "flag", _SGLANG_ARGS + ": mix "
                                    "decodes into the prefill batch when chunked prefill is on "
                                    "(off by default: without it a step is prefill or decode)"),
    "orca_throughput_gain": Fact(36.9, "x", "Yu et al., Orca: A Distributed Serving System for "
                                 "Transformer-Based Generative Models, OSDI 2022, abstract: "
                                 "throughput against NVIDIA FasterTransformer at the same latency "
                                 "(GPT-3 175B)"),
    "anyscale_cb_paged_gain": Fact(23, "x", "Anyscale, How continuous batching enables 23x "
                                   "throughput in LLM inference while reducing p50 latency (2023), "
                                   "https://www.anyscale.com/blog/continuous-batching-llm-inference"
                                   ": vLLM against static batching"),
    "anyscale_cb_alone_gain": Fact(8, "x", "the same Anyscale benchmark: continuous batching "
                                   "without paged attention against static batching, about this "
                                   "much"),
})

# --- What one GPU holds: per-device limits the compiled kernels are checked against ---
# (minicb.kernels.targets reads these; benchmarks/gpu-targets.md shows the check.)
_CUDA_SPECS = ("NVIDIA CUDA C++ Programming Guide, Compute Capabilities, table 'Technical "
               "Specifications per Compute Capability', https://docs.nvidia.com/cuda/"
               "cuda-c-programming-guide/index.html#features-and-technical-specifications")
_CUDA_TUNING = {75: "Turing Tuning Guide, 1.4.2.1 'Occupancy' and 1.4.2.2 'Shared Memory'",
                80: "NVIDIA Ampere GPU Architecture Tuning Guide, 1.4.1.1 'Occupancy' and "
                    "1.4.1.2 'Shared Memory'",
                86: "NVIDIA Ampere GPU Architecture Tuning Guide (GA10x, compute capability 8.6)",
                89: "NVIDIA Ada GPU Architecture Tuning Guide, 'Occupancy' and 'Shared Memory'",
                90: "NVIDIA Hopper Tuning Guide, 'Occupancy' and 'Shared Memory'"}
_BF16 = ("PTX ISA, 'Half precision floating point instructions' (bf16 forms require sm_80 or "
         "higher; ptxas: \"Feature '.bf16' requires .target sm_80 or higher\"), "
         "https://docs.nvidia.com/cuda/parallel-thread-execution/")
# capability: (shared per SM KiB, shared per block opt-in KiB, threads per SM, blocks per SM)
_CUDA = {75: (64, 64, 1024, 16), 80: (164, 163, 2048, 32), 86: (100, 99, 1536, 16),
         89: (100, 99, 1536, 24), 90: (228, 227, 2048, 32)}
for _cc, (_per_sm, _per_block, _threads, _blocks) in _CUDA.items():
    _src = f"{_CUDA_SPECS}, compute capability {_cc // 10}.{_cc % 10}; {_CUDA_TUNING[_cc]}"
    FACTS |= {
        f"sm{_cc}_shared_per_block": Fact(_per_block * KIB, "bytes", _src,
                                           "the opt-in maximum a block may ask for"),
        f"sm{_cc}_shared_per_sm": Fact(_per_sm * KIB, "bytes", _src),
        f"sm{_cc}_shared_reserved_per_block": Fact(KIB if _cc >= 80 else 0, "bytes", _src,
                                                    "system use, counted against the SM"),
        f"sm{_cc}_registers_per_sm": Fact(64 * KIB, "32-bit registers", _src),
        f"sm{_cc}_max_registers_per_thread": Fact(255, "registers", _src),
        f"sm{_cc}_max_threads_per_sm": Fact(_threads, "threads", _src),
        f"sm{_cc}_max_blocks_per_sm": Fact(_blocks, "blocks", _src),
        f"sm{_cc}_warp_size": Fact(32, "threads", _src),
        f"sm{_cc}_bf16": Fact("yes" if _cc >= 80 else "no", "native bfloat16", _BF16),
    }
_AMD_SPECS = ("AMD ROCm documentation, 'AMD GPU specifications' (LDS, wavefront size, VGPR file), "
              "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html")
_AMD_ISA = {"gfx90a": "AMD Instinct MI200 (CDNA2) Instruction Set Architecture reference guide, "
                      "'Wave occupancy' and 'Vector GPRs' (512 unified VGPRs + AccVGPRs per lane)",
            "gfx942": "AMD Instinct MI300 (CDNA3) Instruction Set Architecture reference guide, "
                      "'Wave occupancy' and 'Vector GPRs' (512 unified VGPRs + AccVGPRs per lane)"}
for _arch in ("gfx90a", "gfx942"):
    _src = f"{_AMD_SPECS}, {_arch}; {_AMD_ISA[_arch]}"
    FACTS |= {
        f"{_arch}_shared_per_block": Fact(64 * KIB, "bytes", _src, "LDS per workgroup"),
        f"{_arch}_shared_per_sm": Fact(64 * KIB, "bytes", _src, "LDS per compute unit"),
        f"{_arch}_shared_reserved_per_block": Fact(0, "bytes", _src),
        f"{_arch}_registers_per_simd_lane": Fact(512, "32-bit VGPRs", _src,
                                                 "arch VGPRs and AccVGPRs share one file"),
        f"{_arch}_simds_per_cu": Fact(4, "SIMDs", _src),
        f"{_arch}_max_waves_per_simd": Fact(8, "wavefronts", _src),
        f"{_arch}_max_registers_per_thread": Fact(512, "VGPRs", _src),
        f"{_arch}_max_threads_per_sm": Fact(2048, "threads", _src, "4 SIMDs x 8 waves x 64"),
        f"{_arch}_max_blocks_per_sm": Fact(32, "workgroups", _src),
        f"{_arch}_warp_size": Fact(64, "threads", _src, "a wavefront"),
        f"{_arch}_bf16": Fact("yes", "native bfloat16", _src),
    }
del _cc, _per_sm, _per_block, _threads, _blocks, _arch, _src

# --- Paged KV: the vLLM paper and other engines' page sizes (chapter 04) ---
_VLLM_PAPER = ("Kwon et al., Efficient Memory Management for Large Language Model Serving with "
               "PagedAttention, SOSP 2023, https://arxiv.org/abs/2309.06180")
FACTS.update({
    "vllm_paper_kv_used_low": Fact(20.4, "%", _VLLM_PAPER + ", section 1 and Figure 2: the "
                                   "share of KV cache memory holding token states in earlier "
                                   "systems, lowest"),
    "vllm_paper_kv_used_high": Fact(38.2, "%", _VLLM_PAPER + ", section 1 and Figure 2: the "
                                    "same share, highest"),
    "vllm_paper_kv_waste": Fact(4, "%", _VLLM_PAPER + ", section 1: vLLM wastes under this share "
                                "of KV cache memory"),
    "vllm_paper_throughput_gain_low": Fact(2, "x", _VLLM_PAPER + ", abstract: throughput over "
                                           "FasterTransformer and Orca at the same latency, lowest"),
    "vllm_paper_throughput_gain_high": Fact(4, "x", _VLLM_PAPER + ", abstract: the same, highest"),
    "vllm_default_block_size": Fact(16, "tokens", "vLLM engine arguments, --block-size default "
                                    "on CUDA, https://docs.vllm.ai/en/latest/configuration/"
                                    "engine_args.html"),
    "vllm_free_block_order": Fact("least recently used first", "eviction order",
                                  "vllm-project/vllm, vllm/v1/core/kv_cache_utils.py, class "
                                  "FreeKVCacheBlockQueue: one doubly linked list of free blocks, "
                                  "cached ones included; new blocks are taken from its front, "
                                  "freed ones appended at its back, a request's blocks in reverse "
                                  "order so the tail of a block chain is evicted first"),
    "sglang_default_page_size": Fact(1, "tokens", "SGLang server arguments, --page-size default "
                                     "(a radix tree over single tokens), sgl-project/sglang "
                                     "python/sglang/srt/server_args.py, "
                                     "https://docs.sglang.ai/advanced_features/server_arguments.html"),
    "h100_sxm_sms": Fact(132, "streaming multiprocessors", "NVIDIA H100 Tensor Core GPU "
                         "Architecture whitepaper (the H100 SXM5 has 132 SMs), "
                         "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"),
    # --- what production engines add (chapter 05 and chapter 07) ---
    "flash_decoding_speedup": Fact(8, "x", "Dao, Haziza, Massa, Sizov, Flash-Decoding for "
                                   "long-context inference (2023): up to this much faster "
                                   "generation for very long sequences, "
                                   "https://crfm.stanford.edu/2023/10/12/flashdecoding.html"),
    "sarathi_serve_capacity_gain": Fact(2.6, "x", "Agrawal et al., Taming Throughput-Latency "
                                        "Tradeoff in LLM Inference with Sarathi-Serve, OSDI 2024, "
                                        "abstract: serving capacity over vLLM, Mistral-7B on one "
                                        "A100, https://arxiv.org/abs/2403.02310"),
    "sglang_overlap_gain": Fact(1.1, "x", "SGLang v0.4 release blog (LMSYS, 2024-12-04), "
                                "zero-overhead batch scheduler: throughput gain, "
                                "https://lmsys.org/blog/2024-12-04-sglang-v0-4/"),
    # --- overlapped scheduling (chapter 10) ---
    "hf_async_batching_gpu_active_sync": Fact(76.0, "%", _HF_ASYNC + ": GPU active time with "
                                              "synchronous continuous batching"),
    "hf_async_batching_gpu_active_async": Fact(99.4, "%", _HF_ASYNC + ": GPU active time with "
                                               "asynchronous batching"),
    "hf_async_batching_seconds_sync": Fact(300.6, "s", _HF_ASYNC + ": total generation time, "
                                           "synchronous"),
    "hf_async_batching_seconds_async": Fact(234.5, "s", _HF_ASYNC + ": total generation time, "
                                            "asynchronous"),
    "hf_async_batching_batch_size": Fact(32, "requests", _HF_ASYNC + ": the benchmark's batch size"),
    "hf_async_batching_output_tokens": Fact("8K", "tokens", _HF_ASYNC + ": tokens generated in "
                                            "the benchmark"),
    "hf_async_batching_model_params": Fact("8B", "parameters", _HF_ASYNC + ": the benchmark's "
                                           "model size"),
    "spec_decoding_t5_speedup_low": Fact(2, "x", "Leviathan, Kalman, Matias, Fast Inference from "
                                         "Transformers via Speculative Decoding, ICML 2023, "
                                         "abstract (T5-XXL), https://arxiv.org/abs/2211.17192"),
    "spec_decoding_t5_speedup_high": Fact(3, "x", "the same paper and abstract, highest"),
    "spec_sampling_chinchilla_speedup_low": Fact(2, "x", "Chen et al., Accelerating Large "
                                                 "Language Model Decoding with Speculative "
                                                 "Sampling (DeepMind, 2023), abstract "
                                                 "(Chinchilla 70B), "
                                                 "https://arxiv.org/abs/2302.01318"),
    "spec_sampling_chinchilla_speedup_high": Fact(2.5, "x", "the same paper and abstract, "
                                                  "highest"),
    "distserve_more_requests": Fact(7.4, "x", "Zhong et al., DistServe, OSDI 2024, abstract: "
                                    "requests served within the SLOs against systems that mix "
                                    "prefill and decode, https://arxiv.org/abs/2401.09670"),
    "distserve_tighter_slo": Fact(12.6, "x", "Zhong et al., DistServe, OSDI 2024, abstract: "
                                  "tighter SLOs met, same comparison"),
})


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


# --- the roofline's second GPU, and the model the interview's worked examples size ---
_H100_SHEET = ("NVIDIA H100 Tensor Core GPU data sheet (H100 SXM), "
               "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_LLAMA3_8B = "meta-llama/Meta-Llama-3-8B config.json"
FACTS.update({
    "h100_sxm_bf16_tflops": Fact(989, "TFLOP/s", _H100_SHEET + ": BF16 Tensor Core 1,979 TFLOP/s "
                                 "with sparsity; dense is half of that"),
    "h100_memory": Fact(80, "GB", _H100_SHEET + ": GPU memory 80 GB (HBM3)"),
    "llama3_8b_params": Fact(8_030_261_248, "parameters", _LLAMA3_8B + " and its safetensors "
                             "index (total_size 16,060,522,496 bytes in bf16, two bytes each)"),
    "llama3_8b_layers": Fact(32, "layers", _LLAMA3_8B + ": num_hidden_layers"),
    "llama3_8b_kv_heads": Fact(8, "heads", _LLAMA3_8B + ": num_key_value_heads"),
    "llama3_8b_query_heads": Fact(32, "heads", _LLAMA3_8B + ": num_attention_heads"),
    "llama3_8b_head_dim": Fact(128, "elements", _LLAMA3_8B + ": hidden_size 4096 / "
                               "num_attention_heads 32"),
})

# --- the interview's cheat sheet: DeepSeek-V2's headline number, and the shapes its examples use ---
_DEEPSEEK_V2 = ("DeepSeek-AI, DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts "
                "Language Model, 2024, https://arxiv.org/abs/2405.04434")
_DEEPSEEK_V2_CONFIG = "deepseek-ai/DeepSeek-V2 config.json"
FACTS.update({
    "h100_nvlink_bandwidth": Fact(900, "GB/s", _H100_SHEET + ": NVLink 900 GB/s (both directions "
                                  "together)"),
    "deepseek_v2_kv_reduction": Fact(93.3, "%", _DEEPSEEK_V2 + ", abstract: KV cache against "
                                     "DeepSeek 67B"),
    "deepseek_v2_layers": Fact(60, "layers", _DEEPSEEK_V2_CONFIG + ": num_hidden_layers"),
    "deepseek_v2_kv_latent_dim": Fact(512, "elements", _DEEPSEEK_V2_CONFIG + ": kv_lora_rank, the "
                                      "compressed latent cached per token and layer"),
    "deepseek_v2_rope_key_dim": Fact(64, "elements", _DEEPSEEK_V2_CONFIG + ": qk_rope_head_dim, the "
                                     "decoupled rotary key cached beside the latent"),
})

# --- speculative decoding in production engines (chapter 08) ---
_SGLANG_SPEC = ("SGLang documentation, Speculative Decoding, "
                "https://docs.sglang.io/docs/advanced_features/speculative_decoding")
_VLLM_SPEC = ("vLLM documentation, Speculative Decoding, "
              "https://docs.vllm.ai/en/latest/features/spec_decode/")
FACTS.update({
    "vllm_spec_methods": Fact("n-gram prompt lookup, a draft model, and EAGLE heads", "proposers",
                              _VLLM_SPEC + " (and its EAGLE page, features/speculative_decoding/"
                              "eagle/)"),
    "vllm_spec_caveat": Fact("does not usually yield inter-token latency reductions for all "
                             "prompt datasets or sampling parameters", "caveat",
                             _VLLM_SPEC + ", the warning at the top of the page"),
    "sglang_spec_methods": Fact("EAGLE-2, EAGLE-3, multi-token prediction, a standalone draft "
                                "model, and n-gram lookup", "proposers",
                                _SGLANG_SPEC),
    "sglang_eagle3_speedup": Fact(2.36, "x", _SGLANG_SPEC + ": 373.25 against 158.34 tokens/s, "
                                  "Llama-3.1-8B-Instruct on MT-Bench, one H100 (EAGLE-3 against "
                                  "no speculation)"),
    "tgi_spec_methods": Fact("Medusa heads and n-gram lookup", "proposers",
                             "Hugging Face text-generation-inference documentation, Speculation, "
                             "https://huggingface.co/docs/text-generation-inference/conceptual/"
                             "speculation"),
})

# --- vLLM's router (vllm-router 0.1.17, the Rust router chapter 09 runs): its defaults ---
_VLLM_ROUTER_HELP = "vllm-router 0.1.17 (PyPI), `vllm-router --help`"
FACTS.update({
    "vllm_router_cache_threshold": Fact(0.3, "fraction", _VLLM_ROUTER_HELP + ": --cache-threshold, "
                                        "the share of a request's text a replica's tree must "
                                        "match for cache_aware to send it there"),
    "vllm_router_balance_abs_threshold": Fact(64, "requests", _VLLM_ROUTER_HELP + ": "
                                              "--balance-abs-threshold, how many more requests "
                                              "the busiest replica must hold than the idlest "
                                              "before cache_aware balances load instead"),
    "vllm_router_balance_rel_threshold": Fact(1.5, "x", _VLLM_ROUTER_HELP + ": "
                                              "--balance-rel-threshold, and how many times as "
                                              "many"),
    "vllm_router_health_check_interval": Fact(60, "s", _VLLM_ROUTER_HELP + ": "
                                              "--health-check-interval-secs"),
})

# --- quantisation, offload and preemption (chapter 07), experts and pipelines (chapter 09) ---
FACTS.update({
    "h100_sxm_fp8_tflops": Fact(1979, "TFLOP/s", _H100_SHEET + ": FP8 Tensor Core 3,958 TFLOP/s "
                                "with sparsity; dense is half of that"),
    "h100_pcie_bandwidth": Fact(128, "GB/s", _H100_SHEET + ": interconnect PCIe Gen5 128 GB/s "
                                "(both directions together)"),
    "vllm_preemption_mode": Fact("recomputed", "mode", "vLLM documentation, Optimization and "
                                 "Tuning, Preemption (vLLM V1): preempted requests are recomputed "
                                 "when KV cache space is available again, https://docs.vllm.ai/en/"
                                 "latest/configuration/optimization/"),
    "deepseek_v2_total_params": Fact(236e9, "parameters", _DEEPSEEK_V2 + ", abstract: 236B total "
                                     "parameters"),
    "deepseek_v2_active_params": Fact(21e9, "parameters", _DEEPSEEK_V2 + ", abstract: 21B "
                                      "activated for each token"),
})
FACTS.update({
    "deepseek_v2_routed_experts": Fact(160, "experts", _DEEPSEEK_V2_CONFIG + ": n_routed_experts"),
    "deepseek_v2_experts_per_token": Fact(6, "experts", _DEEPSEEK_V2_CONFIG + ": "
                                          "num_experts_per_tok, the routed experts each token uses "
                                          "(beside n_shared_experts 2 that every token uses)"),
})
FACTS.update({
    "deepseek_v2_attention_heads": Fact(128, "heads", _DEEPSEEK_V2_CONFIG + ": num_attention_heads"),
})
# --- serving questions of the interview notebook (CUDA graphs, grammars, LoRA, determinism) ---
_VLLM_GRAPHS_PR = ("vllm-project/vllm pull request 1440, 'CUDA graph for Llama' (2023-10-20): "
                   "Llama-2-7B, no tensor parallelism, batch 1, 5 prompt and 100 output tokens, "
                   "https://github.com/vllm-project/vllm/pull/1440")
_TM_NONDETERMINISM = ("Horace He and Thinking Machines Lab, Defeating Nondeterminism in LLM "
                      "Inference, Connectionism (2025-09-10), the section 'Experiments', "
                      "https://thinkingmachines.ai/blog/defeating-nondeterminism-in-llm-inference/")
FACTS.update({
    "vllm_graphs_7b_eager_s": Fact(1.2, "s", _VLLM_GRAPHS_PR + ": about 1.2 s without CUDA graphs"),
    "vllm_graphs_7b_graph_s": Fact(1.05, "s", _VLLM_GRAPHS_PR + ": about 1.05 s with CUDA graphs"),
    "vllm_graphs_7b_output_tokens": Fact(100, "tokens", _VLLM_GRAPHS_PR + ": the output tokens "
                                         "those times cover"),
    "llguidance_mask_us": Fact(50, "µs", "guidance-ai/llguidance, README.md: mask computation "
                               "takes approximately 50 µs of single-core CPU time for a 128k-token "
                               "tokenizer, with no significant startup cost (masks computed on the "
                               "fly, not precomputed), https://github.com/guidance-ai/llguidance"),
    "punica_throughput_gain": Fact(12, "×", "Chen et al., Punica: Multi-Tenant LoRA Serving, "
                                   "MLSys 2024 (arXiv:2310.18547), abstract: 12x higher throughput "
                                   "serving multiple LoRA models than state-of-the-art systems"),
    "punica_added_latency_ms": Fact(2, "ms per token", "Punica (arXiv:2310.18547), abstract: "
                                    "while only adding 2 ms latency per token"),
    "s_lora_throughput_gain": Fact(4, "×", "Sheng et al., S-LoRA: Serving Thousands of Concurrent "
                                   "LoRA Adapters, MLSys 2024 (arXiv:2311.03285), abstract: up to "
                                   "4 times the throughput of HuggingFace PEFT and vLLM with naive "
                                   "LoRA support"),
    "tm_nondeterminism_runs": Fact(1000, "completions", _TM_NONDETERMINISM + ": one prompt at "
                                   "temperature 0 on Qwen3-235B-A22B-Instruct-2507, 1,000 times"),
    "tm_nondeterminism_unique": Fact(80, "completions", _TM_NONDETERMINISM + ": 80 unique "
                                     "completions among them; with batch-invariant kernels, all "
                                     "1,000 identical"),
})

# --- expert parallelism's load balancing: DeepSeek-V3's redundant experts (EPLB) ---
_DEEPSEEK_V3 = ("DeepSeek-AI, DeepSeek-V3 Technical Report, 2024, https://arxiv.org/abs/2412.19437")
FACTS.update({
    "deepseek_v3_routed_experts": Fact(256, "experts", "deepseek-ai/DeepSeek-V3 config.json: "
                                       "n_routed_experts"),
    "deepseek_v3_prefill_ep": Fact(32, "GPUs", _DEEPSEEK_V3 + ", section 3.4.1: the prefilling "
                                   "stage's MoE part uses 32-way expert parallelism (EP32)"),
    "deepseek_v3_redundant_experts": Fact(32, "experts", _DEEPSEEK_V3 + ", section 3.4.1: 32 "
                                          "redundant experts for the prefilling stage, each GPU "
                                          "hosting one besides its original 8; the high-load "
                                          "experts re-detected periodically (e.g. every 10 "
                                          "minutes)"),
})
