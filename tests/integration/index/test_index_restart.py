"""`kvscope index` on the real broker and chDB (through `kvscope serve`): exact after cold
start, after kill -9 mid-stream and a restart, and without ClickHouse from the topic."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest
from kvscope.serve import state as serve_state
from support.collector_testkit import publish_envelopes
from support.index_kit import IndexProcess
from support.index_streams import hostile_stream, replayed_state
from support.serve_kit import ServeProcess


def _until_exact(index: IndexProcess, expected: dict, timeout_s: float = 90) -> float:
    """Seconds until the index holds exactly `expected` (fails with the difference)."""
    started = time.monotonic()
    got: dict = {}
    while time.monotonic() - started < timeout_s:
        got = index.state()
        if got == expected:
            return time.monotonic() - started
        time.sleep(0.2)
    missing = {k: (len(v[0] - got.get(k, (set(), 0))[0]), v[1]) for k, v in expected.items()}
    raise AssertionError(f"index never exact: {missing}\n{index.output()[-2000:]}")


def _publish(bootstrap: str, prefix: str, envelopes: list) -> None:
    asyncio.run(publish_envelopes(bootstrap, prefix, "kv-events", envelopes))


@pytest.mark.parametrize(("seed", "then_direct"), [(11, True), (12, False)])
def test_kill_9_mid_stream_and_restart_reaches_the_exact_state_again(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path, seed: int, then_direct: bool
) -> None:
    stream = hostile_stream(seed, records=1200, sources=6, universe=500)
    first, second, third = stream[:500], stream[500:900], stream[900:]
    chdb = tmp_path / "chdb"
    with ServeProcess(bootstrap_servers, chdb, topic_prefix) as serve:
        _publish(bootstrap_servers, topic_prefix, first)
        extra = ("--clickhouse", serve.clickhouse)
        index = IndexProcess(bootstrap_servers, topic_prefix, tmp_path / "i1.log", *extra).start()
        try:
            _until_exact(index, replayed_state(first))
            feeding = threading.Thread(
                target=lambda: [
                    _publish(bootstrap_servers, topic_prefix, second[i : i + 20])
                    for i in range(0, len(second), 20)
                ]
            )
            feeding.start()
            time.sleep(0.3)
            index.kill()  # mid-stream: records are still arriving
            feeding.join()
        finally:
            index.kill()
        _publish(bootstrap_servers, topic_prefix, third)
        again = IndexProcess(bootstrap_servers, topic_prefix, tmp_path / "i2.log", *extra)
        started = time.monotonic()
        again.start()
        try:
            exact_s = _until_exact(again, replayed_state(stream))
            assert "started from stored state" in again.output()
            total_s = time.monotonic() - started
            while again.request("/healthz")[0] != 200:  # exact, then caught up: ready
                assert time.monotonic() - started < 90, again.output()[-2000:]
                time.sleep(0.05)
            ready_s = time.monotonic() - started
            print(
                f"restart to exact state: {total_s:.2f} s ({exact_s:.2f} s after listening), "
                f"ready (/healthz 200): {ready_s:.2f} s"
            )
        finally:
            assert again.stop() == 0
    if not then_direct:
        return
    # without the serve: the index opens the chDB directory itself, for its cold start only
    direct = IndexProcess(
        bootstrap_servers, topic_prefix, tmp_path / "i3.log", "--clickhouse", f"chdb://{chdb}"
    ).start()
    try:
        _until_exact(direct, replayed_state(stream))
        assert serve_state.holder_pid(chdb) is None  # free for `kvscope collect` again
        assert re.search(
            r"stored state \(.* resident blocks from .* stored block events", direct.output()
        )
    finally:
        assert direct.stop() == 0


def test_replicas_without_clickhouse_each_read_the_whole_topic(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    stream = hostile_stream(21, records=600, sources=4, universe=200)
    _publish(bootstrap_servers, topic_prefix, stream[:300])
    replicas = [
        IndexProcess(bootstrap_servers, topic_prefix, tmp_path / f"i{n}.log").start()
        for n in range(2)
    ]
    try:
        _publish(bootstrap_servers, topic_prefix, stream[300:])
        for index in replicas:  # no consumer group: neither takes partitions from the other
            _until_exact(index, replayed_state(stream))
            assert "reading the topic from its beginning" in index.output()
    finally:
        assert [index.stop() for index in replicas] == [0, 0]


def test_a_taken_port_is_one_line_before_anything_starts(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    import socket
    import subprocess

    from support.serve_kit import KVSCOPE

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["index", "--bootstrap-servers", bootstrap_servers, "--port", str(port)]
        done = subprocess.run([*KVSCOPE, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"kvscope index: error: cannot listen on 127.0.0.1:{port} (Address already in use): "
        "choose another --port"
    ]
