"""Several GPUs in virtual time: co-located serving against prefill/decode disaggregation.

Each instance (one GPU, or one tensor-parallel group) is the REAL scheduler and KV manager on a
cost model, with its own clock: an engine core (minicb.engine.core.EngineCore) on a cost-model
executor, exactly as `minicb.sim.simulate` runs one. A cluster is pools of them:

* co-located: every instance prefills and decodes its own requests (continuous batching,
  chunked prefill), the arrangement of chapters 03-07;
* disaggregated (DistServe, Zhong et al., OSDI 2024): prefill instances compute each prompt and
  its first token, then the request's KV cache crosses a link to a decode instance, which
  generates the rest. A prefill step never stalls a decode batch, and each pool can be sized on
  its own; the price is the transfer and a split of the GPUs between two jobs.

Requests go to the instance of the pool with the fewest unfinished requests (ties: the lowest
index). Each prefill instance sends its KV caches one at a time over its own link; a decode
instance admits an arrived cache when it has a free slot and the blocks for it, after any request
of its own waiting to be recomputed. The time a request's first token takes is its prefill
instance's; the transfer and the wait for a decode slot land in its time per output token, as in
DistServe. Simplifications: a sent KV cache frees its prefill blocks at once (DistServe's decode
instances pull it, so it lingers there), and links do not share bandwidth with each other.

Goodput follows DistServe: the share of requests that meet both the TTFT and the TPOT target
(SLO attainment), and the highest request rate per GPU at which that share stays above a goal.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from minicb.config import EngineConfig
from minicb.engine.core import EngineCore, InFlightStep
from minicb.kv import make_kv_manager
from minicb.metrics import RequestMetrics, meets_slo
from minicb.params import SamplingParams
from minicb.request import Request
from minicb.scheduler import make_scheduler
from minicb.sim.cost_model import CostModel, CostModelExecutor
from minicb.sim.parallel import Link, ModelShape, kv_transfer_time
from minicb.sim.workload import Workload, poisson_arrivals


@dataclass
class Pool:
    """`count` alike instances: each `gpus` GPUs (a TP group) costing `cost` per step, with the
    engine knobs `knobs` (EngineConfig's: max_num_seqs, max_num_batched_tokens,
    num_kv_blocks...)."""

    count: int
    cost: CostModel
    knobs: dict = field(default_factory=dict)
    gpus: int = 1


class Instance:
    """One GPU (or TP group): an engine core (its scheduler, KV pool and cost-model executor, with
    its own clock). `role` is "colocated", "prefill" (serves each request's prompt and first
    token: the cluster hands it requests capped at one token, as vLLM's disaggregation proxy does)
    or "decode" (starts from arrived KV)."""

    def __init__(self, name: str, role: str, pool: Pool, max_model_len: int):
        self.name, self.role, self.cost, self.gpus = name, role, pool.cost, pool.gpus
        self.config = EngineConfig(**{"max_model_len": max_model_len, **pool.knobs}).resolve(
            max_model_len)
        self.kv = make_kv_manager(self.config.kv_cache, self.config.num_kv_blocks,
                                  self.config.block_size, self.config.max_model_len,
                                  self.config.enable_prefix_caching)
        self.executor = CostModelExecutor(pool.cost)
        self.scheduler = make_scheduler(self.config, self.kv, self.executor.clock)
        self.core = EngineCore(self.scheduler, self.executor)
        # KV here, waiting for a decode slot: (request, the settings it goes on under)
        self.arrived: deque[tuple[Request, SamplingParams]] = deque()
        self.in_flight: InFlightStep | None = None
        self.busy_time = 0.0
        # (start, end, prompt tokens, decode rows) of every step, for pictures
        self.steps: list[tuple[float, float, int, int]] = []
        self.assigned = 0                         # requests sent here, not finished here yet

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.arrived)

    def add(self, request: Request, params: SamplingParams | None = None) -> None:
        """A request arriving here: a new one, or (a decode instance) one whose KV arrives, with
        the settings it goes on under (`params`)."""
        params = params or request.params
        try:   # the engine's own admission rule on lengths, not a copy of it
            self.scheduler.check_fits(request.num_prompt_tokens, params.max_tokens)
        except ValueError as error:
            raise ValueError(f"request {request.request_id} on {self.name}: {error}") from None
        self.assigned += 1
        if self.role == "decode":
            self.arrived.append((request, params))
        else:
            self.scheduler.add_request(request)

    def _admit_arrived(self) -> None:
        """Arrived KV caches join the running batch as decodes, in order of arrival, while the
        scheduler has a slot and blocks for them (Scheduler.admit_transferred: a request of ours
        waiting to be recomputed goes first)."""
        while self.arrived and self.scheduler.admit_transferred(*self.arrived[0]):
            self.arrived.popleft()

    def begin_step(self, now: float) -> float | None:
        """Plan a step at `now` and launch it; return when it ends (None: nothing can run now)."""
        self.executor.clock.wait_until(now)       # idle until now
        self._admit_arrived()
        step = self.core.begin_step()
        if step is None:
            return None
        future = step.future
        self.in_flight, self.busy_time = step, self.busy_time + future.duration
        self.steps.append((now, future.end, step.plan.num_prefill_tokens,
                           step.plan.num_decode_rows))
        return future.end

    def end_step(self) -> list[Request]:
        """Apply the step's tokens at its end; return the requests that finished here."""
        step, self.in_flight = self.in_flight, None
        self.core.end_step(step)
        done = list({id(s.request): s.request for s in step.plan.seqs
                     if not s.ghost and s.request.finished}.values())
        self.assigned -= len(done)
        return done


@dataclass
class Transfer:
    request_id: str
    source: str
    destination: str
    num_tokens: int
    ready: float       # the prompt's last step ended
    start: float       # the link was free
    end: float         # the KV is on the decode instance


@dataclass
class ClusterResult:
    requests: list[Request]
    instances: list[Instance]
    transfers: list[Transfer]
    finished_on: dict[str, list[str]]    # request id -> every instance it finished on, in order

    @property
    def metrics(self) -> list[RequestMetrics]:
        return [RequestMetrics.from_request(r) for r in self.requests]

    @property
    def num_gpus(self) -> int:
        return sum(i.gpus for i in self.instances)

    @property
    def total_time(self) -> float:
        return max((r.times.finished for r in self.requests), default=0.0)


def _least_loaded(instances: list[Instance]) -> Instance:
    return min(instances, key=lambda i: (i.assigned, instances.index(i)))


def simulate_cluster(workload: Workload, colocated: Pool | None = None,
                     prefill: Pool | None = None, decode: Pool | None = None,
                     shape: ModelShape | None = None, link: Link | None = None,
                     transfer: Callable[[int], float] | None = None) -> ClusterResult:
    """Serve `workload` (arrival times included) on a co-located pool, or on a prefill pool and a
    decode pool whose KV moves over `link` (bytes from `shape`) or takes `transfer(num_tokens)`
    seconds. Deterministic: the same inputs give the same schedule."""
    disaggregated = prefill is not None or decode is not None
    if disaggregated == (colocated is not None) or (disaggregated and (prefill is None
                                                                       or decode is None)):
        raise ValueError("give either colocated=Pool(...) or both prefill= and decode= pools.")
    if disaggregated and transfer is None:
        if shape is None or link is None:
            raise ValueError("a disaggregated cluster needs shape= and link= (or transfer=) to "
                             "time its KV transfers.")
        transfer = lambda num_tokens: kv_transfer_time(shape, num_tokens, link)  # noqa: E731
    max_len = max(r.prompt_len + r.output_len for r in workload.requests)

    def make(role: str, pool: Pool) -> list[Instance]:
        if pool.count < 1:
            raise ValueError(f"a {role} pool needs at least one instance (got {pool.count}).")
        return [Instance(f"{role}-{k}", role, pool, max_len) for k in range(pool.count)]

    entry = make("prefill", prefill) if disaggregated else make("colocated", colocated)
    exits = make("decode", decode) if disaggregated else []
    instances = entry + exits
    link_free = {i.name: 0.0 for i in entry}
    events: list[tuple[float, int, int, str, object]] = []   # (time, kind, order, what, payload)
    order = 0

    def push(time: float, kind: int, what: str, payload: object) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (time, kind, order, what, payload))

    requests: list[Request] = []
    # each request's own settings; a disaggregated cluster's prefill instance serves it capped at
    # its first token (as vLLM's disaggregation proxy sends it), and the decode instance that
    # admits its KV restores them (Scheduler.admit_transferred)
    asked: dict[str, SamplingParams] = {}
    for index, spec in enumerate(workload.requests):
        params = SamplingParams(max_tokens=spec.output_len, temperature=0, ignore_eos=True)
        asked[str(index)] = params
        request = Request(str(index), [1] * spec.prompt_len,
                          replace(params, max_tokens=1) if disaggregated else params,
                          arrival_time=spec.arrival, priority=spec.priority, arrival_index=index)
        requests.append(request)
        push(spec.arrival, 1, "arrive", request)
    transfers: list[Transfer] = []
    finished_on: dict[str, list[str]] = {r.request_id: [] for r in requests}

    def handle(what: str, payload: object) -> None:
        if what == "arrive":
            _least_loaded(entry).add(payload)
        elif what == "step":
            for request in payload.end_step():
                finished_on[request.request_id].append(payload.name)
                if (payload.role == "prefill"
                        and request.num_output_tokens < asked[request.request_id].max_tokens):
                    send(request, payload)
        else:
            request, destination = payload
            destination.assigned -= 1
            destination.add(request, asked[request.request_id])

    def send(request: Request, source: Instance) -> None:
        destination = _least_loaded(exits)
        destination.assigned += 1       # counted there while its KV is on the way
        start = max(now, link_free[source.name])
        link_free[source.name] = end = start + transfer(request.num_computed_tokens)
        transfers.append(Transfer(request.request_id, source.name, destination.name,
                                  request.num_computed_tokens, now, start, end))
        push(end, 2, "transfer", (request, destination))

    now = 0.0
    while True:
        for instance in instances:      # every idle instance with work starts a step now
            if not instance.busy and instance.has_work():
                end = instance.begin_step(now)
                if end is not None:
                    push(end, 0, "step", instance)
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] <= now:   # everything that happens at this instant
            _, _, _, what, payload = heapq.heappop(events)
            handle(what, payload)
    stuck = [i.name for i in instances if i.has_work()]
    if stuck:
        raise RuntimeError(f"{', '.join(stuck)} still hold requests that can never run; check "
                           "the knobs (KV pool too small?).")
    return ClusterResult(requests, instances, transfers, finished_on)


