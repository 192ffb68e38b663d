"""python -m minicb COMMAND [options]: one table of commands."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with main(argv), one line of help)
COMMANDS = {
    "serve": ("minicb.serving.server", "an OpenAI-compatible HTTP server"),
    "cluster": ("minicb.serving.cluster", "N serve replicas behind vllm-router, one URL"),
    "bench": ("minicb.bench",
              "benchmarks: offline, serve, load-study, kernels, memory, overhead, policies, "
              "prefix, lm-eval, structured, ..."),
    "demo": ("minicb.tools.demo",
             "the terminal tour: one workload through naive, static and continuous"),
    "env-check": ("minicb.tools.env_check",
                  "print OK/FAIL per dependency, the device and Triton's mode"),
    "grade": ("minicb.tools.grade",
              "grade a student's exercises/ (folder or zip); Gradescope JSON"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = argparse.ArgumentParser(prog="python -m minicb")
        parser.add_argument(
            "command", choices=list(COMMANDS),
            help="; ".join(f"{name}: {line}" for name, (_, line) in COMMANDS.items()))
        parser.parse_args(argv[:1])
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
