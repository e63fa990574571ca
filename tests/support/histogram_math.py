"""Expected histogram quantiles, computed by the tests from bucket counts (not by kvscope).

The arithmetic `sql/queries/engine_histogram_quantiles.sql` documents, written out
independently: the first bucket whose cumulative count reaches q * count holds the
quantile, interpolated linearly between its lower edge (0 for the first bucket) and its
bound; a quantile in +Inf reports the largest finite bound, as Prometheus'
`histogram_quantile` does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families


def quantile_row(bounds: Sequence[float], counts: Sequence[int]) -> dict[str, float]:
    """observations, p50/p90/p99 and max_bound for per-bucket `counts` (the last is +Inf)."""
    assert len(counts) == len(bounds) + 1, "one count per finite bound, then +Inf"
    observations = sum(counts)
    cumulative = list(itertools.accumulate(counts))

    def quantile(q: float) -> float:
        rank = q * observations
        i = next(i for i, through in enumerate(cumulative) if through >= rank)
        if i == len(bounds):
            return bounds[-1]
        lower = 0.0 if i == 0 else bounds[i - 1]
        before = 0 if i == 0 else cumulative[i - 1]
        return lower + (bounds[i] - lower) * (rank - before) / counts[i]

    used = [i for i, count in enumerate(counts) if count]
    return {
        "observations": observations,
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "p99": quantile(0.99),
        "max_bound": math.inf if counts[-1] else bounds[used[-1]],
    }


def exposed_buckets(text: str, family: str) -> tuple[list[float], list[int]]:
    """Finite bounds and per-bucket counts (the last is +Inf) of the one series of a
    histogram `family` in a /metrics text, read with prometheus-client's own parser."""
    cumulative: dict[float, float] = {}
    count = None
    for metric in text_string_to_metric_families(text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if sample.name == f"{family}_bucket" and sample.labels["le"] != "+Inf":
                bound = float(sample.labels["le"])
                assert bound not in cumulative, f"{family} has more than one series"
                cumulative[bound] = sample.value
            elif sample.name == f"{family}_count":
                count = sample.value
    assert count is not None, f"{family} is not in the text"
    bounds = sorted(cumulative)
    through = [int(cumulative[b]) for b in bounds] + [int(count)]
    return bounds, [through[0], *(b - a for a, b in itertools.pairwise(through))]
