"""The load tester: vLLM's metric definitions, arrivals, the concurrency cap, any OpenAI-style
server (a stand-in that streams two tokens per chunk), minicb's own server, and the load study."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import httpx
import pytest
from serving_common import run
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from minicb import default_model_path
from minicb.bench.load_study import StudyConfig, format_rows, plot, run_study
from minicb.serving.loadgen import (
    BenchConfig,
    RequestResult,
    benchmark,
    collect,
    main,
    make_workload,
    run_benchmark,
)
from minicb.serving.server import ServerThread, build_app
from minicb.sim.workload import gamma_arrivals


def other_server(state: dict) -> Starlette:
    """An OpenAI-compatible stand-in that is not minicb: two tokens per chunk, usage only in a
    last chunk when asked for, and it counts the streams in flight."""

    async def completions(request):
        body = await request.json()
        state["bodies"].append(body)
        prompt = body["prompt"]
        num_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())

        async def events():
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                n = body["max_tokens"]
                for start in range(0, n, 2):
                    await asyncio.sleep(0.01)
                    done = start + 2 >= n
                    chunk = {"choices": [{"index": 0, "text": "ab" * min(2, n - start),
                                          "finish_reason": "length" if done else None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": num_prompt, "completion_tokens": n,
                             "total_tokens": num_prompt + n}
                    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state["in_flight"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "other-model", "object": "model"}]})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models)])


@pytest.fixture
def other():
    state = {"bodies": [], "in_flight": 0, "max_in_flight": 0}
    with ServerThread(other_server(state)) as server:
        yield server, state


def test_per_request_metrics_follow_vllm_definitions():
    # sent at 10.0; chunks at 10.2, 10.25, 10.35, 10.40; stream closed at 10.41; 4 tokens
    result = RequestResult(True, 10.0, [10.2, 10.25, 10.35, 10.40], 10.41, prompt_tokens=7,
                           output_tokens=4)
    metrics = result.metrics()
    assert metrics.ttft == pytest.approx(0.2)
    assert metrics.tpot == pytest.approx(0.2 / 3)           # first token left out
    assert metrics.itl == pytest.approx([0.05, 0.10, 0.05])
    assert metrics.e2e == pytest.approx(0.41)


def test_summary_counts_failures_apart_and_goodput_against_the_slos():
    fast = RequestResult(True, 0.0, [0.1, 0.2, 0.3], 0.3, 5, 3)       # TTFT 100 ms, TPOT 100 ms
    slow_start = RequestResult(True, 0.0, [0.6, 0.7, 0.8], 1.0, 5, 3)  # TTFT 600 ms
    failed = RequestResult(False, 0.0, error="HTTP 500")
    config = BenchConfig("http://x", goodput={"ttft": 500, "tpot": 150})
    summary = collect(config, "m", [fast, slow_start, failed], started=0.0)
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert summary["duration_s"] == pytest.approx(1.0)
    assert summary["goodput"] == pytest.approx(1.0)               # one of two met both, over 1 s
    assert summary["output_throughput"] == pytest.approx(6.0)
    assert summary["ttft_ms"]["mean"] == pytest.approx(350.0)
    assert summary["ttft_ms"]["p50"] == pytest.approx(350.0)
    assert summary["errors"] == ["", "", "HTTP 500"]


def test_any_openai_server_token_counts_come_from_usage(other):
    server, state = other
    config = BenchConfig(server.url, num_prompts=6, input_len=5, output_len=7, range_ratio=0.5,
                         disable_tqdm=True)
    result = run(run_benchmark(config))
    expected_outputs = make_workload(config).output_lens
    assert result["model"] == "other-model" and result["completed"] == 6
    assert result["total_output_tokens"] == sum(expected_outputs)     # not the number of chunks
    assert sorted(b["max_tokens"] for b in state["bodies"]) == sorted(expected_outputs)
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True}
               for b in state["bodies"])
    # only standard fields by default
    assert all("ignore_eos" not in b for b in state["bodies"])


def test_arrivals_follow_the_gamma_process_and_concurrency_is_capped(other):
    server, state = other
    config = BenchConfig(server.url, num_prompts=10, request_rate=40.0, burstiness=0.5,
                         max_concurrency=3, input_len=4, output_len=6, seed=3, disable_tqdm=True)
    result = run(run_benchmark(config))
    arrivals = gamma_arrivals(10, 40.0, 0.5, seed=3)
    # a request is never sent before its arrival time (it may wait for a free slot after it)
    assert all(sent >= arrival - 0.001
               for sent, arrival in zip(sorted(result["send_times"]), arrivals))
    assert state["max_in_flight"] == 3
    assert result["completed"] == 10


def test_the_synchronous_entry_point_also_works_where_a_loop_already_runs(other):
    server, _ = other
    config = BenchConfig(server.url, num_prompts=2, input_len=3, output_len=2, disable_tqdm=True)

    async def notebook_cell():    # Jupyter runs every cell inside an event loop
        return benchmark(config)

    assert run(notebook_cell())["completed"] == 2


def test_the_command_line_writes_json_and_a_plot(other, tmp_path):
    server, _ = other
    code = main(["--base-url", server.url, "--num-prompts", "4", "--input-len", "4", "--output-len",
                 "4", "--goodput", "ttft:1000", "tpot:1000", "--out-dir", str(tmp_path),
                 "--result-name", "run", "--disable-tqdm"])
    saved = json.loads((tmp_path / "run.json").read_text())
    assert code == 0 and saved["completed"] == 4 and saved["goodput"] > 0
    assert (tmp_path / "run.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["--base-url", server.url, "--goodput", "latency:5"])


def test_the_command_line_writes_nothing_unless_asked_and_draws_no_bar_into_a_log(
        other, tmp_path, monkeypatch, capsys):
    server, _ = other
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(["--base-url", server.url, "--num-prompts", "3", "--input-len", "3",
                 "--output-len", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and "requests" in out      # the summary is printed
    assert list(tmp_path.rglob("*")) == []       # no results file, no plot, no folder
    assert "it/s" not in err and "\r" not in err   # captured output is no terminal: no bar


def test_against_minicb_every_request_is_measured(tiny_llama, tmp_path):
    app = build_app(tiny_llama, max_model_len=64, max_num_seqs=4)
    with ServerThread(app) as server:
        config = BenchConfig(server.url, num_prompts=6, input_len=8, output_len=6,
                             prompt_format="tokens", vocab_size=512, ignore_eos=True,
                             disable_tqdm=True)
        result = run(run_benchmark(config))
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["total_input_tokens"] == 48 and result["total_output_tokens"] == 36
    assert all(0 < ttft <= e2e for ttft, e2e in zip(result["ttfts"], result["e2els"]))
    assert app.state.engine.stats.finished["length"] == 6


def test_load_study_serves_every_scheduler_and_plots(tiny_llama, tmp_path):
    # policy knobs and prefix caching: the continuous server's only
    knobs = {"max_num_seqs": 4, "max_model_len": 64, "policy": "shortest_prompt_first",
             "step_order": "prefill_first", "enable_prefix_caching": True}
    config = StudyConfig(tiny_llama, request_rates=(math.inf,), num_prompts=4, workload="random",
                         input_len=8, output_len=5, knobs=knobs)
    rows = run_study(config)
    assert [r["scheduler"] for r in rows] == ["naive", "static", "continuous"]
    assert all(r["completed"] == 4 and r["failed"] == 0 and r["output_throughput"] > 0
               for r in rows)
    assert len(format_rows(rows).splitlines()) == 2 + len(rows)
    plot(rows, tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 0


def test_load_study_refuses_the_single_scheduler_flag(capsys):
    """`--scheduler` belongs to `serve`; the study would silently serve all three anyway."""
    from minicb.bench.load_study import main

    with pytest.raises(SystemExit) as exit_:
        main(["--scheduler", "static"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--scheduler static has no effect here" in error and "--schedulers static" in error


def test_load_study_measures_an_external_server(tiny_llama, tmp_path):
    """--base-url: the study sends its sweep to a server it did not start (here a minicb server
    started by the test, standing in for vLLM), under the given label, and the CLI writes the
    results under that label."""
    from minicb.bench.load_study import main

    app = build_app(tiny_llama, max_queue_len=None, max_num_seqs=4, max_model_len=64)
    with ServerThread(app) as server:
        config = StudyConfig(request_rates=(math.inf,), num_prompts=3, workload="random",
                             input_len=8, output_len=4, base_url=server.url, label="peer",
                             vocab_size=app.state.engine.vocab_size)
        rows = run_study(config)
        assert [r["scheduler"] for r in rows] == ["peer"]
        assert rows[0]["completed"] == 3 and rows[0]["failed"] == 0
        assert app.state.engine.stats.finished["length"] >= 3      # the requests reached it
        assert main(["--base-url", server.url, "--label", "peer", "--request-rates", "8",
                     "--num-prompts", "2", "--input-len", "8", "--output-len", "3",
                     "--vocab-size", str(app.state.engine.vocab_size),
                     "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "load-study-peer.json").read_text())
    assert [r["scheduler"] for r in record["rows"]] == ["peer"]


def test_load_study_asks_an_external_server_for_the_named_model(tiny_llama, tmp_path):
    """--model with --base-url: the requests name that model (a server can serve several) and,
    when it is a checkpoint directory (vLLM names a model by its path), the prompts' token ids
    come from its vocabulary, not the shipped model's; a model the server does not serve is
    named with the ones it does."""
    from minicb.bench.load_study import main

    small_vocab = json.loads((Path(tiny_llama) / "config.json").read_text())["vocab_size"]
    shipped_vocab = json.loads((Path(default_model_path()) / "config.json").read_text())[
        "vocab_size"]
    assert small_vocab < shipped_vocab       # else the vocabulary read would go unnoticed
    app = build_app(tiny_llama, max_queue_len=None, max_num_seqs=4, max_model_len=64)
    seen = []
    with ServerThread(app) as server:
        engine = app.state.engine
        add = engine.add_request

        def spy(prompt, *args, **kwargs):
            seen.append(prompt)
            return add(prompt, *args, **kwargs)

        engine.add_request = spy
        served = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        assert served == tiny_llama
        assert main(["--base-url", server.url, "--model", tiny_llama, "--label", "named",
                     "--request-rates", "inf", "--num-prompts", "6", "--input-len", "12",
                     "--output-len", "2", "--out-dir", str(tmp_path)]) == 0
        with pytest.raises(SystemExit, match="does not serve 'other'.*" + re.escape(tiny_llama)):
            run_study(StudyConfig(request_rates=(1.0,), num_prompts=1, base_url=server.url,
                                  model="other"))
    record = json.loads((tmp_path / "load-study-named.json").read_text())
    assert record["rows"][0]["completed"] == 6 and record["rows"][0]["failed"] == 0
    token_ids = [t for prompt in seen for t in prompt]
    assert len(seen) >= 6 and max(token_ids) < small_vocab


def test_load_study_names_a_server_that_is_not_there():
    config = StudyConfig(request_rates=(1.0,), num_prompts=1, base_url="http://127.0.0.1:9",
                         vocab_size=100)
    with pytest.raises(SystemExit, match="no OpenAI-compatible server answers"):
        run_study(config)
