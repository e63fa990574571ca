"""`kvscope bridge` as operators run it: a subprocess, two DP ranks, SIGTERM, a restart.

The engine side is vLLM's own `ZmqEventPublisher`, one per DP rank as vLLM runs it (on ipc
sockets, which vLLM offsets only for tcp, so the rank is set on the batches as vLLM does).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from kvscope.consumer import read_envelopes
from kvscope.local.broker import free_port
from kvscope.schemas import Gap, KVEventBatch
from prometheus_client.parser import text_string_to_metric_families
from support.e2e_support import wait_for
from vllm.distributed import kv_events  # vLLM's own publisher: the engine side of the test

pytestmark = pytest.mark.vllm


def batch(rank: int, i: int) -> object:
    stored = kv_events.BlockStored(
        block_hashes=[1000 * rank + i], parent_block_hash=None, token_ids=[1] * 16,
        block_size=16, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    return kv_events.KVEventBatch(ts=1_700_000_000.0 + i, events=[stored], data_parallel_rank=rank)


def start_bridge(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", "bridge", *args],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop_bridge(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, log.read_text()[-3000:]


def bridge_counters(port: int) -> dict[tuple[str, str], float]:
    """The bridge's own `kvscope_bridge_*_total` counters by (endpoint, name[:result]);
    empty while its /metrics does not answer yet."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return {}
    return {
        (s.labels["endpoint"], ":".join(filter(None, (s.name, s.labels.get("result"))))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name.startswith("kvscope_bridge_") and s.name.endswith("_total")
    }


def in_ring(engine: kv_events.ZmqEventPublisher) -> bool:
    """Every batch published so far is in the engine's replay ring (its publisher thread
    marks a queued batch done only after sending it and appending it to the ring)."""
    return engine._event_queue.unfinished_tasks == 0


def test_cli_bridges_two_dp_ranks_and_resumes_after_sigterm(
    tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    urls = {r: (f"ipc://{tmp_path}/pub{r}", f"ipc://{tmp_path}/replay{r}") for r in (0, 1)}
    engines = {
        r: kv_events.ZmqEventPublisher(
            data_parallel_rank=0, endpoint=pub, replay_endpoint=replay, buffer_steps=100
        )
        for r, (pub, replay) in urls.items()
    }
    state = tmp_path / "state"
    prometheus_port = free_port()
    log = tmp_path / "bridge.log"
    args = [
        "--engine", "vllm", "--instance", "pod-7", "--model", "m", "--role", "decode",
        "--zmq", urls[0][0], "--zmq", urls[1][0], "--replay", urls[0][1], "--replay", urls[1][1],
        "--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix,
        "--state-dir", str(state), "--prometheus-port", str(prometheus_port),
    ]  # fmt: skip
    saved = state / "bridge-state.json"

    def publish(seqs: range) -> None:
        for i in seqs:
            for r, engine in engines.items():
                engine.publish(batch(r, i))

    def bridge_run(missed: range, live: int) -> None:
        """Publish `missed` with no bridge running, start it, publish `live`, SIGTERM it."""
        publish(missed)
        wait_for(lambda: all(map(in_ring, engines.values())), 30, "batches in the replay rings")
        proc = start_bridge(args, log)
        # The bridge subscribes to both PUB sockets first, then catches up from each ring
        # (one replay request each, answered): after that a live batch reaches it.
        caught_up = {
            (replay, "kvscope_bridge_replays_total:ok"): 1.0 for _, replay in urls.values()
        }
        wait_for(
            lambda: caught_up.items() <= bridge_counters(prometheus_port).items(),
            60,
            f"the bridge subscribed and caught up from both rings (log: {log})",
        )
        publish(range(live, live + 1))
        expected = {urls[0][0]: live + 1, urls[1][0]: live + 1}
        wait_for(
            lambda: saved.exists() and json.loads(saved.read_text()) == expected,
            30,
            f"the bridge state file at {expected}",
        )
        counts.update(bridge_counters(prometheus_port))
        stop_bridge(proc, log)

    counts: dict[tuple[str, str], float] = {}
    try:
        bridge_run(range(5), 5)  # the first 5 come from the rings, at bridge start
        assert counts == {  # the bridge's own /metrics, per PUB and replay endpoint
            **{(pub, "kvscope_bridge_forwarded_batches_total"): 6 for pub, _ in urls.values()},
            **{(rep, "kvscope_bridge_replays_total:ok"): 1 for _, rep in urls.values()},
            **{(rep, "kvscope_bridge_replayed_batches_total"): 5 for _, rep in urls.values()},
        }
        bridge_run(range(6, 9), 9)  # bridge down for 6..8: from the rings again
    finally:
        for engine in engines.values():
            engine.shutdown()

    envelopes = [r.envelope for r in read_envelopes(bootstrap_servers, topic_prefix=topic_prefix)]
    assert not [e for e in envelopes if isinstance(e.body, Gap)]
    for rank in (0, 1):
        mine = [e for e in envelopes if e.source.dp_rank == rank]
        assert {(e.source.instance, e.source.model, e.source.role) for e in mine} == {
            ("pod-7", "m", "decode")
        }
        assert len({e.epoch for e in mine}) == 2, "one epoch per bridge run"
        hashes = [
            e.body.events[0].block_hashes[0]
            for e in sorted(mine, key=lambda e: (e.ts, e.seq))
            if isinstance(e.body, KVEventBatch)
        ]
        assert hashes == [1000 * rank + i for i in range(10)], "each batch exactly once"


@pytest.mark.parametrize("burst", [1, 20000])
def test_sigterm_forwards_what_the_engine_sent_before_it(
    tmp_path: Path, bootstrap_servers: str, topic_prefix: str, burst: int
) -> None:
    """SIGTERM right after a burst: every batch the engine had sent reaches Kafka, no Gap.

    Nothing after the burst could reveal a lost tail, so only reading what already waits on
    the socket before stopping delivers it (the sidecar's shutdown: ZMQ first, then this).
    """
    pub, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    engine = kv_events.ZmqEventPublisher(
        data_parallel_rank=0, endpoint=pub, replay_endpoint=replay, buffer_steps=burst + 1
    )
    port = free_port()
    log = tmp_path / "bridge.log"
    args = [
        "--engine=vllm", f"--zmq={pub}", f"--replay={replay}", "--instance=pod-t",
        f"--bootstrap-servers={bootstrap_servers}", f"--topic-prefix={topic_prefix}",
        f"--prometheus-port={port}",
    ]  # fmt: skip
    try:
        engine.publish(batch(0, 0))
        wait_for(lambda: in_ring(engine), 30, "the first batch in the replay ring")
        proc = start_bridge(args, log)
        wait_for(
            lambda: bridge_counters(port).get((replay, "kvscope_bridge_replays_total:ok")) == 1,
            60,
            f"the bridge subscribed and caught up (log: {log})",
        )
        for i in range(1, burst + 1):
            engine.publish(batch(0, i))
        wait_for(lambda: in_ring(engine), 30, "the burst sent by the engine")
        stop_bridge(proc, log)
    finally:
        engine.shutdown()
    envelopes = [r.envelope for r in read_envelopes(bootstrap_servers, topic_prefix=topic_prefix)]
    assert not [e for e in envelopes if isinstance(e.body, Gap)]
    hashes = [
        e.body.events[0].block_hashes[0] for e in envelopes if isinstance(e.body, KVEventBatch)
    ]
    assert sorted(hashes) == list(range(burst + 1)), log.read_text()[-2000:]
