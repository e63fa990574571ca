"""The loop closed on real engines: two `vllm serve` engines with kvscope's plugin publish
their KV events through the real broker to `kvscope index`; `kvscope route` asks that index
and sends every follow-up of a conversation prefix to the engine that holds it, where vLLM
itself reports the hit (`cached_tokens`). A router holding the index in its own process
(`--index-bootstrap-servers`, fed from the same topic) does the same. Against the same
engines, a router without the index (least load, ties in turn) splits the follow-ups.

The engines (the session's, shared with test_route_engines.py: tests/vllm/conftest.py) also
serve a LoRA adapter written by hand (`route_fleet.lora_adapter`; vLLM 0.32's CPU backend
runs it): a request with a `cache_salt`, and one naming the adapter (the router maps
its name to the adapter's path through the engines' `/v1/models`), are scored under their
salt and adapter: the index finds their blocks on the engine that served them, the bare
prompt matches none of them, and each follow-up goes to that engine, where vLLM hits them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support.route_fleet import (
    LORA,
    SEED,
    SERVED,
    SharedFleet,
    kvscope_service,
    router,
)

pytestmark = pytest.mark.vllm

BLOCK = 32


def complete(
    url: str, prompt: list[int], salt: str | None = None, model: str = SERVED
) -> tuple[str, int]:
    """(engine that served it, tokens vLLM found cached) of a 1-token completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    answer = httpx.post(f"{url}/v1/completions", content=json.dumps(body),
                        headers={"Content-Type": "application/json"}, timeout=120)  # fmt: skip
    assert answer.status_code == 200, answer.text
    details = answer.json()["usage"].get("prompt_tokens_details") or {}
    return answer.headers["x-kvscope-engine"], int(details.get("cached_tokens") or 0)


def held(index: str, prompt: list[int], **keys: str) -> dict[str, int]:
    """Tokens of the prompt each instance holds as its own events say (hints left out);
    `keys`: the score request's `cache_salt`, `lora_name` and `lora_path`."""
    body = {"token_ids": prompt, "model": SERVED, **keys}
    answer = httpx.post(f"{index}/score", json=body)
    if answer.status_code != 200:
        return {}
    return {s["instance"]: s["matched_tokens"] - BLOCK * s.get("speculative_blocks", 0)
            for s in answer.json()["sources"]}  # fmt: skip


def wait_indexed(
    index: str, prompt: list[int], engine: str, timeout_s: float = 30, **keys: str
) -> None:
    """Until the index says `engine` holds the prompt's full blocks (its events arrived);
    `keys` as for `held`."""
    want = len(prompt) // BLOCK * BLOCK
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if held(index, prompt, **keys).get(engine, 0) >= want:
            return
        time.sleep(0.2)
    raise AssertionError(f"the index never showed {engine} holding the prompt")


def applied_events(router_url: str) -> float:
    """Block events the router's own index applied (its /metrics)."""
    page = httpx.get(f"{router_url}/metrics", timeout=10).text
    for line in page.splitlines():
        if line.startswith("kvscope_index_applied_events_total "):
            return float(line.split()[1])
    return 0.0


def wait_applied(router_url: str, before: float, timeout_s: float = 30) -> None:
    """Until the router's own index applied events beyond `before` (a turn's stores)."""
    deadline = time.monotonic() + timeout_s
    while applied_events(router_url) <= before:
        assert time.monotonic() < deadline, "the router's index applied nothing new"
        time.sleep(0.2)


