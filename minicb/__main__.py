"""python -m minicb {demo, env-check, bench, serve}"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "demo": ("minicb.demo", "the terminal tour: one workload through naive, static and continuous"),
        "env-check": ("minicb.env_check", "print OK/FAIL per dependency, the device and Triton's mode"),
        "serve": ("minicb.server", "an OpenAI-compatible HTTP server"),
        "bench": (None, "benchmarks: offline | serve | kernels | load-study | memory | overhead | policies "
                        "| prefix"),
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        parser = argparse.ArgumentParser(prog="python -m minicb")
        parser.add_argument("command", choices=sorted(commands),
                            help="; ".join(f"{k}: {v[1]}" for k, v in commands.items()))
        parser.parse_args(argv[:1])
        return 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        return _bench(rest)
    module = __import__(commands[command][0], fromlist=["main"])
    return module.main(rest)


BENCHES = {
    "offline": "minicb.bench",
    "serve": "minicb.bench_serve",
    "load-study": "minicb.load_study",
    "kernels": "minicb.bench_kernels",
    "memory": "minicb.bench",
    "overhead": "minicb.bench",
    "policies": "minicb.bench_policies",
    "prefix": "minicb.bench_prefix",
}


def _bench(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m minicb bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    module = __import__(BENCHES[argv[0]], fromlist=["main"])
    if BENCHES[argv[0]] == "minicb.bench":
        return module.main(argv)          # offline / memory / overhead share one module
    return module.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
