"""`kvscope demo`: the whole pipeline on one machine, then the report.

Starts the local Kafka-protocol broker, creates the tables in an embedded chDB directory
under the output directory, runs the collector in this process, runs a simulated fleet
(prefill and decode instances, a shared-prefix workload, one slow transfer pair, caches
small enough to evict) that publishes through the real Kafka publisher, waits until every
published record is stored, and writes the report. With a pace the fleet publishes in
(scaled) real time, and Ctrl-C while it publishes ends the publishing and still stores and
reports what was published. Everything it starts is stopped on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from kvscope.analytics.report.progress import QuietProgress, StepProgress
from kvscope.analytics.report.write import ReportFiles, check_out_dir
from kvscope.collector.errors import DemoError
from kvscope.local.demo_scales import SCALES
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 300 * 1024 * 1024
"""The demo's chDB data, report and broker memory fit well within this."""
MARKER = ".kvscope-demo"
"""Marks a chDB directory the demo created (and may therefore replace on the next run)."""
TOPIC_PREFIX = "kvscope-demo."
DATABASE = "kvscope"


MAX_ENGINE_START_S = 86400.0
"""The longest `--engine-start-timeout` taken (a day; longer is a typo)."""
VLLM_ENGINES = 2
"""Real engines serve the same kind of workload side by side (duplicated prefixes)."""
VLLM_REQUESTS = {"small": 16, "default": 60}
"""Prompts per real vLLM engine (each one runs to completion before the next)."""
PD_REQUESTS = {"small": 4, "default": 40}
"""Prompts through the real prefill→decode pair (one hand-off each, one after another)."""


@dataclass(frozen=True)
class DemoOptions:
    """What the user asked for (the command-line flags)."""

    out_dir: Path
    scale: str = "default"
    broker_port: int | None = None
    target_hit_rate: float = 0.7
    transfer_slo_ms: float = 50.0
    seed: int = 7
    engine: str = "simulator"
    """`simulator`, `vllm` (real vLLM engines) or `vllm-pd` (a real prefill→decode pair
    over NIXL); both real engines need `model_path`."""
    model_path: Path | None = None
    sizing: dict | None = None
    """The report's optional sizing parameters (`kvscope report --model-config`, ...)."""
    serve_port: int | None = None
    """Dashboard port (None: 8765 when free, else any free port)."""
    engine_start_timeout_s: float | None = None
    """Seconds a real engine may take to start (None: 180 for vllm, 900 for vllm-pd)."""
    pace: float | None = None
    """Simulated seconds per wall second for the simulator (1.0: real time); None publishes
    as fast as the broker takes it."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced."""

    files: ReportFiles
    findings: list[str]
    published: int
    stored: int
    clickhouse_url: str
    elapsed_s: float
    dashboard_url: str = ""
    """Where the live dashboard was (or, with a `hold` callback, still is) served."""


def check_disk(out_dir: Path) -> None:
    """Fail early, with advice, when the output directory's disk is nearly full."""
    existing = out_dir.resolve()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise DemoError(
            f"no disk space: {free // 2**20} MiB free at {existing}, the demo needs "
            f"{MIN_FREE_BYTES // 2**20} MiB; free some space or choose another --out"
        )


def prepare_chdb_dir(out_dir: Path) -> Path:
    """A fresh chDB directory under `out_dir`; replaces only one an earlier demo made."""
    path = out_dir / "chdb"
    if path.exists():
        if not (path / MARKER).exists():
            raise DemoError(f"{path} exists and was not made by kvscope demo; choose another --out")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("created by kvscope demo; replaced by the next run\n")
    return path


def dashboard_port(requested: int | None) -> int:
    """The requested port (`ConfigError` naming --serve-port when it is taken), else the
    default 8765 when it is free, else 0 (any free port). Called before anything starts."""
    from kvscope.local.broker import port_in_use
    from kvscope.serve.service import DEFAULT_HOST, DEFAULT_PORT

    if requested is None:
        return 0 if port_in_use(DEFAULT_HOST, DEFAULT_PORT) else DEFAULT_PORT
    if requested and port_in_use(DEFAULT_HOST, requested):
        raise ConfigError(
            f"--serve-port {requested} on {DEFAULT_HOST} is in use: stop what holds it, "
            "choose another --serve-port, or leave it out (a free one is picked)"
        )
    return requested


