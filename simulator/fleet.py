"""The fleet simulator: engines, routing, prefill→decode transfers, simulated time.

`Fleet(config, sink).run()` replays a workload (`workloads`) through N simulated
engines (`engine`) in simulated time and returns the ground truth (`truth`). Every
body goes to `sink(source, epoch, body, ts)` in publish order, e.g. a Kafka publisher per
source; without a sink nothing is published (dry run, for what-if re-runs).
Deterministic: the same config (including `seed`) gives the same bodies and truth.

Time: each engine steps on its own fixed grid (`step_ms`, phase-shifted per engine so
no two engines ever share a timestamp); timestamps are `start_ts` plus simulated time,
whole microseconds.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.cachemodel.blockpool import chain_hashes
from kvscope.schemas import AnyBody, ConfigError, KVTransfer, RequestFinished, Role, Source
from kvscope.schemas.limits import MAX_NAME_CHARS, MAX_ROWS_PER_RECORD, TS_MAX, TS_MIN
from kvscope.simulator.engine import Running, SimEngine, Work
from kvscope.simulator.routing import (
    GIE_ASSUMED_BLOCKS,
    ROUTING,
    PrefixScorer,
    Router,
    make_router,
)
from kvscope.simulator.trace import (
    TRACE_BLOCK,
    TRACE_TIMESTAMP_S,
    check_trace_units,
    load_trace,
)
from kvscope.simulator.truth import TruthRecorder
from kvscope.simulator.workloads import (
    WORKLOADS,
    SimRequest,
    generate,
    knob_values,
    longest_request,
)

log = logging.getLogger(__name__)

Sink = Callable[[Source, int, AnyBody, float], None]
"""sink(source, epoch, body, ts): publish one body of one source at engine time ts (s)."""
MAX_INSTANCES = 1_000
"""Simulated engines in one fleet (each keeps its own block pool in this process)."""
MAX_CAPACITY_BLOCKS = 10_000_000
"""KV blocks of one simulated engine (its pool keeps per-block lists of this length; a GPU
holds at most a few million blocks)."""
MAX_BLOCK_SIZE = 1 << 20
MAX_ROUTER_REPLICAS = 1_000
"""Router replicas of `approximate` (each keeps its own guess of every engine's cache)."""
"""Tokens per KV block (engines use 16 to a few thousand)."""
_ROLE_NAMES: dict[Role, str] = {"prefill": "prefill", "decode": "decode", "both": "engine"}
_ROLE_ALIASES: dict[str, Role] = {"p": "prefill", "d": "decode", "b": "both", "prefill": "prefill"}
_ROLE_ALIASES |= {"decode": "decode", "both": "both"}


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One simulated engine instance: its name and role."""

    name: str
    role: Role


def parse_instances(spec: str) -> tuple[InstanceSpec, ...]:
    """Instances from `N` (N engines doing both) or e.g. `2p,2d,1b` / `prefill=2,decode=2`.

    Names are `engine-i` (both), `prefill-i` and `decode-i`.
    """
    spec = spec.strip()
    counts: dict[str, int] = {}
    for part in [f"{spec}b"] if spec.isdigit() else spec.split(","):  # N: N engines doing both
        part = part.strip()
        num, role = part.split("=")[::-1] if "=" in part else (part.rstrip("pdb"), part[-1:])
        if not num.isdigit() or role not in _ROLE_ALIASES:
            raise ConfigError(f"bad instance spec {part!r}: use N, or e.g. 2p,2d,1b")
        counts[_ROLE_ALIASES[role]] = counts.get(_ROLE_ALIASES[role], 0) + int(num)
    if sum(counts.values()) > MAX_INSTANCES:
        raise ConfigError(
            f"--instances {spec} makes {sum(counts.values()):,} engines; simulate at most "
            f"{MAX_INSTANCES:,} in one run"
        )
    return tuple(
        InstanceSpec(f"{_ROLE_NAMES[role]}-{i}", role)
        for role in ("both", "prefill", "decode")
        for i in range(counts.get(role, 0))
    )


MAX_REQUESTS = 1_000_000
"""Requests one run may simulate: each is held in memory (its tokens and block hashes)."""


@dataclass
class SimConfig:
    """Everything that determines a simulated run (same config, same output)."""

    instances: tuple[InstanceSpec, ...] = field(default_factory=lambda: parse_instances("2"))
    workload: str = "generated-shared-prefix"
    """generated-shared-prefix, multi-turn, zipf (see `workloads`) or trace (`trace`)."""
    trace: str | None = None
    """Mooncake-format trace file replayed by workload `trace` (its first `requests` lines)."""
    time_scale: float = 1.0
    """Trace arrival times are multiplied by this (0.5 = twice as fast)."""
    trace_block_tokens: int = TRACE_BLOCK
    """Tokens one trace hash id stands for (512 in Mooncake's traces, 16 in Alibaba's
    Qwen "blksz_16" ones)."""
    trace_timestamp_s: float = TRACE_TIMESTAMP_S
    """Seconds per unit of the trace's timestamps (ms in Mooncake's traces, s in Qwen's)."""
    requests: int = 500
    rate: float = 20.0
    """Mean request arrivals per simulated second (Poisson)."""
    workload_params: dict[str, float] = field(default_factory=dict)
    """Workload knobs, e.g. groups, system_prompt_len, question_len, output_len, alpha."""
    routing: str = "round-robin"
    """A policy of `routing.ROUTING`: round-robin, random, approximate, exact-index, oracle
    (alias prefix-aware)."""
    router_replicas: int = 1
    """`approximate`: router replicas, each with its own guesses (requests go to them in turn)."""
    assumed_capacity_blocks: int = GIE_ASSUMED_BLOCKS
    """`approximate`: the KV blocks per instance the guesser assumes (its LRU's length)."""
    index_lag_s: float = 0.0
    """`exact-index`: simulated seconds between publishing a KV event and the index applying it."""
    seed: int = 0
    capacity_blocks: int = 1024
    """KV blocks per instance (vLLM's num_gpu_blocks)."""
    block_size: int = 16
    model: str = "sim-model"
    start_ts: float = 1767225600.0
    """Wall-clock time of simulated time 0 (default 2026-01-01T00:00:00Z)."""
    step_ms: int = 20
    decode_tokens_per_step: int = 16
    max_running: int = 16
    stats_interval_s: float = 1.0
    transfer_base_ms: float = 4.0
    """Median fixed cost of one KV transfer; each pair gets its own around it."""
    transfer_sigma: float = 0.35
    """Lognormal sigma of transfer latency noise."""
    transfer_gbps: float = 20.0
    bytes_per_block: int = 2 * 1024 * 1024
    slow_pair: str | None = None
    """`src->dst` whose transfers are `slow_factor` times slower."""
    slow_factor: float = 5.0
    resets: tuple[tuple[str, float], ...] = ()
    """(instance, seconds after start) at which that instance resets its prefix cache."""
    access_stream: bool = True
    """Publish the access stream (a `BlockAccess` per request and source)."""
    prefill_tokens_per_s: float = 8000.0
    """Prefill throughput the requests report: each `RequestFinished.prefill_s` is its
    uncached prompt tokens / this (0 on a decode instance, whose KV arrives by transfer) and
    its `ttft_s` the queue time plus that. Only the reported timings: the simulated time
    line does not wait for it."""

    def validate(self) -> None:
        """Fail fast on a config that cannot run."""
        names = {i.name for i in self.instances}
        roles = {i.role for i in self.instances}
        if not self.instances or len(names) != len(self.instances):
            raise ConfigError("need at least one instance, with distinct names")
        if "prefill" in roles and "decode" not in roles:
            raise ConfigError("prefill instances need at least one decode instance")
        if "decode" in roles and "prefill" not in roles:
            raise ConfigError(
                "decode instances need a prefill instance (both instances serve whole "
                "requests and never hand one off), e.g. --instances 1p,1d"
            )
        if self.workload not in (*WORKLOADS, "trace"):
            known = ", ".join((*WORKLOADS, "trace"))
            raise ConfigError(f"unknown workload {self.workload!r}; known: {known}")
        if self.workload == "trace" and self.workload_params:
            raise ConfigError("workload trace takes no --workload-param (the trace sets it all)")
        if self.workload != "trace":
            knob_values(self.workload, self.workload_params)
        if (self.workload == "trace") != bool(self.trace):
            raise ConfigError("workload trace needs --trace FILE (and --trace needs it)")
        check_trace_units(self.trace_block_tokens, self.trace_timestamp_s)
        if len(self.model) > MAX_NAME_CHARS:
            raise ConfigError(
                f"--model has {len(self.model)} characters; the collector stores names of at "
                f"most {MAX_NAME_CHARS}"
            )
        if not (math.isfinite(self.start_ts) and TS_MIN <= self.start_ts < TS_MAX):
            raise ConfigError(
                f"--start-time {self.start_ts:g}: give epoch seconds from 0 to before "
                f"{TS_MAX:.0f} (2100-01-01, the latest time the collector stores)"
            )
        for option, value in (("--rate", self.rate), ("--time-scale", self.time_scale)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{option} must be a finite number > 0, not {value}")
        self._check_routing()
        if min(self.requests, self.capacity_blocks, self.block_size, self.step_ms) <= 0:
            raise ConfigError("requests, capacity_blocks, block_size and step_ms must be > 0")
        if self.requests > MAX_REQUESTS:
            raise ConfigError(
                f"--requests {self.requests:,}: at most {MAX_REQUESTS:,} per run (the "
                "simulator holds every request in memory); run again with another --seed "
                "for more"
            )
        for option, value, most in (
            ("--capacity-blocks", self.capacity_blocks, MAX_CAPACITY_BLOCKS),
            ("--block-size", self.block_size, MAX_BLOCK_SIZE),
        ):
            if value > most:
                raise ConfigError(
                    f"{option} {value:,} is more than this simulator holds: at most {most:,}"
                )
        if self.slow_pair:
            self._check_slow_pair(self.slow_pair)
        for name, at_s in self.resets:
            if name not in names:
                known = ", ".join(sorted(names))
                raise ConfigError(f"reset of unknown instance {name!r}; instances: {known}")
            if not (math.isfinite(at_s) and at_s >= 0):
                raise ConfigError(f"reset of {name!r} at {at_s} s: give seconds >= 0")

    def _check_routing(self) -> None:
        """The policy is known and its own options are in range."""
        if self.routing not in ROUTING:
            raise ConfigError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTING)}")
        if not 1 <= self.router_replicas <= MAX_ROUTER_REPLICAS:
            raise ConfigError(
                f"--router-replicas must be 1..{MAX_ROUTER_REPLICAS:,}, not {self.router_replicas}"
            )
        if not 1 <= self.assumed_capacity_blocks <= MAX_CAPACITY_BLOCKS:
            raise ConfigError(
                f"--assumed-capacity-blocks must be 1..{MAX_CAPACITY_BLOCKS:,}, not "
                f"{self.assumed_capacity_blocks}"
            )
        if not (math.isfinite(self.index_lag_s) and self.index_lag_s >= 0):
            raise ConfigError(f"--index-lag must be seconds >= 0, not {self.index_lag_s}")

    def _check_slow_pair(self, pair: str) -> None:
        """`pair` names a prefill and a decode instance (only those pairs transfer KV)."""
        src, _, dst = pair.partition("->")
        prefill = [i.name for i in self.instances if i.role == "prefill"]
        decode = [i.name for i in self.instances if i.role == "decode"]
        if src not in prefill or dst not in decode:
            example = (
                f"e.g. {prefill[0]}->{decode[-1]}"
                if prefill
                else "this fleet has none: --instances like 2p,2d"
            )
            raise ConfigError(
                f"slow pair {pair!r}: give a prefill and a decode instance as SRC->DST ({example})"
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data (recorded in the truth file)."""
        out = asdict(self)
        out["instances"] = [[i.name, i.role] for i in self.instances]
        out["resets"] = [list(r) for r in self.resets]
        return out


def source_epoch(seed: int, instance: str) -> int:
    """A deterministic per-source epoch (a real engine picks a random one at start)."""
    digest = hashlib.blake2b(f"{seed}/{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def workload_requests(config: SimConfig, fit_capacity: bool = True) -> list[SimRequest]:
    """The requests `config` simulates: its trace's first lines, or its generated workload.
    With `fit_capacity`, `ConfigError` before any token is drawn when one could never fit
    an instance's cache (without: the caller sizes the cache from the requests)."""
    most = config.capacity_blocks * config.block_size if fit_capacity else None
    if config.trace:
        return load_trace(
            config.trace,
            config.requests,
            config.seed,
            config.time_scale,
            most,
            block_tokens=config.trace_block_tokens,
            timestamp_s=config.trace_timestamp_s,
        )
    longest = longest_request(config.workload, config.requests, config.workload_params)
    need = math.ceil(longest / config.block_size)
    if fit_capacity and need > config.capacity_blocks:  # an engine would never admit it
        raise ConfigError(
            f"a request of this workload can have {longest:,} tokens (prompt and output), "
            f"{need:,} blocks of {config.block_size}, more than --capacity-blocks "
            f"{config.capacity_blocks:,}: raise --capacity-blocks to at least {need:,}"
        )
    return generate(
        config.workload, config.requests, config.seed, config.rate, config.workload_params
    )


class Fleet:
    """A simulated fleet run; `run()` publishes through the sink and returns the truth.

    `index` is the prefix index `exact-index` routing asks (default: one in process, fed
    with the records as they are published)."""

    def __init__(
        self,
        config: SimConfig,
        sink: Sink | None = None,
        progress: Callable[[int, int], None] | None = None,
        index: PrefixScorer | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.truth = TruthRecorder()
        self._sink = sink
        self._progress = progress
        self.router: Router = make_router(
            config.routing,
            seed=config.seed,
            replicas=config.router_replicas,
            assumed_capacity_blocks=config.assumed_capacity_blocks,
            index_lag_s=config.index_lag_s,
            index=index,
        )
        self._xfer_rng = random.Random(f"transfer/{config.seed}")
        self._step_us = config.step_ms * 1000
        self._start_us = round(config.start_ts * 1e6)
        self.engines = [self._engine(spec) for spec in config.instances]
        for engine in self.engines:
            engine.counters.last_stats_us = self._start_us
        self._phase = {
            id(e): k * self._step_us // len(self.engines) for k, e in enumerate(self.engines)
        }
        self._by_name = {e.source.instance: e for e in self.engines}
        self.epochs = {
            e.source.key: source_epoch(config.seed, e.source.instance) for e in self.engines
        }
        self._heap: list[tuple[int, int, int, str, Any]] = []
        self._order = itertools.count()
        self._scheduled: dict[int, int] = {}
        self._done = 0
        self._total = config.requests

    def _engine(self, spec: InstanceSpec) -> SimEngine:
        c = self.config
        source = Source(
            instance=spec.name, model=c.model, role=spec.role, dp_rank=0, engine="simulator"
        )
        self.truth.add_source(source.key, c.model, spec.role, c.capacity_blocks)
        return SimEngine(
            source,
            c.capacity_blocks,
            c.block_size,
            c.decode_tokens_per_step,
            c.max_running,
            emit=self._emit,
            on_kv=lambda key, ts, events: self.truth.on_events(key, ts, events, c.block_size),
            on_prefix=self.truth.on_prefix,
            on_prefilled=self._on_prefilled,
            on_finished=self._on_finished,
            access_stream=c.access_stream,
            prefill_tokens_per_s=c.prefill_tokens_per_s,
        )

    def run(self, requests: list[SimRequest] | None = None) -> dict[str, Any]:
        """Simulate every request to completion; return the truth (the --truth file content).

        `requests` are the config's workload when the caller has built them already
        (default: `workload_requests(config)`)."""
        c = self.config
        if requests is None:
            requests = workload_requests(c)
        self._check_fits(requests)
        self._total = len(requests)
        log.info(
            "simulating %d %s requests on %d instances",
            len(requests),
            c.workload,
            len(self.engines),
        )
        for r in requests:
            self._push(self._start_us + round(r.arrival_s * 1e6), 1, "arrive", r)
        for name, at_s in c.resets:
            self._push(self._start_us + round(at_s * 1e6), 0, "reset", self._by_name[name])
        now = self._start_us
        while self._heap:
            now, _, _, kind, payload = heapq.heappop(self._heap)
            if kind == "step":
                self._step(payload, now)
            elif kind == "arrive":
                self._arrive(payload, now)
            elif kind == "deliver":
                engine, work = payload
                engine.waiting.append(work)
                self._wake(engine, now)
            else:
                payload.reset_pending = True
                self._wake(payload, now)
        for e in self.engines:
            e.publish_stats(self._grid(e, now + 1))
        log.info("simulation finished: %d requests", self._done)
        truth = self.truth.summary(c.to_dict())
        truth["routing"] = self.router.stats.summary()
        return truth

    def _check_fits(self, requests: list[SimRequest]) -> None:
        """Every request arrives before 2100 (the collector's last time) and its block hashes
        fit one record, checked before anything is published (that each fits one instance's
        cache is checked before its tokens are drawn)."""
        c = self.config
        span_s = max(r.arrival_s for r in requests)
        if c.start_ts + span_s >= TS_MAX:
            raise ConfigError(
                f"the last request arrives {span_s:.4g} s after --start-time, after 2100-01-01 "
                "(the latest time the collector stores): give an earlier --start-time or a "
                "shorter run (a smaller --time-scale for a trace, a higher --rate otherwise)"
            )
        full = max((len(r.prompt) + len(r.output)) // c.block_size for r in requests)
        if full > MAX_ROWS_PER_RECORD:
            raise ConfigError(
                f"the largest request has {full:,} full blocks of {c.block_size} tokens, more "
                f"than the {MAX_ROWS_PER_RECORD:,} block hashes the collector takes per record: "
                "raise --block-size"
            )

    def _push(self, t_us: int, prio: int, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (t_us, prio, next(self._order), kind, payload))

    def _grid(self, engine: SimEngine, t_us: int) -> int:
        """The first step time of `engine` at or after `t_us`."""
        phase = self._start_us + self._phase[id(engine)]
        return phase + max(0, math.ceil((t_us - phase) / self._step_us)) * self._step_us

    def _wake(self, engine: SimEngine, t_us: int) -> None:
        g = self._grid(engine, t_us)
        current = self._scheduled.get(id(engine))
        if current is None or g < current:
            self._scheduled[id(engine)] = g
            self._push(g, 3, "step", engine)

    def _step(self, engine: SimEngine, now: int) -> None:
        if self._scheduled.get(id(engine)) != now:
            return
        del self._scheduled[id(engine)]
        engine.step(now, round(self.config.stats_interval_s * 1e6))
        if engine.waiting or engine.running or engine.reset_pending:
            self._wake(engine, now + 1)
        elif engine.held:
            self._wake(engine, max(now + 1, engine.next_release_us() or 0))

    def _arrive(self, request: Any, now: int) -> None:
        hashes = chain_hashes(request.prompt, self.config.block_size)
        first = [e for e in self.engines if e.source.role != "decode"]
        engine = self.router.pick("first", first, hashes, now)
        kind = "prefill" if engine.source.role == "prefill" else "full"
        engine.waiting.append(Work(request, hashes, kind, now))
        self._wake(engine, now)

    def _on_prefilled(self, engine: SimEngine, run: Running, now: int) -> int:
        """Choose the decode instance, time the transfer, schedule the delivery."""
        c = self.config
        decoders = [e for e in self.engines if e.source.role == "decode"]
        dst = self.router.pick("decode", decoders, run.work.hashes, now)
        blocks = len(run.block_ids)
        nbytes = blocks * c.bytes_per_block
        pair = f"{engine.source.instance}->{dst.source.instance}"
        pair_rng = random.Random(f"pair/{c.seed}/{pair}")
        median_ms = c.transfer_base_ms * math.exp(0.2 * pair_rng.gauss(0, 1))
        median_ms += nbytes / (c.transfer_gbps * 1e9) * 1000
        if pair == c.slow_pair:
            median_ms *= c.slow_factor
        latency_us = max(
            1, round(median_ms * 1000 * math.exp(c.transfer_sigma * self._xfer_rng.gauss(0, 1)))
        )
        end = now + latency_us
        body = KVTransfer(
            request_id=run.work.request.request_id,
            src_instance=engine.source.instance,
            dst_instance=dst.source.instance,
            backend="sim",
            bytes=nbytes,
            blocks=blocks,
            chunks=1,
            start_ts=now / 1e6,
            end_ts=end / 1e6,
            latency_s=latency_us / 1e6,
        )
        self._push(
            end, 2, "deliver", (dst, Work(run.work.request, run.work.hashes, "decode", end, body))
        )
        return end

    def _on_finished(self, engine: SimEngine, run: Running, now: int) -> None:
        self._done += 1
        if self._progress is not None:
            self._progress(self._done, self._total)

    def _emit(self, source: Source, body: AnyBody, ts_us: int) -> None:
        if isinstance(body, RequestFinished):
            self.truth.on_request(body.prompt_tokens, body.cached_tokens)
        elif isinstance(body, KVTransfer):
            self.truth.on_transfer(body.src_instance, body.dst_instance, body.latency_s, body.bytes)
        epoch = self.epochs[source.key]
        self.router.published(source, epoch, body, ts_us)
        if self._sink is not None:
            self._sink(source, epoch, body, ts_us / 1e6)
