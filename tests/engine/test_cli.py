"""The command line: every command and benchmark answers --help, and the engine flags come from
EngineConfig (one default, one help text per knob)."""

from __future__ import annotations

import argparse

import pytest

import minicb.serving.server
from minicb.__main__ import COMMANDS, main
from minicb.bench import BENCHMARKS
from minicb.config import EngineConfig, cli_fields


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0, f"{' '.join(argv)} --help exited with {exit_.value.code}"
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [name for name in COMMANDS if name != "bench"])
def test_every_command_answers_help(command, capsys):
    assert f"python -m minicb {command}" in _help([command], capsys)


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_every_benchmark_answers_help(benchmark, capsys):
    assert f"python -m minicb bench {benchmark}" in _help(["bench", benchmark], capsys)


def test_an_unknown_command_or_benchmark_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serv"])
    assert exit_.value.code == 2 and "invalid choice: 'serv'" in capsys.readouterr().err
    assert main(["bench", "ofline"]) == 2
    assert "offline" in capsys.readouterr().err


def test_engine_flags_carry_the_configs_defaults_and_help():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    knobs = EngineConfig.knobs_from_cli(parser.parse_args([]))
    assert EngineConfig(**knobs) == EngineConfig()
    text = parser.format_help()
    for spec in cli_fields():
        assert "--" + spec.name.replace("_", "-") in text
        assert spec.metadata["help"].split()[0] in text


def test_a_command_may_set_its_own_default_and_take_only_some_knobs():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser, only=("max_num_seqs", "enable_prefix_caching"),
                              defaults={"max_num_seqs": 5})
    args = parser.parse_args(["--enable-prefix-caching"])
    assert EngineConfig.knobs_from_cli(args, only=("max_num_seqs", "enable_prefix_caching")) == \
        {"max_num_seqs": 5, "enable_prefix_caching": True}
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduler", "static"])


def test_serve_builds_its_engine_from_the_flags(monkeypatch):
    served = []
    monkeypatch.setattr(minicb.serving.server.uvicorn, "run", lambda app,
                        **options: served.append(options))
    assert main(["serve", "--max-model-len", "256", "--max-num-seqs", "3", "--port", "8123"]) == 0
    assert served == [{"host": "127.0.0.1", "port": 8123, "log_level": "info",
                       "timeout_keep_alive": 5, "limit_concurrency": 1024,
                       "http": minicb.serving.server.DeadlineH11Protocol}]


def test_env_check_runs_and_gives_a_verdict(capsys):
    code = main(["env-check"])
    out = capsys.readouterr().out
    assert "verdict:" in out.splitlines()[-1]
    assert code == (0 if out.splitlines()[-1].startswith("OK") else 1)


def test_demo_shows_progress_and_deterministic_evidence_beside_ratios_to_naive(capsys):
    assert main(["demo", "--num-prompts", "8", "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "load average" in out.splitlines()[0]
    for number, system in enumerate(
        ["naive+paged", "static+paged", "continuous+contiguous", "continuous+paged"], 1):
        assert f"[{number}/4] {system}" in out, f"no progress line for {system}"
    table = {line.split()[0]: line.split() for line in out.splitlines() if line.split()
             and line.split()[0] in ("naive+paged", "static+paged", "continuous+paged")}
    steps = {name: int(row[1]) for name, row in table.items()}
    assert steps["naive+paged"] > steps["static+paged"] > steps["continuous+paged"], steps
    assert table["naive+paged"][6] == "1.0x", "naive serving is the baseline"
    assert all(row[-1] == "True" for row in table.values()), ("every system must give the same "
                                                              "tokens")


def test_the_readme_quick_start_prints_labelled_results():
    import contextlib
    import io
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = re.search(r"```python\n(from minicb import LLM, SamplingParams\n.*?)```", readme,
                        re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "README.md", "exec"), {})
    lines = printed.getvalue().strip().splitlines()
    assert re.fullmatch(r"time to first token: \d+\.\d\d s", lines[-1]), lines[-1]
    assert len(lines) > 1 and lines[0].strip(), "the generated text comes first"
