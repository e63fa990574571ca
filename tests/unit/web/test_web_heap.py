"""`freeze_startup_heap`: what a service's start leaves alive leaves the collector's walks,
garbage is not frozen with it, and what comes later is collected as before. Run in a child
process: freezing the test process's heap would keep its later garbage for good."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import gc, json, sys, weakref
import kvscope.route.app
from kvscope.web.server import freeze_startup_heap

class Node:
    pass

def cycles(n):
    nodes = [Node() for _ in range(n)]
    for a, b in zip(nodes, nodes[1:] + nodes[:1]):
        a.next = b
    return [weakref.ref(node) for node in nodes]

gc.disable()  # only the explicit collections below run
kept = cycles(int(sys.argv[1]))
kept_alive = [ref() for ref in kept]
dropped = cycles(int(sys.argv[1]))  # unreachable cycles: garbage before the freeze
frozen = freeze_startup_heap()
after = cycles(int(sys.argv[1]))  # garbage made after the freeze
gc.collect()
print(json.dumps({
    "frozen": frozen,
    "freeze_count": gc.get_freeze_count(),
    "dropped_alive": sum(ref() is not None for ref in dropped),
    "after_alive": sum(ref() is not None for ref in after),
    "kept_alive": sum(ref() is not None for ref in kept),
}))
"""


@pytest.mark.parametrize("nodes", [1, 50, 5000])
def test_start_up_objects_are_frozen_and_garbage_is_not(nodes: int) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(nodes)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["frozen"] == figures["freeze_count"] > 10_000  # the router's modules
    assert figures["dropped_alive"] == 0  # collected before the freeze, not kept forever
    assert figures["after_alive"] == 0  # later garbage is still collected
    assert figures["kept_alive"] == nodes