def wait_index_ready(router_url: str, timeout_s: float = 60) -> None:
    """Until the router's /healthz says its index is ready (until then, and whenever it is
    not, the router routes by load: it fails open)."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{router_url}/healthz", timeout=10).json()["index"]["state"] != "ok":
        assert time.monotonic() < deadline, "the router never saw its index ready"
        time.sleep(0.2)


def families(count: int) -> list[list[int]]:
    """Conversation prefixes of 4 full blocks, distinct tokens per family."""
    return [[10 + 40 * f + (t % 37) for t in range(4 * BLOCK)] for f in range(count)]


def test_route_by_the_real_index_keeps_follow_ups_where_their_prefix_is(
    route_fleet: SharedFleet, tmp_path: Path
) -> None:
    bootstrap_servers, topic_prefix = route_fleet.bootstrap_servers, route_fleet.topic_prefix
    lora = {"lora_name": LORA, "lora_path": str(route_fleet.adapter)}
    spec = ",".join(f"e{i}={url}" for i, url in enumerate(route_fleet.urls))
    index_args = ["--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix,
                  "--hash-seed", SEED]  # fmt: skip
    with (
        kvscope_service("index", *index_args, work=tmp_path, ready_s=120) as index,
        router(
            "--engines",
            spec,
            "--index",
            index,
            "--index-timeout",
            "2",
            "--health-interval",
            "60",
            work=tmp_path,
        ) as url,
    ):
        routed = run_families(url, index, families(2))
        salted, adapted = families(8)[6:]
        salted_on, _ = complete(url, [*salted, 401], salt="tenant-a")
        wait_indexed(index, salted, salted_on, cache_salt="tenant-a")
        unsalted = held(index, salted)
        salted_again = complete(url, [*salted, 402], salt="tenant-a")
        lora_on, _ = complete(url, [*adapted, 403], model=LORA)
        wait_indexed(index, adapted, lora_on, **lora)
        base_model = held(index, adapted)
        lora_again = complete(url, [*adapted, 404], model=LORA)
        metrics = httpx.get(f"{url}/metrics").text
    embedded = ["--index-bootstrap-servers", bootstrap_servers, "--topic-prefix",
                topic_prefix, "--hash-seed", SEED]  # fmt: skip
    with kvscope_service("route", "--engines", spec, *embedded, work=tmp_path,
                         ready_s=120) as url:  # fmt: skip
        health = httpx.get(f"{url}/healthz").json()
        in_process = run_families(url, None, families(6)[4:], wait=wait_applied)
    with router("--engines", spec, work=tmp_path) as url:
        blind = run_families(url, None, families(4)[2:])

    for mode in (routed, in_process):  # every follow-up on the family's engine, a hit there
        for family in mode:
            first, follow_ups = family[0][0], family[1:]
            assert all(engine == first for engine, _ in follow_ups), mode
            assert all(cached >= 4 * BLOCK for _, cached in follow_ups), mode
        assert len({family[0][0] for family in mode}) == 2  # the two families spread out
    assert "kvscope_route_predicted_hit_tokens_total" in metrics
    assert unsalted.get(salted_on, 0) == 0  # the salted blocks are no match for the bare prompt
    assert salted_again == (salted_on, 4 * BLOCK)  # to its salted blocks; vLLM hit them
    assert base_model.get(lora_on, 0) == 0  # nor the adapter's blocks for the base model
    assert lora_again == (lora_on, 4 * BLOCK)  # to the adapter's blocks; vLLM hit them
    assert health["index"]["at"].startswith(f"in process, reading {topic_prefix}kv-events"), health
    blind_hits = sum(c >= 4 * BLOCK for family in blind for _, c in family[1:])
    routed_hits = sum(c >= 4 * BLOCK for family in routed for _, c in family[1:])
    assert routed_hits > blind_hits, (routed, blind)


def run_families(
    url: str,
    index: str | None,
    prefixes: list[list[int]],
    wait: Callable[[str, float], None] | None = None,
) -> list[list[tuple[str, int]]]:
    """Each family's first turn (waiting until the index has it: `index`'s /score, or
    `wait(url, applied events before)` for the router's own), then each family's 3
    follow-ups, once the router sees its index ready (an index with nothing published yet is
    not: the first turns may go by load); (engine, cached tokens) per request, per family."""
    served: list[list[tuple[str, int]]] = []
    for f, prefix in enumerate(prefixes):
        before = applied_events(url) if wait else 0.0
        engine, cached = complete(url, [*prefix, 400 + f])
        if index is not None:
            wait_indexed(index, prefix, engine)
        if wait is not None:
            wait(url, before)
        served.append([(engine, cached)])
    if index is not None or wait is not None:
        wait_index_ready(url)
    for f, prefix in enumerate(prefixes):
        served[f] += [complete(url, [*prefix, 450 + 10 * f + turn]) for turn in range(3)]
    return served
