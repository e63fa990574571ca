"""What one record may carry: the wire limits every producer should keep and the collector enforces.

The wire format bounds little: msgpack ints reach 2**64 - 1, floats may be NaN or
infinite, strings and lists are as long as the record. The tables bound more (dp_rank is
UInt16, ts a DateTime64 that silently clamps, seq arithmetic in queries is signed), and
some values cost the collector or its readers far more than their bytes (one 4 MB record
of one-byte hashes is 4M rows; a 10 MB instance name stalls the report's plot layout).
Every limit here is documented in docs/collector.md; a record over one is stored in
`ingest_errors` with a reason naming the field and the limit, never partially stored.

The collector's check (`kvscope.collector.pipeline.checks`) sends a record over any of
these to `ingest_errors`; the simulator and publishers read them to stay within.
"""

from __future__ import annotations

from typing import Final

MAX_ROWS_PER_RECORD: Final = 100_000
"""Rows one record may become (block hashes plus AllBlocksCleared events of a KV batch)."""
MAX_EVENTS_PER_RECORD: Final = MAX_ROWS_PER_RECORD
"""Events one KV batch may carry (events without hashes cost memory but make no row)."""
MAX_NAME_CHARS: Final = 256
"""Names: instance, model, engine, engine_version, medium_raw, tier, lora_name, backend, metric,
label names, finish_reason and the other LowCardinality columns."""
MAX_TEXT_CHARS: Final = 4096
"""Free text: request ids, label values, Gap reasons."""
MAX_LIST_ITEMS: Final = 1024
"""Histogram bounds and bucket deltas, labels per series."""
MAX_DP_RANK: Final = 2**16 - 1
"""dp_rank is stored as UInt16."""
MAX_SEQ: Final = 2**63 - 1
"""Seqs (and Gap bounds) stay in Int64 so that range arithmetic in queries cannot wrap."""
TS_MIN: Final = 0.0
"""Earliest accepted timestamp, seconds since the epoch (1970-01-01)."""
TS_MAX: Final = 4_102_444_800.0
"""Timestamps must be before 2100-01-01 UTC (finite: NaN and infinities are rejected)."""
MAX_UINT32: Final = 2**32 - 1
"""Counts stored as UInt32 (tokens, blocks, chunks)."""
