"""minicb replicas behind vLLM's router (`python -m minicb cluster`): it starts, routes the openai
client through one URL, survives a replica's death, and stops every process it started.

These need vllm-router (a Rust binary from the package index) in .venv-router; the module's
setup installs it with pip if it is missing (about 40 s on 2 cores, once), so the tests run in
`make test` rather than skip.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from minicb import default_model_path
from minicb.bench.routing_trace import TraceConfig, through_router
from minicb.serving import cluster as cluster_module
from minicb.serving.cluster import ROUTER_SPECS, Cluster, core_sets, scrape
from minicb.serving.server import ServerThread, build_app

REPO = Path(__file__).resolve().parents[2]
SERVE_ARGS = ["--max-num-seqs", "4", "--max-model-len", "256", "--enable-prefix-caching"]


def _installed_router(kind: str) -> str:
    """The router's executable, installed with pip into its environment if missing."""
    executable = cluster_module.router_executable(kind)
    if executable is None:
        spec, venv = ROUTER_SPECS[kind], REPO / cluster_module.ROUTERS[kind][3]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", spec],
                                 capture_output=True, text=True)
        assert install.returncode == 0, f"could not install {spec}: {install.stderr[-800:]}"
        print(f"installed {spec} in {time.perf_counter() - started:.0f} s")
        executable = cluster_module.router_executable(kind)
    assert executable is not None
    return executable


@pytest.fixture(scope="module")
def router() -> str:
    return _installed_router("vllm")