# --- goodput (DistServe) -------------------------------------------------------------------------
def slo_attainment(metrics: Sequence[RequestMetrics], slo_ttft: float | None,
                   slo_tpot: float | None) -> float:
    """The share of requests that met every given target (TTFT and TPOT, in seconds)."""
    return sum(meets_slo(m, slo_ttft, slo_tpot) for m in metrics) / len(metrics)


def max_rate_meeting(attainment_at: Callable[[float], float], rates: Sequence[float],
                     goal: float, refine: int = 4) -> tuple[float, list[tuple[float, float]]]:
    """The highest request rate before the SLO attainment first drops below `goal`.

    `rates` are scanned in increasing order; between the last rate that met the goal and the
    first that did not, `refine` evenly spaced rates are scanned the same way. Returns that rate
    (0.0 if even the lowest missed) and every (rate, attainment) tried. A scan, not a bisection:
    if a looser SLO meets the goal at every rate a tighter one does, its answer is never lower."""
    tried: list[tuple[float, float]] = []

    def scan(grid: Sequence[float]) -> tuple[float | None, float | None]:
        passed = None
        for rate in grid:
            value = attainment_at(rate)
            tried.append((rate, value))
            if value < goal:
                return passed, rate
            passed = rate
        return passed, None

    passed, failed = scan(sorted(rates))
    if passed is not None and failed is not None and refine > 0:
        step = (failed - passed) / (refine + 1)
        finer, _ = scan([passed + step * k for k in range(1, refine + 1)])
        passed = finer if finer is not None else passed
    return (passed or 0.0), tried


def attainment_at_rate(workload: Workload, rate: float, slo_ttft: float, slo_tpot: float,
                       seed: int = 0, **cluster) -> float:
    """SLO attainment of `workload` arriving as a seeded Poisson process at `rate` requests per
    second, on the cluster `cluster` describes (simulate_cluster's arguments)."""
    timed = workload.with_arrivals(poisson_arrivals(len(workload), rate, seed=seed))
    return slo_attainment(simulate_cluster(timed, **cluster).metrics, slo_ttft, slo_tpot)
