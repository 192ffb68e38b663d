"""The server's live counters, written out in Prometheus' text format for GET /metrics.

Gauges say what is happening now (requests running and waiting, KV blocks used and free);
counters only grow (tokens, finished requests, prefix-cache lookups); histograms count latencies
into buckets, from which a dashboard computes percentiles over any time window. Where vLLM
exports the same quantity, the name is vLLM's with `minicb_` for its `vllm:` prefix, so a
vLLM dashboard's queries carry over once the prefix is changed.

A request with n parallel samples counts its prompt tokens once; each sample counts as a
finished request (with its own finish reason and latencies) and its tokens as generated.
The prefix-cache counters are the KV manager's (`engine.kv.prefix_stats()`): tokens looked up
and tokens found when requests are admitted, and cached blocks evicted. They stay 0 when prefix
caching is off.
"""

from __future__ import annotations

from collections import Counter

from minicb.kv.prefix import PrefixCacheStats

# bucket upper bounds in seconds: from sub-millisecond (tiny models) to a minute (a long queue)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)    # per bucket, not yet cumulative
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
                break

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {cumulative}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum}",
                  f"{self.name}_count {self.count}"]
        return lines


class ServingStats:
    """Updated by the async engine as deltas go out; rendered on every scrape."""

    def __init__(self, expert_load=None) -> None:
        """`expert_load`: a mixture-of-experts model's counts (minicb.model.expert_load), shown
        beside the rest; None for a dense model."""
        self.expert_load = expert_load
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.draft_tokens = 0           # speculative decoding: tokens proposed, then accepted
        self.accepted_tokens = 0
        self.finished = Counter()       # finish reason → requests
        self.rejected = Counter()       # "invalid" | "overloaded" → requests turned away
        self.ttft = Histogram("minicb_time_to_first_token_seconds", "Time to first token.",
                              TTFT_BUCKETS)
        self.tpot = Histogram("minicb_time_per_output_token_seconds",
                              "Time per output token after the first.", TPOT_BUCKETS)
        self.e2e = Histogram("minicb_e2e_request_latency_seconds", "Arrival to last token.",
                             E2E_BUCKETS)

    def on_finished(self, metrics, finish_reason: str, count_prompt: bool = True) -> None:
        """One request (or one sample of it) finished; `count_prompt=False` for the samples of a
        parallel-sampling request after its first, whose prompt is already counted."""
        self.finished[finish_reason] += 1
        if count_prompt:
            self.prompt_tokens += metrics.num_prompt_tokens
        self.draft_tokens += metrics.num_proposed_tokens
        self.accepted_tokens += metrics.num_accepted_tokens
        values = (metrics.ttft, metrics.tpot, metrics.e2e)
        for histogram, value in zip((self.ttft, self.tpot, self.e2e), values):
            if value is not None:
                histogram.observe(value)

    def render(self, num_running: int, num_waiting: int, kv_used: int, kv_free: int,
               prefix: PrefixCacheStats | None = None) -> str:
        prefix = prefix or PrefixCacheStats()
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        metric("minicb_num_requests_running", "gauge", "Requests in the running batch.",
               [("", num_running)])
        metric("minicb_num_requests_waiting", "gauge", "Requests waiting for a slot.",
               [("", num_waiting)])
        metric("minicb_kv_blocks_used", "gauge", "KV cache blocks held by requests.",
               [("", kv_used)])
        metric("minicb_kv_blocks_free", "gauge", "KV cache blocks on the free list.",
               [("", kv_free)])
        metric("minicb_kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (0 to 1).",
               [("", kv_used / max(kv_used + kv_free, 1))])
        metric("minicb_prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache at admission.",
               [("", prefix.queried_tokens)])
        metric("minicb_prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache (not computed again).",
               [("", prefix.hit_tokens)])
        metric("minicb_prefix_cache_hit_rate", "gauge",
               "Hits over queries since the start (0 to 1); rate() of the two counters gives a "
               "window.",
               [("", prefix.hit_rate)])
        metric("minicb_prefix_cache_evictions_total", "counter",
               "Cached blocks evicted to make room.", [("", prefix.evictions)])
        metric("minicb_prompt_tokens_total", "counter",
               "Prompt tokens of finished requests (once per request, however many samples).",
               [("", self.prompt_tokens)])
        metric("minicb_generation_tokens_total", "counter", "Tokens generated.",
               [("", self.generation_tokens)])
        metric("minicb_spec_decode_num_draft_tokens_total", "counter",
               "Speculative decoding: tokens proposed for verification (finished requests).",
               [("", self.draft_tokens)])
        metric("minicb_spec_decode_num_accepted_tokens_total", "counter",
               "Speculative decoding: proposed tokens the model accepted (finished requests); "
               "over the drafted ones, the acceptance rate.",
               [("", self.accepted_tokens)])
        metric("minicb_request_success_total", "counter",
               "Finished requests by finish reason (each of n parallel samples counts).",
               [(f'{{finished_reason="{r}"}}', count)
                for r, count in sorted(self.finished.items())])
        metric(
            "minicb_request_rejected_total", "counter", "Requests turned away before running.",
            [(f'{{reason="{reason}"}}', count) for reason, count in sorted(self.rejected.items())])
        for histogram in (self.ttft, self.tpot, self.e2e):
            lines.extend(histogram.render())
        if self.expert_load is not None:   # tokens per expert, imbalance, experts touched
            lines.extend(self.expert_load.prometheus_lines())
        return "\n".join(lines) + "\n"