def _served(url: str, key: str | None = None) -> float:
    return sum(v for k, v in scrape(url, key).items()
               if k.startswith("minicb_request_success_total"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie has exited; only its parent's wait is missing
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" in status.read_text()


def test_core_sets_split_the_cores_and_share_them_round_robin_when_short():
    assert core_sets(2, [0, 1]) == [[0], [1]]
    assert core_sets(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert core_sets(1, [0, 1]) == [[0]] or core_sets(1, [0, 1]) == [[0, 1]]
    assert core_sets(3, [0, 1]) == [[0], [1], [0]]


@pytest.mark.slow   # replicas and a router as processes (so are the marked tests below):
#                     make test runs them, make test-fast does not
def test_the_cluster_routes_the_openai_client_over_both_replicas_and_stops_clean(router):
    """With an API key: the replicas get it, the router passes each client's on, and a client
    without it is refused through the router as by a replica. Then a replica dies: the router
    stops sending it requests, and the cluster still stops clean."""
    key = "cluster-test-key"
    auth = {"Authorization": f"Bearer {key}"}
    with Cluster(replicas=2, policy="round_robin", serve_args=SERVE_ARGS, router=router,
                 api_keys=[key]) as c:
        assert c.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=c.url + "/v1", api_key=key, max_retries=0)
        direct = httpx.post(c.replica_urls[0] + "/v1/completions", timeout=60, json={
            "model": "minicb", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0},
            headers=auth)
        for url in (c.url, c.replica_urls[1]):
            keyless = openai.OpenAI(base_url=url + "/v1", api_key="unsent", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                keyless.completions.create(model="minicb", prompt="hi", max_tokens=2,
                                           extra_headers={"Authorization": openai.omit})
        for _ in range(4):
            routed = client.completions.create(model="minicb", prompt="def add(a, b):",
                                               max_tokens=8, temperature=0)
            assert routed.choices[0].text == direct.json()["choices"][0]["text"]
        chat = client.chat.completions.create(
            model="minicb", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.choices[0].message.content is not None
        streamed = client.completions.create(model="minicb", prompt="def add(a, b):",
                                             max_tokens=8, temperature=0, stream=True)
        assert "".join(x.choices[0].text for x in streamed if x.choices) \
            == direct.json()["choices"][0]["text"]
        served = [_served(url, key) for url in c.replica_urls]
        assert sum(served) == 7 and min(served) >= 2, served     # round robin used both
        _a_replica_dies(c, auth, key)
        pids = c.pids
    assert all(_gone(pid) for pid in pids), "a process of the cluster is still running"


def _a_replica_dies(c: Cluster, auth: dict[str, str], key: str) -> None:
    """Replica 1 killed: the clients see only 5xx until ten requests in a row succeed through
    the survivor, and the router's health checks mark the dead one (its /health a 503 naming
    it) while it keeps serving."""
    body = {"model": "minicb", "prompt": "def add(a, b):", "max_tokens": 4}
    before = _served(c.replica_urls[0], key)
    c.kill_replica(1)
    killed = time.monotonic()
    statuses = []
    while statuses[-10:] != [200] * 10:
        assert time.monotonic() - killed < 60, f"no recovery in a minute: {statuses}"
        try:
            statuses.append(httpx.post(c.url + "/v1/completions", json=body, headers=auth,
                                       timeout=30).status_code)
        except httpx.HTTPError as error:
            statuses.append(type(error).__name__)
    print(f"after the kill: {statuses} ({time.monotonic() - killed:.1f} s)")
    assert all(s == 200 or isinstance(s, int) and s >= 500 for s in statuses), statuses
    survivor = c.replica_urls[0]
    assert _served(survivor, key) - before >= 10
    deadline = time.monotonic() + 30
    while True:
        workers = httpx.get(c.url + "/workers", headers=auth, timeout=10).json()["workers"]
        health = {w["url"]: w["is_healthy"] for w in workers}
        if health[c.replica_urls[1]] is False:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.5)
    assert health[survivor] is True
    router_health = httpx.get(c.url + "/health", timeout=10)
    assert router_health.status_code == 503 and c.replica_urls[1] in router_health.text


@pytest.mark.slow   # installs sglang-router into .venv-router-sglang if missing (once, ~40 s)
def test_sglang_router_checks_clients_itself_with_the_key_kept_off_command_lines():
    """sglang-router has options to check clients and guard its worker management: the cluster
    gives it the key there, through its environment; a keyless client is refused by the router
    itself, and the key shows on no command line."""
    key = "sglang-test-key"
    app = build_app(default_model_path(), served_model_name="minicb", max_model_len=128,
                    max_num_seqs=2, api_keys=[key])
    with ServerThread(app) as replica, Cluster(worker_urls=[replica.url], router_kind="sglang",
                                               router=_installed_router("sglang"),
                                               api_keys=[key]) as c:
        client = openai.OpenAI(base_url=c.url + "/v1", api_key=key, max_retries=0)
        assert client.completions.create(model="minicb", prompt="hi", max_tokens=2).choices
        assert client.chat.completions.create(
            model="minicb", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
        refused = httpx.post(c.url + "/v1/completions", json={"model": "minicb", "prompt": "hi"})
        assert refused.status_code == 401 and "invalid_api_key" not in refused.text  # the router's
        assert httpx.get(c.url + "/workers").status_code == 401
        assert httpx.get(c.url + "/workers", headers={"Authorization": f"Bearer {key}"}).is_success
        assert not any(key in _cmdline(p) for p in Path("/proc").iterdir() if p.name.isdigit())


LAUNCH_KEYS = "launch-key-one,launch-key-two"      # MINICB_API_KEY: two keys


def _launch(router: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`python -m minicb cluster` in a subprocess, its replicas given two keys through
    MINICB_API_KEY: the launcher, its URL, its replicas' URLs."""
    env = {**os.environ, "MINICB_ROUTER": router, "MINICB_API_KEY": LAUNCH_KEYS}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "minicb", "cluster", "--replicas", "2", "--policy", "power_of_two",
         "--port", "0", "--", *SERVE_ARGS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env)
    lines = []
    deadline = time.monotonic() + 300
    while not (lines and lines[-1].startswith("http://")):
        assert time.monotonic() < deadline and launcher.poll() is None, "".join(lines)
        lines.append(launcher.stdout.readline())
    url = lines[-1].strip()
    replicas = [line.split(": ")[1].split()[0] for line in lines if line.startswith("replica")]
    assert len(replicas) == 2 and url.startswith("http://127.0.0.1:")
    return launcher, url, replicas


def _ports(url: str, replicas: list[str]) -> list[str]:
    return [u.rsplit(":", 1)[1] for u in replicas] + [url.split(":")[2].split("/")[0]]


def _closed(ports: list[str], within: float) -> bool:
    """Whether every port stops answering within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(_refuses(port) for port in ports):
            return True
        time.sleep(0.5)
    return False


def _refuses(port: str) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.ConnectError:
        return True
    return False


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_process_it_started(router):
    launcher, url, replicas = _launch(router)
    for key in LAUNCH_KEYS.split(","):
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        assert client.completions.create(model="minicb", prompt="hi", max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="not-a-key", max_retries=0).completions.create(
            model="minicb", prompt="hi", max_tokens=2)
    ports = _ports(url, replicas)
    # the keys travel in the replicas' environment, never on a command line (`ps` shows those)
    everyone = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    assert sum(any(f"--port {port}" in _cmdline(p) for port in ports) for p in everyone) >= 2
    assert not any("launch-key" in _cmdline(p) for p in everyone)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0
    for port in ports:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    # no process with the cluster's ports on its command line is left
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and any(
        f"--port {port}" in _cmdline(p) or f":{port}" in _cmdline(p) for port in ports)]
    assert not left, [_cmdline(p) for p in left]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_a_launcher_killed_outright_takes_its_replicas_and_router_with_it(router):
    launcher, url, replicas = _launch(router)
    launcher.kill()                      # SIGKILL: no handler runs, the children must notice
    launcher.wait(10)
    assert _closed(_ports(url, replicas), within=30), "a replica or the router outlived it"


def test_the_prefix_heavy_workload_repeats_each_chats_last_turn_and_is_seeded():
    from minicb.serving.loadgen import PROMPT_WORDS
    from minicb.sim.workload import get_workload, prefix_texts

    workload = get_workload("prefix-heavy", n=24, seed=3, systems=2, turns=3)
    prompts = prefix_texts(workload, PROMPT_WORDS)
    assert prompts == prefix_texts(get_workload("prefix-heavy", n=24, seed=3, systems=2, turns=3),
                                   PROMPT_WORDS)
    assert prompts != prefix_texts(get_workload("prefix-heavy", n=24, seed=4, systems=2, turns=3),
                                   PROMPT_WORDS)
    last: dict[int, tuple[int, str]] = {}
    systems = {}
    for (system, chat, turn), prompt in zip(workload.extra["turns"], prompts):
        if chat in last:
            previous_turn, previous = last[chat]
            assert turn == previous_turn + 1          # a chat's turns go out in order
            assert prompt.startswith(previous.removesuffix("\nassistant:"))
        else:
            assert turn == 1
        head = prompt.split("\nuser:")[0]
        assert systems.setdefault(system, head) == head      # one system prompt per system
        last[chat] = (turn, prompt)
    assert len(systems) == 2 and len(last) == 8


@pytest.mark.slow
def test_vllm_routers_trace_matches_the_record_chapter_09_reads(router):
    """Chapter 09 proves its proxy against vLLM's router through a committed record of the same
    trace (benchmarks/results/routing-trace.json); here the router runs that trace live: the same
    answers, the same hit rates, and cache_aware above round_robin."""
    recorded = json.loads((REPO / "benchmarks/results/routing-trace.json").read_text())
    config = TraceConfig(**recorded["config"])
    assert config == TraceConfig(), "the record is of another trace: python -m minicb bench " \
        "routing --study trace"
    expected = {run["policy"]: run for run in recorded["runs"]}
    live = {policy: through_router(config, policy, router)
            for policy in ("round_robin", "cache_aware")}
    for policy, run in live.items():
        assert run["answers"] == expected[policy]["answers"], policy
        assert run["hit_rate"] == pytest.approx(expected[policy]["hit_rate"]), policy
        assert sum(r["served"] for r in run["per_replica"]) == len(run["answers"])
    assert live["cache_aware"]["hit_rate"] > live["round_robin"]["hit_rate"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_make_router_setup_installs_the_release_the_launcher_names(kind):
    """The routers' pins live in cluster.py alone; the Makefile reads them from there."""
    from minicb.serving.cluster import ROUTER_SPECS, ROUTERS

    dry_run = subprocess.run(["make", "-n", "router-setup", f"ROUTER={kind}"],
                             cwd=cluster_module.REPO, capture_output=True, text=True, check=True)
    # uv installs the pinned release, and pip the same one where uv cannot
    spec = re.escape(ROUTER_SPECS[kind])
    assert re.search(rf"uv pip install --quiet [^;|]*{spec}[ ;]", dry_run.stdout), dry_run.stdout
    assert re.search(rf'\|\| {{ echo "[^"]*"; \S+ -m pip install --quiet [^;|]*{spec}',
                     dry_run.stdout), dry_run.stdout
    assert ROUTERS[kind][3] in dry_run.stdout
