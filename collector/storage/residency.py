"""Residency intervals materialized from the raw block events, in closed increments.

The interval queries (residency, refaults, routing opportunity, duplication, the what-if,
the report's histogram) used to re-derive every block's residency interval with window
functions over every event in the window asked: their cost grew with the history scanned,
and a block stored before the window was invisible. `refresh(client)` keeps derived tables
up to date instead, processing only the events stored since its last run:

- closed intervals (ended by a removal, a clear or a duplicate store), written once, and
  again in block-hash order for routing_opportunity (`kv_block_intervals_by_hash`);
- open intervals (blocks resident now), replaced as they close;
- each hash's last removal per source (what a later store's refault test needs);
- per source and epoch its progress: last seq, events, removals and clears so far.

The same rules as the window-function definition (`sql/queries/_block_intervals_raw.sql`,
kept as the reference the tests compare with): a source's events in (seq, event_index,
position) order, chains per (source, medium, hash, clear generation). One refresh step is
one generation: staged into `*_stage` tables from the committed state, then published
with one deduplication token per table and generation, progress last (the commit). A
crash while staging leaves garbage only in the stage; a crash while publishing is finished
by the next refresh from the same stage. `rebuild(client)` empties the derived tables and
derives them again from the raw events (`kvscope derive --rebuild`).

Assumption (what the collector guarantees): a source's records are stored in seq order
(one Kafka partition per source, stored as a prefix). A record stored later with a seq
below the source's progress is not seen until a rebuild.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import re
import threading
import time
from typing import Any

from kvscope.collector.storage.client import Client
from kvscope.sql import with_includes

log = logging.getLogger(__name__)

_DERIVING = threading.Lock()
"""Held by every refresh and rebuild in this process: two at once (a collector's refresher
and a query's, on two clients of one database) would stage into the same stage tables and
each publish the other's rows too, every interval twice."""
MAX_RECORDS = 200_000
"""Records (seqs) one refresh step stages at most, over whole sources (at least one)."""
PUBLISH_SETTINGS = {
    "max_insert_threads": 1,
    "min_insert_block_size_rows": 2**62,
    "min_insert_block_size_bytes": 0,
}
"""Publishing inserts: one thread squashing the whole stage table into one block, whatever
its size, so a repeated publish repeats its parts (one per partition) and tokens exactly,
with no ORDER BY to make block boundaries deterministic (it cost a sort per table)."""


@dataclasses.dataclass
class RefreshResult:
    """What one `refresh` did: generations committed, source-epochs and events derived."""

    generations: int = 0
    sources: int = 0
    events: int = 0
    recovered: bool = False
    """An interrupted publish (crash) was finished first."""


def _sql(name: str) -> str:
    folder = importlib.resources.files("kvscope.sql").joinpath("residency")
    text = folder.joinpath(f"{name}.sql").read_text(encoding="utf-8")
    return with_includes(text, lambda fragment: _sql(f"_{fragment}"))


def _statements(name: str) -> list[str]:
    lines = [line for line in _sql(name).splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in re.split(r";\s*$", "\n".join(lines), flags=re.M) if s.strip()]


def _state(client: Client) -> tuple[int, int]:
    row = client.query(_sql("committed")).result_rows[0]
    return int(row[0] or 0), int(row[1] or 0)


def _publish(client: Client, generation: int) -> None:
    for index, statement in enumerate(_statements("publish")):
        token = f"kvscope-residency-{generation}-{index}"
        client.command(
            statement, settings={**PUBLISH_SETTINGS, "insert_deduplication_token": token}
        )
    for statement in _statements("truncate_stage"):
        client.command(statement)


def _pick(plan: list[tuple], max_records: int) -> list[tuple]:
    """Whole sources, in plan order, until their new seqs exceed `max_records`."""
    picked: list[tuple] = []
    records = 0
    for row in plan:
        if picked and records + (row[4] - (row[3] or 0)) > max_records:
            break
        picked.append(row)
        records += row[4] - (row[3] or 0)
    return picked


def _sources_condition(picked: list[tuple]) -> tuple[str, dict[str, Any]]:
    """`WHERE` text and parameters selecting each picked source's unprocessed seqs."""
    clauses, params = [], {}
    for i, (instance, dp_rank, epoch, last_seq, _max_seq) in enumerate(picked):
        params.update({f"i{i}": instance, f"d{i}": dp_rank, f"e{i}": epoch})
        clause = (
            f"instance = {{i{i}:String}} AND dp_rank = {{d{i}:UInt16}} AND epoch = {{e{i}:UInt64}}"
        )
        if last_seq is not None:
            params[f"s{i}"] = last_seq
            clause += f" AND seq > {{s{i}:UInt64}}"
        clauses.append(f"({clause})")
    return " OR ".join(clauses), params


def _step(client: Client, picked: list[tuple], committed: int, generation: int) -> int:
    """Stage and publish one generation for `picked` sources; the events it derived."""
    for statement in _statements("truncate_stage"):
        client.command(statement)
    condition, params = _sources_condition(picked)
    client.command(_sql("stage_events").replace("/* sources */", condition), parameters=params)
    events = int(client.command(_sql("staged_events")))
    both = {"committed": committed, "generation": generation}
    for name in (
        "stage_candidates",
        "stage_intervals",
        "stage_open",
        "stage_evicted",
        "stage_progress",
    ):
        client.command(_sql(name), parameters=both)
    _publish(client, generation)
    return events


def refresh(client: Client, max_records: int = MAX_RECORDS) -> RefreshResult:
    """Derive the intervals of every block event stored since the last refresh.

    Runs steps (generations) until no source has unprocessed events. With nothing
    committed, derived rows can only be the leftovers of a rebuild that crashed while
    emptying the tables: they are dropped before the first step (nothing is written when
    there is nothing to derive). Only one refresh may run at a time on a database: within
    a process they take turns (`_DERIVING`), whatever client they use; two processes on
    one database must not both refresh (`--no-residency` on all collectors but one).
    """
    with _DERIVING:
        return _refresh(client, max_records)


def _refresh(client: Client, max_records: int) -> RefreshResult:
    result = RefreshResult()
    committed, staged = _state(client)
    if staged > committed:
        log.info("finishing the interrupted residency publish of generation %d", staged)
        _publish(client, staged)
        committed, result.recovered = staged, True
    while True:
        plan = [
            (str(i), int(d), int(e), None if known is None else int(known), int(m))
            for i, d, e, known, m in client.query(
                _sql("plan"), settings={"join_use_nulls": 1}
            ).result_rows
        ]
        if not plan:
            return result
        picked = _pick(plan, max_records)
        if not committed:
            for statement in _statements("truncate_derived"):
                client.command(statement)
        generation = committed + 1 if committed else time.time_ns() // 1000
        result.events += _step(client, picked, committed, generation)
        result.generations += 1
        result.sources += len(picked)
        committed = generation


def rebuild(client: Client, max_records: int = MAX_RECORDS) -> RefreshResult:
    """Empty the derived tables and derive them again from the raw block events."""
    with _DERIVING:
        for statement in _statements("truncate_stage") + _statements("truncate_derived"):
            client.command(statement)
        return _refresh(client, max_records)
