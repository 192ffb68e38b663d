"""The benchmarks' pictures, drawn from their JSON payloads (python -m minicb bench ... draws
them beside the JSON), and the one-line machine caption every benchmark prints and draws. The
command line draws into files (minicb.bench.main picks matplotlib's file back end); imported in
a notebook, the same functions draw inline."""

from __future__ import annotations

import matplotlib.pyplot as plt

MINICB_COLOR, PEER_COLOR = "#1f77b4", "#aaaaaa"


def describe(info: dict) -> str:
    """One line for a table caption: cores, CPU, GPU and the two versions that matter most."""
    gpu = ", ".join(g["name"] for g in info["gpus"]) or "no GPU"
    v = info["versions"]
    return (f"{info['cpu_cores']}-core {info['cpu_model']}, {gpu}, torch {v['torch']}, "
            f"transformers {v['transformers']}")


def plot_offline(payload: dict):
    systems = payload["systems"]
    names = [s["system"] for s in systems]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.4
    ys = list(range(len(systems)))
    for offset, key, ratio, label, alpha in (
        (-width / 2, "output_throughput", "ratio_to_slowest", "per second", 1.0),
        (width / 2, "output_per_cpu_second", "ratio_to_slowest_cpu", "per CPU second", 0.55)):
        colors = [PEER_COLOR if n.startswith("hf-") else MINICB_COLOR for n in names]
        bars = left.barh([y + offset for y in ys], [s[key] for s in systems], width, color=colors,
                         alpha=alpha, label=f"output tokens {label}")
        for bar, s in zip(bars, systems):
            left.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s[ratio]:.1f}x",
                      va="center", fontsize=8)
    left.set_yticks(ys, names)
    left.invert_yaxis()
    left.set_xlim(
        0, 1.15 * max(max(s["output_throughput"], s["output_per_cpu_second"]) for s in systems))
    left.set_xlabel("output tokens (higher is better; x = ratio to the slowest)")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8)
    left.set_title("throughput (grey: transformers, blue: minicb)")
    right.barh([y - width / 2 for y in ys], [s["ttft_p50_s"] for s in systems], width,
               label="TTFT p50 (s)")
    right.barh([y + width / 2 for y in ys], [s["tpot_p50_ms"] / 1e3 for s in systems], width,
               label="TPOT p50 (s)")
    right.set_yticks(ys, names)
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("seconds, log scale (lower is better)")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8)
    right.set_title("latency (wall clock)")
    w = payload["workload"]
    fig.suptitle(f"{payload['model']['label']}, {w['name']} ({w['num_requests']} requests), "
                 f"{payload['model']['device']} "
                 f"{payload['model']['dtype']}\n{describe(payload['machine'])}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_memory(payload: dict):
    runs = payload["runs"]
    colors = {"contiguous": "#7f7f7f", "paged": MINICB_COLOR}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        steps = range(1, len(run["running"]) + 1)
        color = colors[run["kv_cache"]]
        axes[0].plot(steps, run["running"], color=color, label=run["kv_cache"])
        axes[1].plot(steps, run["reserved_slots"], color=color,
                     label=f"{run['kv_cache']}: reserved")
        axes[1].plot(steps, run["kv_tokens"], color=color, linestyle=":",
                     label=f"{run['kv_cache']}: holding a token")
    axes[0].set(title="requests running at once", xlabel="step")
    axes[1].set(title=f"KV slots (budget {payload['kv_slots']})", xlabel="step")
    waste = [100 * r["waste_fraction"] for r in runs]
    bars = axes[2].bar([r["kv_cache"] for r in runs], waste,
                       color=[colors[r["kv_cache"]] for r in runs])
    for bar, value in zip(bars, waste):
        axes[2].text(bar.get_x() + bar.get_width() / 2, value, f"{value:.1f}%", ha="center",
                     va="bottom")
    axes[2].set(title="reserved KV slots holding no token", ylabel="% of reserved slot-steps",
                ylim=(0, max(waste) * 1.15 + 1))
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    fig.suptitle(f"{payload['workload']['name']} ({payload['workload']['num_requests']} requests), "
                 f"cost-model runner, max_model_len {payload['max_model_len']}, block_size "
                 f"{payload['block_size']}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_overhead(payload: dict):
    """The host's part of a decode step at each batch size (one panel each, the forward left
    out): its phases, the whole with its spread over the repeats, the target and, when measured,
    the baseline engine's whole."""
    rows = payload["summary"]
    before = {r["batch"]: r for r in (payload.get("baseline") or {}).get("summary") or []}
    phases = ["schedule", "prepare", "sample", "update", "rest"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4), squeeze=False)
    for ax, r in zip(axes[0], rows):
        ax.bar(phases, [max(r["phases_mean_us"][p], 0.0) for p in phases], color="tab:blue")
        ax.axhline(r["host_us_median"], color="black",
                   label=f"host part {r['host_us_median']:.0f} µs "
                         f"({r['host_us_min']:.0f}-{r['host_us_max']:.0f})")
        if r["batch"] in before:
            ax.axhline(before[r["batch"]]["host_us_median"], color="gray", linestyle=":",
                       label=f"baseline {before[r['batch']]['host_us_median']:.0f} µs")
        if r.get("target_us") is not None:
            ax.axhline(r["target_us"], color="red", linestyle="--",
                       label=f"target {r['target_us']:.0f} µs")
        ax.set(title=f"{r['batch']} decode rows", ylabel="µs per step (CPU time)")
        ax.tick_params(axis="x", labelrotation=30)
        ax.legend(fontsize=7)
    fig.suptitle(f"The host's part of a decode step ({payload['model']['label']})\n"
                 f"{describe(payload['machine'])}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_neighbour(payload: dict):
    """Each system's throughput quiet and beside a busy neighbour, with the slowdown."""
    systems = payload["systems"]
    names = [s["system"] for s in systems]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(systems) + 1.8))
    ys = list(range(len(systems)))
    width = 0.4
    colors = [PEER_COLOR if n.startswith("hf-") else MINICB_COLOR for n in names]
    ax.barh([y - width / 2 for y in ys], [s["quiet_tok_s"] for s in systems], width,
            color=colors, label="quiet machine")
    bars = ax.barh([y + width / 2 for y in ys], [s["loaded_tok_s"] for s in systems], width,
                   color=colors, alpha=0.45, hatch="//", label="one core busy")
    for bar, s in zip(bars, systems):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" -{s['slowdown']:.0%}" if s["slowdown"] >= 0 else f" +{-s['slowdown']:.0%}",
                va="center", fontsize=8)
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.18 * max(max(s["quiet_tok_s"], s["loaded_tok_s"]) for s in systems))
    ax.set_xlabel("output tokens per second, pooled over repeats (label: the loss when one core "
                  "is busy)")
    ax.legend(loc="lower right", fontsize=8)
    w = payload["workload"]
    ax.set_title(f"{payload['model']['label']}, {w['name']} ({w['num_requests']} requests)\n"
                 f"{describe(payload['machine'])}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_calibration(payload: dict):
    """Measured step time against the fitted cost model, one point per step shape."""
    samples, predicted = payload["samples"], payload["predicted"]
    fig, ax = plt.subplots(figsize=(6, 5))
    measured = [s["seconds"] * 1e3 for s in samples]
    model = [p * 1e3 for p in predicted]
    sizes = [12 + 4 * s["decode_rows"] ** 0.5 for s in samples]
    colors = [s["prefill_tokens"] for s in samples]
    points = ax.scatter(measured, model, s=sizes, c=colors, cmap="viridis")
    top = 1.1 * max(measured + model)
    ax.plot([0, top], [0, top], color="grey", lw=1, ls="--", label="model = measured")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("cost model (ms)")
    fig.colorbar(points, ax=ax, label="prompt tokens in the step")
    fit = payload["fit"]
    fused = (f"decodes only, up to {fit['fused_rows']} rows (fused layer): "
             f"{fit['fused_overhead'] * 1e3:.2f} ms + {fit['fused_decode_seq'] * 1e3:.3f} ms/row + "
             f"{fit['fused_context_token'] * 1e6:.2f} us/key\n" if fit.get("fused_rows") else "")
    ax.set_title(f"{fused}other steps: {fit['step_overhead'] * 1e3:.2f} ms + "
                 f"{fit['prefill_token'] * 1e6:.0f} us/prompt token + "
                 f"{fit['decode_seq'] * 1e3:.3f} ms/row + {fit['context_token'] * 1e6:.2f} us/key"
                 f"\nR² {payload['r2']:.3f}; "
                 f"{describe(payload['machine'])}", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def plot_speculative(payload: dict):
    """Speculation's tokens/s ratio against batch size (measured here; predicted for an A100),
    and how many tokens a request gained per step with each proposer."""
    fig, (measured, predicted, steps) = plt.subplots(1, 3, figsize=(16, 4.6))
    styles = {"code": "-", "random": ":"}
    markers = {"minicb": "o", "vllm": "s"}
    for s_key in sorted({(s["system"], s["workload"], s["method"]) for s in payload["summary"]}):
        points = sorted((s for s in payload["summary"]
                         if (s["system"], s["workload"], s["method"]) == s_key),
                        key=lambda s: s["batch_size"])
        system, workload, method = s_key
        measured.plot([s["batch_size"] for s in points], [s["speedup"] for s in points],
                      styles.get(workload, "-"), marker=markers.get(system, "x"),
                      label=f"{system} {method}, {workload}")
    a100 = payload["predictions"][0]
    for workload, method in sorted({(r["workload"], r["method"]) for r in a100["rows"]}):
        points = [r for r in a100["rows"] if (r["workload"], r["method"]) == (workload, method)]
        line, = predicted.plot([r["batch_size"] for r in points], [r["speedup"] for r in points],
                               styles.get(workload, "-"), marker="^", label=f"{method}, {workload}")
        far = [r for r in points if r["extrapolated"]]      # hollow: the largest batch's rates
        predicted.plot([r["batch_size"] for r in far], [r["speedup"] for r in far], "^",
                       color="white", markeredgecolor=line.get_color())
    for ax, title in ((measured, f"measured: {describe(payload['machine'])}"),
                      (predicted, "PREDICTED: A100 cost model (Llama-2-7B), measured acceptance\n"
                                  "(hollow: past the largest batch measured, its rates)")):
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (requests at once)")
        ax.set_ylabel("tokens/s with speculation / without")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    runs = [r for r in payload["runs"] if r["system"] == "minicb" and r["method"] != "none"
            and r["batch_size"] == min(payload["settings"]["batch_sizes"])]
    series = sorted({(r["workload"], r["method"]) for r in runs})
    width = 0.8 / max(len(series), 1)
    for i, (workload, method) in enumerate(series):
        hist: dict[int, int] = {}
        for r in runs:
            if (r["workload"], r["method"]) == (workload, method):
                for tokens, count in r["tokens_per_step"].items():
                    hist[int(tokens)] = hist.get(int(tokens), 0) + count
        total = sum(hist.values())
        xs = sorted(hist)
        steps.bar([x + (i - (len(series) - 1) / 2) * width for x in xs],
                  [hist[x] / total for x in xs], width, label=f"{method}, {workload}")
    steps.set_xlabel("tokens a request gained in one step (1 = nothing accepted)")
    steps.set_ylabel("share of steps")
    steps.set_title(f"accepted lengths per step, minicb, batch "
                    f"{min(payload['settings']['batch_sizes'])}", fontsize=9)
    steps.legend(fontsize=7)
    fig.tight_layout()
    return fig
