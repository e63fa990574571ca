"""`kvscope simulate` says in one line how many records were lost, and exits 1.

End to end with real processes: `kvscope simulate` runs as a user runs it, against a real
broker of the test's own. Two real ways to lose records, both produced on demand without
a fake:

- records larger than the publisher's `KVSCOPE_MAX_REQUEST_SIZE` (the broker is healthy:
  the publisher drops them and sends Gap records naming them), swept over three limits;
- a broker that accepts connections but never answers: the broker process is frozen with
  SIGSTOP before simulate starts (the kernel still completes the TCP handshake, so the
  start-up check passes; no Kafka request is ever answered), then thawed to read back.

Each time the count in the line is checked against what reached the broker: every record
simulate sent is either on the broker or counted lost (and, with the broker healthy,
named by a Gap).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest
from kvscope.local.broker import LocalBroker
from kvscope.schemas import Gap
from kvscope.schemas.streams import STREAMS, topic_for
from support.publisher_readback import Record, consume

SIMULATE = [sys.executable, "-m", "kvscope.cli", "simulate", "--instances", "2"]
LOST_LINE = re.compile(
    r"^kvscope simulate: error: ([\d,]+) of ([\d,]+) records were lost \((.+)\); (.+)$"
)


def number(text: str) -> int:
    """An integer printed with thousands separators."""
    return int(text.replace(",", ""))


def run_simulate(
    broker: LocalBroker, prefix: str, env: dict[str, str], requests: int
) -> subprocess.CompletedProcess[str]:
    """`kvscope simulate` into `broker` under `prefix`, with publisher settings in `env`."""
    return subprocess.run(
        [*SIMULATE, "--bootstrap-servers", broker.bootstrap_servers, "--topic-prefix", prefix,
         "--requests", str(requests), "--seed", "3",
         # Long shared prompts: KV-event batches up to ~14 KB, the rest under 300 bytes.
         "--workload-param", "system_prompt_len=4096"],
        capture_output=True, text=True, timeout=180, check=False, env={**os.environ, **env},
    )  # fmt: skip


def lost_line(result: subprocess.CompletedProcess[str]) -> tuple[int, int, dict[str, int], str]:
    """(lost, sent, lost by reason, advice) from simulate's one error line (checked)."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    # kvscope's own error is one line, the last; aiokafka's connection errors may precede it.
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("kvscope simulate: error:")] == lines[-1:]
    found = LOST_LINE.match(lines[-1])
    assert found, lines[-1]
    reasons = {
        reason: number(count)
        for count, reason in (part.split(" ", 1) for part in found[3].split(", "))
    }
    return number(found[1]), number(found[2]), reasons, found[4]


def data_records(records: list[Record]) -> list[Record]:
    """The records that are not Gaps."""
    return [r for r in records if not isinstance(r.envelope.body, Gap)]


def read_back(
    broker: LocalBroker, prefix: str, expected: int, timeout_s: float = 20.0
) -> list[Record]:
    """Every record under `prefix` on the broker (waits until `expected` data records)."""
    topics = [topic_for(stream, prefix) for stream in STREAMS]
    return consume(
        broker.bootstrap_servers, topics, lambda r: len(data_records(r)) >= expected, timeout_s
    )


@pytest.mark.parametrize("max_request_size", [700, 1500, 4000])
def test_records_too_large_are_counted_and_named_by_gaps(max_request_size: int) -> None:
    prefix = f"lost{max_request_size}."
    limits = {
        "KVSCOPE_MAX_REQUEST_SIZE": str(max_request_size),
        "KVSCOPE_MAX_BATCH_BYTES": str(max_request_size),
    }
    with LocalBroker() as broker:
        result = run_simulate(broker, prefix, limits, requests=30)
        lost, sent, reasons, advice = lost_line(result)
        assert set(reasons) == {"too_large"}
        assert 0 < lost < sent and reasons["too_large"] == lost
        assert "KVSCOPE_MAX_REQUEST_SIZE" in advice
        records = read_back(broker, prefix, sent - lost)
    data = data_records(records)
    gaps = [r.envelope.body for r in records if isinstance(r.envelope.body, Gap)]
    assert len(data) == sent - lost, "every record not counted lost reached the broker"
    assert sum(g.last_seq - g.first_seq + 1 for g in gaps) == lost, "the Gaps name the lost"
    assert {g.reason for g in gaps} == {"too_large"}
    # Per source and stream, the seqs on the broker plus those the Gaps name leave no hole.
    seqs: dict[tuple[bytes, str], set[int]] = {}
    for record in records:
        key = (record.key, record.topic)
        seqs.setdefault(key, set()).add(record.envelope.seq)
        body = record.envelope.body
        if isinstance(body, Gap):
            seqs[key].update(range(body.first_seq, body.last_seq + 1))
    for key, present in seqs.items():
        assert present == set(range(max(present) + 1)), f"a hole in {key}"


def test_a_broker_that_never_answers_loses_everything_sent() -> None:
    prefix = "lostfrozen."
    timeouts = {"KVSCOPE_DELIVERY_TIMEOUT_S": "1", "KVSCOPE_RECONNECT_BACKOFF_MAX_S": "0.5"}
    with LocalBroker() as broker:
        pid = broker._process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        try:
            result = run_simulate(broker, prefix, timeouts, requests=10)
        finally:
            os.kill(pid, signal.SIGCONT)
        lost, sent, reasons, advice = lost_line(result)
        assert lost == sent > 0
        assert set(reasons) <= {"broker_unavailable", "send_failed", "shutdown"}, reasons
        assert broker.bootstrap_servers in advice and "reachable" in advice
        # Thawed, the broker holds none of them (Kafka never took one).
        records = read_back(broker, prefix, 1, timeout_s=5.0)
    by_stream = Counter(r.topic for r in records)
    assert not by_stream, f"records reached the broker although all were counted lost: {by_stream}"
