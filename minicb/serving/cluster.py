"""Several `minicb serve` replicas behind a real router, as production runs an engine that one
process cannot carry.

    python -m minicb cluster --replicas 2 --policy cache_aware -- --enable-prefix-caching
    make cluster

starts N replicas (each pinned to its own share of the cores, with as many model threads as
cores), waits until every one answers /health, starts vLLM's router (`vllm-router`, a Rust
process from the package index, installed by `make router-setup` into .venv-router) in front of
them, waits until it answers, and prints one URL. Clients (the openai package, `minicb bench
serve`, guidellm) talk to that URL as to one server. Ctrl-C or SIGTERM stops the router and then
every replica; nothing it started is left running.

Everything binds 127.0.0.1 unless --host says otherwise; the router's own Prometheus endpoint
gets a free port of its own, so two clusters on one machine do not collide. Arguments after `--`
go to every replica's `minicb serve` (engine knobs: --enable-prefix-caching, --max-num-seqs ...).

API keys (`--api-key`, or MINICB_API_KEY as for `minicb serve`) go to every replica through its
environment (not its command line, which `ps` shows to everyone). The router forwards each
client's Authorization header, so the replica that serves a request checks its key, and a
client without one gets the replica's 401 through the router. vllm-router has no option to
check clients itself (its --api-key is the key it would send to workers, and 0.1.17 does not
send it with its load probes), so it is not given the key; its own endpoints (worker
management, its Prometheus port) answer whoever reaches its port: keep it on 127.0.0.1, or
behind a proxy that checks keys. Under a key, power_of_two's load probes (GET /get_load, which
needs the key like every route but /health) are refused, so that policy routes without loads.
sglang-router (--router-kind sglang) does check clients: it gets the key as --api-key (one key;
with several, the replicas alone check) and as --control-plane-api-keys for its worker
management, through its environment (hidden_arguments), never its command line.

The routing policies are the router's own (`--policy`):
  round_robin     each request to the next replica in turn
  power_of_two    pick two replicas at random, send to the less loaded (GET /get_load on each)
  cache_aware     send a request where a prefix of its text went before (a radix tree of the
                  text each replica has seen), unless the load is too uneven, then the least
                  loaded replica
  random, consistent_hash  as named
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from minicb.serving.auth import (
    ENV_VAR,
    bearer,
    client_key,
    exposure_warning,
    is_loopback,
    keys_from,
)

# the routers' pinned releases (`make router-setup` reads them from here: one place to bump)
ROUTER_SPECS = {"vllm": "vllm-router==0.1.17",
                "sglang": "sglang-router==0.3.2"}
ROUTER_SPEC = ROUTER_SPECS["vllm"]
ROUTER_VENV = ".venv-router"
# the routers this launcher can start: executable, its subcommand, its name for "warning", and
# where `make router-setup` (ROUTER=sglang) installs it
ROUTERS = {"vllm": ("vllm-router", [], "warning", ROUTER_VENV),
           "sglang": ("sglang-router", ["launch"], "warn", ".venv-router-sglang")}
POLICIES = ("round_robin", "power_of_two", "cache_aware", "random", "consistent_hash")
REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether `port` can be bound now: a server already there would answer in a new one's place."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def router_executable(kind: str = "vllm") -> str | None:
    """The router's executable: $MINICB_ROUTER, else the repository's environment for it (made
    by `make router-setup`), else on PATH."""
    name, _, _, venv = ROUTERS[kind]
    candidates = [os.environ.get("MINICB_ROUTER"), str(REPO / venv / "bin" / name),
                  shutil.which(name)]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def core_sets(replicas: int, cores: list[int] | None = None) -> list[list[int]]:
    """The cores each replica is pinned to: an even split when there are enough, else each
    replica gets one core, shared round-robin."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    if replicas >= len(cores):
        return [[cores[i % len(cores)]] for i in range(replicas)]
    share = len(cores) // replicas
    return [cores[i * share:(i + 1) * share] for i in range(replicas)]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    url: str
    log: Path | None = None

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Cluster:
    """N replicas and a router, as a context manager:

        with Cluster(replicas=2, policy="cache_aware", serve_args=["--enable-prefix-caching"]) as c:
            client = openai.OpenAI(base_url=c.url + "/v1", api_key="none")
    """
    replicas: int = 2
    policy: str = "round_robin"
    host: str = "127.0.0.1"
    port: int = 0                         # the router's; 0 picks a free one
    serve_args: list[str] = field(default_factory=list)
    served_model_name: str = "minicb"
    router: str | None = None             # the router's executable (default: router_executable)
    router_kind: str = "vllm"             # "vllm" (vllm-router) or "sglang" (sglang-router)
    router_args: list[str] = field(default_factory=list)
    health_check_interval: int = 1        # seconds between the router's health checks
    pin: bool = True                      # pin each replica to its own cores
    log_dir: Path | None = None           # each process's output, else discarded
    startup_timeout: float = 300.0
    # replicas already running elsewhere (their URLs): the router alone is started, in front of
    # them, and `replicas` is their number
    worker_urls: list[str] | None = None
    # the replicas' API keys, put in their environment as MINICB_API_KEY (exactly these: a key
    # in this process's environment is not passed on unless listed; the CLI lists it)
    api_keys: list[str] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list, init=False)
    router_process: Process | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.worker_urls is not None:
            self.replicas = len(self.worker_urls)
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1 (got {self.replicas}).")
        if self.router_kind not in ROUTERS:
            raise ValueError(f"unknown router {self.router_kind!r}; choose one of {list(ROUTERS)}.")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {POLICIES}.")
        if self.policy == "power_of_two" and self.replicas < 2:
            raise ValueError("power_of_two compares two replicas; start at least 2 (--replicas 2)"
                             " or choose another policy.")

    @property
    def url(self) -> str:
        return self.router_process.url if self.router_process else ""

    @property
    def replica_urls(self) -> list[str]:
        return list(self.worker_urls) if self.worker_urls is not None else \
            [p.url for p in self.processes]

    def _spawn(self, name: str, command: list[str], url: str, cores: list[int] | None = None,
               env: dict | None = None) -> Process:
        log = Path(self.log_dir) / f"{name}.log" if self.log_dir is not None else None
        return spawn(name, command, url, cores, env, log)

    def start(self) -> Cluster:
        router = self.router or router_executable(self.router_kind)
        if router is None:
            name, _, _, venv = ROUTERS[self.router_kind]
            make = "make router-setup" + (" ROUTER=sglang" if self.router_kind == "sglang" else "")
            raise RuntimeError(f"{name} is not installed: run `{make}` (it installs "
                               f"{ROUTER_SPECS[self.router_kind]} into {venv}), or set "
                               "MINICB_ROUTER to its executable.")
        try:
            if self.worker_urls is None:
                self._start_replicas()
            self._start_router(router)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_env(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
        return env | ({ENV_VAR: ",".join(self.api_keys)} if self.api_keys else {})

    def _start_replicas(self) -> None:
        pinned = core_sets(self.replicas) if self.pin else [None] * self.replicas
        env = self._replica_env()
        for index, cores in enumerate(pinned):
            port = free_port()
            command = [sys.executable, "-m", "minicb", "serve", "--host", "127.0.0.1", "--port",
                       str(port), "--served-model-name", self.served_model_name,
                       "--log-level", "warning"]
            if cores and "--cpu-threads" not in self.serve_args:
                command += ["--cpu-threads", str(len(cores))]
            self.processes.append(self._spawn(f"replica-{index}", command + self.serve_args,
                                              f"http://127.0.0.1:{port}", cores, env))
        deadline = time.monotonic() + self.startup_timeout
        for process in self.processes:
            wait_healthy(process, "/health", deadline)

    def _start_router(self, router: str) -> None:
        port = self.port or free_port(self.host)
        if not port_is_free(port, self.host):   # a router already there would answer for this one
            raise RuntimeError(f"{self.host}:{port} is taken; give the router another --port.")
        _, subcommand, warning, _ = ROUTERS[self.router_kind]
        command = [router, *subcommand, "--host", self.host, "--port", str(port),
                   "--policy", self.policy,
                   "--worker-urls", *self.replica_urls,
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                   "--health-check-interval-secs", str(self.health_check_interval),
                   "--log-level", warning, *self.router_args]
        command, env = hidden_arguments(command, self._router_key_args())
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.router_process = self._spawn("router", command, f"http://{host}:{port}", env=env)
        wait_healthy(self.router_process, "/v1/models", time.monotonic() + 60,
                     key=self.api_keys[0] if self.api_keys else None)

    def _router_key_args(self) -> list[str]:
        """The router's own key options: sglang-router checks clients against --api-key (one
        key; with several, the replicas alone check) and guards its worker management with
        --control-plane-api-keys. vllm-router has no client check (its --api-key is what it
        would send to workers, and it does not with its load probes): none."""
        if self.router_kind != "sglang" or not self.api_keys:
            return []
        own = ["--api-key", self.api_keys[0]] if len(self.api_keys) == 1 else []
        return own + ["--control-plane-api-keys",
                      *(f"key{i}:minicb:admin:{key}" for i, key in enumerate(self.api_keys))]

    def kill_replica(self, index: int, sig: int = signal.SIGKILL) -> None:
        """A replica dies (SIGKILL: no goodbye to its clients or the router)."""
        self.processes[index].popen.send_signal(sig)
        self.processes[index].popen.wait(30)

    def stop(self, timeout: float = 20.0) -> None:
        """The router first (no new requests reach a stopping replica), then every replica."""
        stop_processes([self.router_process] if self.router_process else [], timeout)
        stop_processes(self.processes, timeout)

    @property
    def pids(self) -> list[int]:
        everyone = self.processes + ([self.router_process] if self.router_process else [])
        return [p.popen.pid for p in everyone]

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn(name: str, command: list[str], url: str, cores: list[int] | None = None,
          env: dict | None = None, log: Path | None = None) -> Process:
    """Start `command` (a server that will answer at `url`) in a session of its own, pinned to
    `cores`, its output appended to `log` (else discarded). The session of its own: a Ctrl-C in
    the terminal reaches the launcher only, which then stops what it started in order."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab") if log else subprocess.DEVNULL

    def preexec() -> None:
        _die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                             preexec_fn=preexec, start_new_session=True)
    if log:
        out.close()
    return Process(name, popen, url, log)


# runs a router's Python entry script with arguments appended from the environment, so that
# secrets never appear on a command line (`ps` shows those to every user of the machine)
_BOOTSTRAP = ("import json, os, runpy, sys; sys.argv = sys.argv[1:] + json.loads("
              "os.environ.pop('MINICB_HIDDEN_ARGS')); runpy.run_path(sys.argv[0], "
              "run_name='__main__')")


def hidden_arguments(command: list[str], secret: list[str]) -> tuple[list[str], dict | None]:
    """`command` with `secret` arguments added where no command line shows them: through the
    environment, to a Python entry script (a router installed by pip) run by a bootstrap. An
    executable that is not a Python script cannot take them: ValueError."""
    if not secret:
        return command, None
    with open(command[0], "rb") as script:
        shebang = script.readline().decode(errors="replace")
    if not (shebang.startswith("#!") and "python" in shebang):
        raise ValueError(f"{command[0]} is not a Python entry script, so it cannot be given a "
                         "key without showing it on its command line; use the router that "
                         "`make router-setup` installs.")
    interpreter = shebang[2:].split()[0]
    return ([interpreter, "-c", _BOOTSTRAP, *command],
            {**os.environ, "MINICB_HIDDEN_ARGS": json.dumps(secret)})


def stop_processes(processes: list[Process], timeout: float = 20.0) -> None:
    """SIGTERM to every one, then SIGKILL for any still running after `timeout` seconds."""
    for process in processes:
        if process.alive:
            process.popen.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(10)


def _die_with_parent() -> None:
    """Linux: a child gets SIGTERM when the process that started it dies, even by SIGKILL, so a
    launcher killed outright leaves no replica or router behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_healthy(process: Process, path: str, deadline: float,
                 key: str | None = None) -> None:
    """Poll `path` until it answers 200, sending `key` (default: MINICB_API_KEY's); fail with the
    process's log if it exits or times out."""
    headers = bearer(key or client_key())
    while True:
        if not process.alive:
            tail = process.log.read_text()[-2000:] if process.log and process.log.exists() else ""
            raise RuntimeError(f"{process.name} exited with code {process.popen.returncode} "
                               f"before it was ready.\n{tail}")
        try:
            if httpx.get(process.url + path, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} did not answer {path} at {process.url} in time.")
        time.sleep(0.25)


def scrape(url: str, key: str | None = None) -> dict[str, float]:
    """A replica's /metrics as {sample name with labels: value}, sending `key` (default:
    MINICB_API_KEY's; /metrics needs the key like every route but /health)."""
    samples = {}
    response = httpx.get(url + "/metrics", timeout=10, headers=bearer(key or client_key()))
    response.raise_for_status()
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minicb cluster", description=__doc__.split("\n\n")[0],
        epilog="arguments after -- go to every replica's `minicb serve`")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware",
                        help="the router's routing policy (default cache_aware)")
    parser.add_argument("--host", default="127.0.0.1", help="where the router listens")
    parser.add_argument("--port", type=int, default=8000, help="the router's port")
    parser.add_argument("--served-model-name", default="minicb")
    parser.add_argument("--router-kind", choices=list(ROUTERS), default="vllm",
                        help="vllm (vllm-router, default) or sglang (sglang-router)")
    parser.add_argument("--router", default=None,
                        help="the router's executable (default: the one `make router-setup` "
                             "installed, or PATH's)")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave the replicas unpinned (the OS places their threads)")
    parser.add_argument("--log-dir", default=None, help="each process's output goes here")
    parser.add_argument("--api-key", action="append", default=None, metavar="KEY",
                        help="every replica requires it (several allowed); clients send it "
                             f"through the router. {ENV_VAR} (comma-separated) is better: a "
                             "command line shows in `ps`")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    args = parser.parse_args(own)
    keys = keys_from(args.api_key)
    try:
        cluster = Cluster(args.replicas, args.policy, args.host, args.port, serve_args,
                          args.served_model_name, args.router, router_kind=args.router_kind,
                          pin=not args.no_pin,
                          log_dir=Path(args.log_dir) if args.log_dir else None, api_keys=keys)
    except ValueError as error:
        parser.error(str(error))
    warning = exposure_warning(args.host, keys) or (None if is_loopback(args.host) else (
        f"warning: the router listens on {args.host}; the replicas check the key, but the "
        "router's own endpoints (/workers, worker management) check none."))
    if warning:
        print(warning, file=sys.stderr, flush=True)

    def stop_on(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on)
    try:
        cluster.start()
        for process, cores in zip(cluster.processes, core_sets(args.replicas)):
            where = f" on cores {cores}" if not args.no_pin else ""
            print(f"replica {process.name}: {process.url}{where}", flush=True)
        name = ROUTERS[args.router_kind][0]
        print(f"router ({name}, policy {args.policy}) ready; one URL for clients:", flush=True)
        print(f"{cluster.url}/v1", flush=True)
        while cluster.router_process.alive:
            time.sleep(0.5)
        print("the router exited; stopping the replicas", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        print("cluster stopped: router and replicas", file=sys.stderr, flush=True)
