"""Rows waiting for the next flush, and how polled records are cut into chunks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
from aiokafka import TopicPartition
from kvscope.collector.pipeline.plan import PartitionBatch


def take_bytes(records: list[Any], budget: int) -> tuple[list[Any], list[Any]]:
    """Split `records` after the first ones holding `budget` bytes (at least one record)."""
    total = 0
    for i, record in enumerate(records):
        total += max(1, len(record.value or b""))
        if total >= budget:
            return records[: i + 1], records[i + 1 :]
    return records, []


@dataclasses.dataclass
class Buffer:
    """Rows of one Kafka partition waiting for the next flush, and the offsets they span."""

    tables: dict[str, list[pa.Table]] = dataclasses.field(default_factory=dict)
    derived_gaps: list[pa.Table] = dataclasses.field(default_factory=list)
    next_offset: int = 0
    first_offset: int | None = None

    rows: int = 0

    def add(self, table: str, rows: pa.Table) -> None:
        """Buffer `rows` for `table`."""
        self.tables.setdefault(table, []).append(rows)
        self.rows += rows.num_rows

    def batch(self, tp: TopicPartition) -> PartitionBatch:
        """Everything buffered for partition `tp`, one table per destination."""
        return PartitionBatch(
            topic=tp.topic,
            partition=tp.partition,
            tables={name: pa.concat_tables(parts) for name, parts in self.tables.items()},
            derived_gaps=pa.concat_tables(self.derived_gaps) if self.derived_gaps else None,
            next_offset=self.next_offset,
            first_offset=self.next_offset if self.first_offset is None else self.first_offset,
        )