def run_demo(
    options: DemoOptions,
    progress: StepProgress | None = None,
    on_serving: Callable[[str], None] | None = None,
    hold: Callable[[DemoResult], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run the pipeline end to end and write the report; stop everything on the way out.

    `on_serving(url)` is called once the live dashboard listens (before data flows);
    `hold(result)`, if given, is called after the report while everything still runs (the
    `--keep-serving` wait) and everything stops when it returns. `notice(text)` gets the
    progress lines of a paced run (`options.pace`).
    """
    from kvscope.analytics.report.build import build_report
    from kvscope.collector.storage.migrate import run_migrations
    from kvscope.collector.storage.target import parse_target
    from kvscope.local.broker import LocalBroker
    from kvscope.local.demo_pd import check_nixl, run_pd_pair
    from kvscope.local.demo_pipeline import Pipeline
    from kvscope.local.demo_vllm import check_vllm, run_vllm_engines

    if options.scale not in SCALES:
        raise ConfigError(f"unknown --scale {options.scale!r}; known: {', '.join(SCALES)}")
    if options.engine in ("vllm", "vllm-pd"):
        if options.model_path is None:
            raise ConfigError(
                f"--engine {options.engine} needs --model-path (a Hugging Face model folder)"
            )
        check_vllm(options.model_path)
        if options.engine == "vllm-pd":
            check_nixl()
    elif options.engine != "simulator":
        raise ConfigError(f"unknown --engine {options.engine!r}: use simulator, vllm or vllm-pd")
    start = options.engine_start_timeout_s
    if start is not None:
        if options.engine == "simulator":
            raise ConfigError(
                "--engine-start-timeout applies to --engine vllm and vllm-pd: leave it out"
            )
        if not 0 < start <= MAX_ENGINE_START_S:
            raise ConfigError(
                f"--engine-start-timeout {start:g}: give seconds > 0 and <= {MAX_ENGINE_START_S:g}"
            )
    if options.pace is not None:
        if options.engine != "simulator":
            raise ConfigError(
                f"--pace applies to the simulator; --engine {options.engine} publishes as its "
                "engines serve: leave --pace out"
            )
        if not 0 < options.pace < math.inf:
            raise ConfigError(
                f"--pace {options.pace}: give simulated seconds per wall second, a number > 0 "
                "(1 = real time)"
            )
    serve_port = dashboard_port(options.serve_port)
    progress = progress or QuietProgress()
    started = time.monotonic()
    out_dir = options.out_dir
    check_out_dir(out_dir)
    check_disk(out_dir)
    chdb_dir = prepare_chdb_dir(out_dir)
    target = parse_target(f"chdb://{chdb_dir}?database={DATABASE}")

    with ExitStack() as stack:
        progress.step("starting Kafka broker")
        broker = LocalBroker(port=options.broker_port).start()
        stack.callback(broker.stop)

        progress.step("creating tables in chDB")
        run_migrations(target)

        pipeline = stack.enter_context(
            Pipeline(broker.bootstrap_servers, target, TOPIC_PREFIX, progress)
        )
        url = pipeline.serve(serve_port)
        if on_serving is not None:
            on_serving(url)
        if options.engine == "simulator":
            published = pipeline.simulate(SCALES[options.scale], options.seed, options.pace, notice)
            stored = pipeline.collect(published)
        else:
            assert options.model_path is not None
            engines = (
                functools.partial(run_vllm_engines, engines=VLLM_ENGINES)
                if options.engine == "vllm"
                else run_pd_pair
            )
            requests = (VLLM_REQUESTS if options.engine == "vllm" else PD_REQUESTS)[options.scale]
            if options.engine_start_timeout_s is not None:
                engines = functools.partial(engines, start_timeout_s=options.engine_start_timeout_s)
            engines(
                model_path=options.model_path,
                requests=requests,
                work_dir=out_dir,
                bootstrap_servers=broker.bootstrap_servers,
                topic_prefix=TOPIC_PREFIX,
                progress=progress,
            )
            stored = pipeline.collect(None)
            published = stored

        report, files = build_report(
            target,
            out_dir,
            target_hit_rate=options.target_hit_rate,
            transfer_slo_ms=options.transfer_slo_ms,
            sizing=options.sizing,
            progress=progress,
        )
        result = DemoResult(
            files=files,
            findings=report.findings,
            published=published,
            stored=stored,
            clickhouse_url=f"chdb://{chdb_dir}?database={DATABASE}",
            elapsed_s=time.monotonic() - started,
            dashboard_url=url,
        )
        if hold is not None:
            progress.step("serving the dashboard (Ctrl-C stops)")  # ends the report's step
            hold(result)
    return result
