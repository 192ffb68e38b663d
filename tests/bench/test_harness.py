"""The benchmarks' harness: the order repeats run systems in, the spread and the one verdict rule,
the flags spelled alike, results written before they are drawn, a server's port checked."""

from __future__ import annotations

import json
import socket

import pytest

from minicb.bench.harness import (
    add_flags,
    alternate,
    bench_parser,
    reading,
    server_process,
    spread,
    turn_order,
    verdict,
    write_record,
)


def test_alternate_takes_every_system_in_turn_each_repeat():
    assert list(alternate(2, "AB")) == [(0, "A"), (0, "B"), (1, "A"), (1, "B")]
    assert [s for _, s in alternate(3, "ABC", rotate=True)] == list("ABCBCACAB")
    assert turn_order((False, True), 1) == [True, False]


def test_spread_and_the_verdict_follow_the_repeats_rule():
    assert spread([330, 300, 310]) == {"median": 310, "min": 300, "max": 330}
    assert verdict([1.9, 2.0, 2.1, 1.8, 2.2]) == "higher"
    assert verdict([0.5, 0.52, 0.55, 0.6, 0.51], "faster", "slower") == "slower"
    # one repeat against the others, or fewer than five: no direction
    assert verdict([1.2, 1.5, 1.8, 1.3, 0.9]) == "no direction"
    assert verdict([3.0, 3.1, 3.2, 2.9]) == "no direction"
    assert reading([1.2, 1.5, 1.8, 1.3, 1.1]) == ("higher in every one of 5 alternated repeats "
                                                  "(at least 1.10×); the size, 1.30× "
                                                  "(1.10–1.80), is within the spread")


def test_flags_are_spelled_alike_with_a_benchmarks_own_defaults():
    parser = bench_parser("example", "The first line.\n\nMore.")
    add_flags(parser, "model", "out_dir", repeats=7, threads=dict(default=1, help="one"))
    args = parser.parse_args([])
    assert (args.model, args.repeats, args.threads) == (None, 7, 1)
    assert args.out_dir == "benchmarks/results"
    assert parser.description == "The first line." and parser.prog.endswith("bench example")
    assert parser.parse_args(["--repeats", "2", "--out-dir", "x"]).repeats == 2
    with pytest.raises(ValueError, match="no shared flag 'batch_size'"):
        add_flags(parser, "batch_size")


def test_a_failed_drawing_never_loses_the_record(tmp_path):
    def broken(record):
        raise RuntimeError("the plot failed")

    with pytest.raises(RuntimeError, match="the plot failed"):
        write_record(tmp_path, "r", {"rows": [1, 2], "path": tmp_path}, broken)
    assert json.loads((tmp_path / "r.json").read_text()) == {"rows": [1, 2], "path": str(tmp_path)}


def test_a_server_is_not_started_on_a_port_another_holds(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} is already in use"):
            with server_process("x", ["false"], port, log_dir=tmp_path):
                pass
    assert not (tmp_path / "x.log").exists()      # refused before anything started
