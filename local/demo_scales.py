"""The demo's fleet sizes: how big the simulated fleet and its workload are per `--scale`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DemoScale:
    """How big the simulated fleet and its workload are."""

    instances: str
    """Instance spec for the simulator, e.g. `2p,3d` (2 prefill, 3 decode)."""
    requests: int
    rate: float
    """Requests per simulated second."""
    capacity_blocks: int
    """KV blocks per instance: small enough that the shared prefixes get evicted."""
    slow_pair: str
    """The prefill→decode pair whose transfers are slow."""


SCALES: dict[str, DemoScale] = {
    "small": DemoScale("2p,3d", 360, 0.5, 160, "prefill-1->decode-0"),
    "default": DemoScale("2p,3d", 1500, 1.0, 192, "prefill-1->decode-0"),
}
