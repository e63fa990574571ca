"""Every command, given bad input or an unreachable service: one line, the right exit code.

Exit code 2 for bad input (usage errors and flag values, files or URLs kvscope refuses), 1
for an unreachable service or a failure; exactly one line
on stderr, never a traceback (unless `--debug`); no directory created and no process left
running. Each case runs the CLI as a user does, in a fresh working directory. Orphans are
caught by making this test process a child subreaper (orphaned grandchildren are
re-parented to it instead of to init).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kvscope.local.broker import free_port
from support.chdb_holder import held_directory
from support.procfs import child_pids, is_running, wait_for_children

PR_SET_CHILD_SUBREAPER = 36
UNREACHABLE_KAFKA = "127.0.0.1:1"
UNREACHABLE_CH = "http://default:pw@127.0.0.1:1/kvscope"

BRIDGE = ["bridge", "--bootstrap-servers", "127.0.0.1:9", "--zmq", "tcp://127.0.0.1:9"]
"""A bridge command line whose Kafka and engine are never reached (discard port)."""
REFUSED = "(Connection refused); is the server running there? (check --clickhouse)"

# (case id, argv; {tmp} is the case's working directory, expected exit code, stderr must contain)
CASES = [
    (
        "query-unreachable-server",
        ["query", "hit_rate", "--clickhouse", UNREACHABLE_CH],
        1,
        f"cannot reach ClickHouse at http://default:***@127.0.0.1:1/kvscope {REFUSED}",
    ),
    (
        "report-unreachable-server",
        ["report", "--clickhouse", UNREACHABLE_CH],
        1,
        f"cannot reach ClickHouse at http://default:***@127.0.0.1:1/kvscope {REFUSED}",
    ),
    (
        "migrate-unreachable-server",
        ["migrate", "--clickhouse", UNREACHABLE_CH],
        1,
        f"cannot reach ClickHouse at http://default:***@127.0.0.1:1/kvscope {REFUSED}",
    ),
    (
        "collect-unreachable-kafka",
        ["collect", "--bootstrap-servers", UNREACHABLE_KAFKA, "--clickhouse", "chdb://{tmp}/new"],
        1,
        "cannot reach Kafka",
    ),
    (
        "collect-credentials-in-bootstrap-servers",
        ["collect", "--bootstrap-servers", "alice:hunter2@127.0.0.1:1"],
        2,
        "--bootstrap-servers takes host:port only",
    ),
    (
        "serve-unreachable-kafka",
        ["serve", "--bootstrap-servers", UNREACHABLE_KAFKA, "--clickhouse", "chdb://{tmp}/new"],
        1,
        "cannot reach Kafka",
    ),
    (
        "query-missing-chdb-dir",
        ["query", "hit_rate", "--clickhouse", "chdb://{tmp}/missing"],
        2,
        "no kvscope data",
    ),
    (
        "report-missing-chdb-dir",
        ["report", "--clickhouse", "chdb://{tmp}/missing"],
        2,
        "no kvscope data",
    ),
    (
        "demo-out-below-a-file",
        ["demo", "--out", "{tmp}/a-file/demo"],
        2,
        "a-file is a file, not a directory: choose another --out",
    ),
    (
        "report-out-name-too-long",
        ["report", "--clickhouse", "chdb://{tmp}/missing", "--out", "{tmp}/" + "x" * 300],
        1,
        "File name too long: ",
    ),
    (
        "migrate-chdb-dir-in-proc",
        ["migrate", "--clickhouse", "chdb:///proc/x"],
        2,
        "cannot create the chDB directory /proc/x",
    ),
    (
        "simulate-requests-too-many",
        ["simulate", "--dry-run", "--requests", "1000000000000"],
        2,
        "at most 1,000,000 per run",
    ),
    (
        "simulate-capacity-too-large",
        ["simulate", "--dry-run", "--capacity-blocks", "99999999999999999999"],
        2,
        "--capacity-blocks 99,999,999,999,999,999,999 is more than this simulator holds: "
        "at most 10,000,000",
    ),
    (
        "simulate-block-size-too-large",
        ["simulate", "--dry-run", "--block-size", "2000000"],
        2,
        "--block-size 2,000,000 is more than this simulator holds: at most 1,048,576",
    ),
    (
        "simulate-too-many-instances",
        ["simulate", "--dry-run", "--instances", "600p,600d"],
        2,
        "--instances 600p,600d makes 1,200 engines; simulate at most 1,000 in one run",
    ),
    (
        "simulate-instances-past-any-int",
        ["simulate", "--dry-run", "--instances", "99999999999999999999"],
        2,
        "simulate at most 1,000 in one run",
    ),
    ("schema-indent-huge", ["schema", "--indent", "99999999999999999999"], 2, "--indent must be"),
    ("schema-indent-negative", ["schema", "--indent", "-1"], 2, "--indent must be 0..16"),
    (
        "report-out-below-a-file",
        ["report", "--clickhouse", "chdb://{tmp}/missing", "--out", "{tmp}/a-file/report"],
        2,
        "a-file is a file, not a directory: choose another --out",
    ),
    (
        "trace-out-below-a-file",
        ["trace", "export", "--clickhouse", "chdb://{tmp}/missing", "--out", "{tmp}/a-file/t"],
        2,
        "is a file: choose another --out",
    ),
    (
        "trace-out-in-a-missing-folder",
        ["trace", "export", "--clickhouse", "chdb://{tmp}/missing", "--out", "{tmp}/no/t"],
        2,
        "is missing: choose another --out",
    ),
    (
        "derive-missing-chdb-dir",
        ["derive", "--clickhouse", "chdb://{tmp}/missing"],
        2,
        "no kvscope data",
    ),
    (
        "query-unknown-server-host",
        ["query", "hit_rate", "--clickhouse", "http://alice:hunter2@nonexistent.invalid:8123/db"],
        1,
        "cannot reach ClickHouse at http://alice:***@nonexistent.invalid:8123/db (Name or "
        "service not known); is the server running there?",
    ),
    (
        "derive-unreachable-server",
        ["derive", "--clickhouse", UNREACHABLE_CH],
        1,
        f"cannot reach ClickHouse at http://default:***@127.0.0.1:1/kvscope {REFUSED}",
    ),
    (
        "query-bucket-too-large",
        [
            "query",
            "eviction_churn_timeline",
            "--clickhouse",
            "chdb://{tmp}/missing",
            "--param",
            "bucket_s=99999999999",
        ],
        2,
        "give a whole number from 1 to 4294967295",
    ),
    (
        "query-bucket-zero",
        [
            "query",
            "eviction_churn_timeline",
            "--clickhouse",
            "chdb://{tmp}/missing",
            "--param",
            "bucket_s=0",
        ],
        2,
        "bucket_s",
    ),
    ("query-unknown-param", ["query", "hit_rate", "--param", "nope=1"], 2, "no parameter nope"),
    ("query-bad-time", ["query", "hit_rate", "--param", "since=yesterday"], 2, "cannot read time"),
    ("query-param-without-value", ["query", "hit_rate", "--param", "since"], 2, "use K=V"),
    ("query-param-without-name", ["query", "hit_rate", "--param", "=5"], 2, "naming the parameter"),
    (
        "query-param-twice",
        ["query", "hit_rate", "--param", "since=2h", "--param", "since=1h"],
        2,
        "--param since given more than once",
    ),
    (
        "query-since-in-the-future",
        ["query", "hit_rate", "--param", "since=2100-01-01"],
        2,
        "must be before until",
    ),
    (
        "query-duration-too-long",
        ["query", "hit_rate", "--param", "since=99999999d"],
        2,
        "cannot read time",
    ),
    ("query-unknown-name", ["query", "no_such_query"], 2, "unknown query"),
    ("query-no-name", ["query"], 2, "name a query"),
    (
        "query-bad-url-scheme",
        ["query", "hit_rate", "--clickhouse", "ftp://host/db"],
        2,
        "unsupported ClickHouse URL",
    ),
    (
        "report-since-after-until",
        ["report", "--since", "1h", "--until", "2h"],
        2,
        "--since must be before --until",
    ),
    ("report-bad-time", ["report", "--since", "last tuesday"], 2, "cannot read time"),
    ("report-gpu-gib-zero", ["report", "--gpu-gib", "0"], 2, "--gpu-gib must be a number > 0"),
    ("report-gpu-gib-nan", ["report", "--gpu-gib", "nan"], 2, "--gpu-gib must be a number > 0"),
    ("report-gpu-gib-huge", ["report", "--gpu-gib", "1e300"], 2, "and <= 4096"),
    ("report-usd-negative", ["report", "--usd-per-gpu-hour", "-2"], 2, "--usd-per-gpu-hour"),
    ("report-out-in-proc", ["report", "--out", "/proc/x"], 2, "--out /proc/x"),
    ("report-since-in-the-future", ["report", "--since", "2099-01-01"], 2, "in the future"),
    (
        "report-prefill-rate-inf",
        ["report", "--prefill-tokens-per-gpu-s", "inf"],
        2,
        "--prefill-tokens-per-gpu-s must be a number > 0",
    ),
    (
        "report-zero-dtype-bytes",
        [
            "report",
            "--kv-layers",
            "32",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--kv-dtype-bytes",
            "0",
        ],
        2,
        "--kv-dtype-bytes must be a whole number 1..8",
    ),
    (
        "report-zero-kv-layers",
        ["report", "--kv-layers", "0", "--kv-heads", "8", "--head-dim", "128"],
        2,
        "--kv-layers must be a whole number 1..4096",
    ),
    (
        "report-huge-kv-layers",
        ["report", "--kv-layers", "99999999999", "--kv-heads", "8", "--head-dim", "128"],
        2,
        "--kv-layers must be a whole number 1..4096",
    ),
    ("report-negative-min-transfers", ["report", "--min-transfers", "-1"], 2, "--min-transfers"),
    ("demo-negative-min-transfers", ["demo", "--min-transfers=-1"], 2, "whole number 0.."),
    (
        "simulate-bad-workload-param",
        ["simulate", "--dry-run", "--workload-param", "groups=abc"],
        2,
        "groups",
    ),
    ("simulate-no-output", ["simulate"], 2, "exactly one of"),
    (
        "simulate-truth-is-a-directory",
        ["simulate", "--dry-run", "--truth", "{tmp}"],
        1,
        "cannot write the truth to",
    ),
    (
        "simulate-truth-in-missing-directory",
        ["simulate", "--dry-run", "--truth", "{tmp}/missing/truth.json"],
        1,
        "truth.json: no directory",
    ),
    (
        "simulate-capacity-too-small",
        ["simulate", "--dry-run", "--capacity-blocks", "1"],
        2,
        "raise --capacity-blocks to at least 38",
    ),
    (
        "simulate-slow-pair-not-transferring",
        ["simulate", "--dry-run", "--instances", "2p,2d", "--slow-pair", "prefill-0->prefill-1"],
        2,
        "give a prefill and a decode instance as SRC->DST (e.g. prefill-0->decode-1)",
    ),
    (
        "simulate-unknown-workload-param",
        ["simulate", "--dry-run", "--workload-param", "group=16"],
        2,
        "has no parameter 'group'; it has groups,",
    ),
    (
        "simulate-workload-param-twice",
        ["simulate", "--dry-run", "--workload-param", "groups=8", "--workload-param", "groups=16"],
        2,
        "--workload-param groups given more than once",
    ),
    (
        "simulate-zero-groups",
        ["simulate", "--dry-run", "--workload-param", "groups=0"],
        2,
        "groups=0: give a whole number >= 1",
    ),
    ("simulate-rate-zero", ["simulate", "--dry-run", "--rate", "0"], 2, "--rate must be"),
    (
        "simulate-rate-with-trace",
        ["simulate", "--dry-run", "--workload", "trace", "--trace", "{tmp}/t.jsonl", "--rate", "5"],
        2,
        "--rate does not apply to a trace",
    ),
    (
        "simulate-time-scale-without-trace",
        ["simulate", "--dry-run", "--time-scale", "0.5"],
        2,
        "--time-scale applies only to --workload trace",
    ),
    (
        "simulate-trace-timestamps-without-trace",
        ["simulate", "--dry-run", "--trace-timestamps", "s"],
        2,
        "--trace-timestamps applies only to --workload trace",
    ),
    (
        "simulate-trace-block-of-no-tokens",
        [
            *("simulate", "--dry-run", "--workload", "trace", "--trace", "{tmp}/t.jsonl"),
            *("--trace-block-tokens", "0"),
        ],
        2,
        "--trace-block-tokens must be 1..1048576",
    ),
    (
        "simulate-reset-not-seconds",
        ["simulate", "--dry-run", "--reset", "engine-0@abc"],
        2,
        "'abc' is not a number of seconds",
    ),
    (
        "simulate-reset-unknown-instance",
        ["simulate", "--dry-run", "--instances", "1p,1d", "--reset", "engine-0@5"],
        2,
        "instances: decode-0, prefill-0",
    ),
    (
        "simulate-unreachable-kafka",
        ["simulate", "--bootstrap-servers", UNREACHABLE_KAFKA, "--requests", "2"],
        1,
        "cannot reach Kafka",
    ),
    ("demo-out-is-a-file", ["demo", "--out", "{tmp}/a-file"], 2, "not a directory"),
    (
        "migrate-chdb-dir-is-a-file",
        ["migrate", "--clickhouse", "chdb://{tmp}/a-file"],
        2,
        "a-file is a file, not a directory",
    ),
    (
        "simulate-chdb-dir-is-a-file",
        ["simulate", "--requests", "2", "--clickhouse", "chdb://{tmp}/a-file"],
        2,
        "a-file is a file, not a directory",
    ),
    ("collect-batch-rows-zero", ["collect", "--batch-rows", "0"], 2, "batch rows"),
    (
        "collect-session-timeout-past-int32",
        ["collect", "--session-timeout-ms", "99999999999999999999"],
        2,
        "--session-timeout-ms must be 1000..3600000",
    ),
    ("serve-session-timeout-zero", ["serve", "--session-timeout-ms", "0"], 2, "1000..3600000"),
    ("serve-public-without-token", ["serve", "--host", "0.0.0.0"], 2, "--token"),
    ("serve-bad-port", ["serve", "--port", "70000"], 2, "--port"),
    ("broker-bad-port", ["broker", "--port", "70000"], 2, "--port"),
    (
        "broker-host-of-another-machine",
        ["broker", "--host", "192.0.2.1", "--port", "19999"],
        1,
        "cannot listen on 192.0.2.1 (Cannot assign requested address)",
    ),
    (
        "bridge-metrics-host-unknown",
        [*BRIDGE, "--prometheus-port", "0", "--prometheus-host", "nonexistent.invalid"],
        2,
        "cannot serve metrics on nonexistent.invalid:0 (Name or service not known); choose "
        "another --prometheus-port or --prometheus-host",
    ),
    (
        "bridge-metrics-port-out-of-range",
        [*BRIDGE, "--prometheus-port", "70000"],
        2,
        "--prometheus-port must be 0..65535, got 70000",
    ),
    (
        "migrate-negative-ttl",
        ["migrate", "--clickhouse", "chdb://{tmp}/m", "--ttl-days", "-1"],
        2,
        "TTL",
    ),
    (
        "migrate-ttl-past-2106",
        ["migrate", "--clickhouse", "chdb://{tmp}/m", "--ttl-days", "30000"],
        2,
        "--ttl-days must be 0 to 10,000",
    ),
    ("usage-unknown-command", ["frobnicate"], 2, "invalid choice"),
    ("usage-bad-format", ["query", "hit_rate", "--format", "xml"], 2, "invalid choice"),
    ("usage-port-not-a-number", ["serve", "--port", "abc"], 2, "invalid int value"),
    ("usage-bad-share", ["report", "--target-hit-rate", "2"], 2, "between 0 and 1"),
    ("usage-share-not-a-number", ["report", "--target-hit-rate", "abc"], 2, "between 0 and 1"),
    ("usage-negative-slo", ["report", "--transfer-slo-ms=-1"], 2, "milliseconds of at least 0"),
    ("usage-nan-slo", ["report", "--transfer-slo-ms", "nan"], 2, "milliseconds of at least 0"),
    (
        "index-unreachable-kafka",
        ["index", "--bootstrap-servers", UNREACHABLE_KAFKA],
        1,
        "cannot reach Kafka",
    ),
    (
        "index-open-host-without-token",
        ["index", "--host", "0.0.0.0"],
        2,
        "is not loopback: set --token",
    ),
    ("index-bad-tier-weight", ["index", "--tier-weight", "GPU"], 2, "expected TIER=WEIGHT"),
    ("index-bad-hash-algo", ["index", "--hash-algo", "md5"], 2, "--hash-algo must be one of"),
    ("index-bad-port", ["index", "--port", "70000"], 2, "--port must be 0..65535"),
    (
        "index-no-data-there",
        ["index", "--clickhouse", "chdb://{tmp}/none", "--bootstrap-servers", UNREACHABLE_KAFKA],
        2,
        "no kvscope data at",
    ),
    (
        "index-unreachable-clickhouse",
        ["index", "--clickhouse", UNREACHABLE_CH, "--bootstrap-servers", UNREACHABLE_KAFKA],
        1,
        "cannot reach ClickHouse at http://default:***@127.0.0.1:1/kvscope",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def subreaper() -> None:
    """Orphaned grandchildren of the CLI become children of this process (then we see them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def run_cli(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(cwd / "xdg")}
    env.pop("KVSCOPE_CLICKHOUSE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        check=False,
    )


def leftovers(before: set[int]) -> list[int]:
    """Processes re-parented to us since `before` (running, not counting pytest's own)."""
    return [p for p in child_pids(os.getpid()) if p not in before and is_running(p)]


@pytest.mark.parametrize("case,argv,code,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case: str, argv: list[str], code: int, needle: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    before_files = set(tmp_path.rglob("*"))
    before_pids = set(child_pids(os.getpid()))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    result = run_cli(args, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, f"{case}: exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, f"{case}: stderr is not one line:\n{result.stderr}"
    assert needle in lines[0], lines[0]
    assert lines[0].startswith("kvscope"), lines[0]
    assert set(tmp_path.rglob("*")) == before_files, f"{case} left files behind"
    deadline = time.monotonic() + 5
    while leftovers(before_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(before_pids) == [], f"{case} left a process running"


def test_a_bridge_metrics_port_in_use_is_one_line_before_publishing(tmp_path: Path) -> None:
    """It was 'OSError: [Errno 98] Address already in use (--debug shows the traceback)',
    after the Kafka publisher had started."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_cli([*BRIDGE, "--prometheus-port", str(port)], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"kvscope bridge: error: cannot serve metrics on 127.0.0.1:{port} (Address already in "
        "use); choose another --prometheus-port or --prometheus-host"
    ]


@pytest.mark.parametrize("command", ["collect", "serve"])
def test_collecting_into_a_file_says_so_once(
    command: str, bootstrap_servers: str, tmp_path: Path
) -> None:
    """With Kafka up the collector opens the target itself: the same one line, no prefix."""
    (tmp_path / "a-file").write_text("not a directory\n")
    extra = ["--port", "0"] if command == "serve" else ["--exit-when-idle", "1"]
    target = f"chdb://{tmp_path}/a-file"
    args = [command, "--bootstrap-servers", bootstrap_servers, "--clickhouse", target, *extra]
    result = run_cli(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"kvscope {command}: error: {tmp_path}/a-file is a file, not a directory: give "
        "--clickhouse chdb:///DIRECTORY (created if missing)"
    )


def test_serve_on_an_address_of_another_machine_says_which_option(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    args = ["serve", "--bootstrap-servers", bootstrap_servers, "--port", "0"]
    args += ["--clickhouse", f"chdb://{tmp_path}/d", "--host", "192.0.2.1"]
    result = run_cli([*args, "--token", "a-token-of-20-chars!"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "kvscope serve: error: cannot listen on 192.0.2.1:0 (Cannot assign requested address): "
        "give --host an address of this machine"
    ]
    assert not (tmp_path / "d").exists(), "the directory was created before listening failed"


@pytest.mark.parametrize("listener", ["closes", "silent"])
@pytest.mark.parametrize("command", ["collect", "serve"])
def test_an_address_that_is_not_kafka_is_one_error(
    command: str, listener: str, tmp_path: Path
) -> None:
    """A listener that closes every connection: it was 'KafkaConnectionError: ...
    (--debug shows the traceback)', then 'Unclosed AIOKafkaConsumer' on stderr. One that
    reads and never answers (an HTTP server's port): serve printed its dashboard, then
    after aiokafka's 40 s request timeout an ERROR line; the run's 20 s limit fails that."""
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        held: list[socket.socket] = []

        def handle_every_connection() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn = server.accept()[0]
                    if listener == "closes":
                        conn.close()
                    else:
                        held.append(conn)
            for conn in held:
                conn.close()

        thread = threading.Thread(target=handle_every_connection, daemon=True)
        thread.start()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        extra = ["--port", "0"] if command == "serve" else ["--exit-when-idle", "1"]
        args = [command, "--bootstrap-servers", address, "--clickhouse", f"chdb://{tmp_path}/d"]
        try:
            result = run_cli([*args, *extra], tmp_path, timeout=20)
        finally:
            stop.set()
            thread.join()
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"kvscope {command}: error: Kafka at {address} did not answer as a Kafka broker "
        f"({address}: {REASONS[listener]}): check --bootstrap-servers and the security settings"
    ], result.stderr
    assert result.stdout == "", "serve printed its dashboard before Kafka was checked"
    assert not (tmp_path / "d").exists(), "the directory was created before Kafka was checked"


REASONS = {
    "closes": "it closed the connection without a Kafka response",
    "silent": "no Kafka response within 3 s",
}


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli(["--debug", "query", "no_such_query"], tmp_path)
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "unknown query" in result.stderr


def test_schema_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`kvscope schema | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    result = subprocess.run(
        f"{sys.executable} -m kvscope.cli schema | head -1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.stdout == "{\n"
    assert result.stderr == "", result.stderr


def test_readers_name_the_process_holding_the_directory(tmp_path: Path) -> None:
    """Another process holds the chDB directory: query/report/collect/migrate name its pid."""
    chdb_dir = tmp_path / "held"
    with held_directory(chdb_dir) as pid:
        url = f"chdb://{chdb_dir}"
        for argv in (
            ["query", "hit_rate", "--clickhouse", url],
            ["report", "--clickhouse", url],
            ["migrate", "--clickhouse", url],
            ["collect", "--clickhouse", url, "--bootstrap-servers", "127.0.0.1:9"],
        ):
            result = run_cli(argv, tmp_path)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 1, result.stderr
            assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
            assert f"pid {pid}" in lines[0], lines[0]


@pytest.mark.parametrize("command", [["broker", "--port", "0"], ["demo", "--scale", "small"]])
def test_sigkill_does_not_leave_the_broker_running(command: list[str], tmp_path: Path) -> None:
    """SIGKILL runs no cleanup: the broker child must notice its parent died and stop."""
    if command[0] == "broker":
        command = ["broker", "--port", str(free_port())]
    else:
        command = [*command, "--out", str(tmp_path / "demo")]
    process = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        children = wait_for_children(process)
        assert children, f"kvscope {command[0]} never started its broker"
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if is_running(pid)], "the broker outlived its parent"
