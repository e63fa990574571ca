"""`kvscope route` in front of two real vLLM API servers (tiny Llama, CPU): it forwards,
streams chunk by chunk, skips a dead engine, answers bad input with a 4xx JSON error, serves
by load past an unreachable index, and tokenizes text exactly as the engines do.

The engines start once for the session (minutes on a loaded 2-core machine), shared with
test_route_index_e2e.py (tests/vllm/conftest.py); each test starts its own router (about a
second).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from kvscope.local.broker import free_port
from kvscope.route.tokens import LocalTokenizer
from prometheus_client import generate_latest
from support.route_fleet import LORA, SERVED, SharedFleet, router

pytestmark = pytest.mark.vllm

PROMPTS = [list(range(3, 3 + 40 + 8 * i)) for i in range(4)]
CHAT = [{"role": "user", "content": "the cache block token prefix hit"}]


@pytest.fixture
def model(route_fleet: SharedFleet) -> Path:
    """The tiny model with a chat template."""
    return route_fleet.model


@pytest.fixture
def fleet(route_fleet: SharedFleet) -> list[str]:
    """Two engines of the tiny model (the session's, shared with test_route_index_e2e.py)."""
    return route_fleet.urls


def post(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    return httpx.post(url, content=content, headers=headers, timeout=120, **kwargs)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text page (0 if absent), labels in any order."""
    for line in text.splitlines():
        found = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or "")) == labels:
            return float(found.group(2))
    return 0.0


def test_forwards_completions_and_models_taking_turns(fleet: list[str], tmp_path: Path) -> None:
    names = {f"e{i}": url for i, url in enumerate(fleet)}
    spec = ",".join(f"{n}={u}" for n, u in names.items())
    with router("--engines", spec, work=tmp_path) as url:
        served: Counter[str] = Counter()
        for prompt in [*PROMPTS, "the cache block token prefix"]:
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            routed = post(f"{url}/v1/completions", body)
            assert routed.status_code == 200, routed.text
            engine = routed.headers["x-kvscope-engine"]
            assert re.fullmatch(r"kvscope-route;dur=\d+\.\d{3}", routed.headers["server-timing"])
            served[engine] += 1
            direct = post(f"{names[engine]}/v1/completions", body).json()
            answer = routed.json()
            assert answer["choices"][0]["text"] == direct["choices"][0]["text"]
            assert answer["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        assert sorted(served.values()) == [2, 3]  # nothing cached, no load: turns
        models = httpx.get(f"{url}/v1/models", timeout=30)
        assert [m["id"] for m in models.json()["data"]] == [SERVED, LORA]  # the engines' own
        page = httpx.get(f"{url}/metrics").text
        for name, count in served.items():
            assert metric(page, "kvscope_route_decisions_total", engine=name, basis="load") == count
            assert metric(page, "kvscope_route_in_flight", engine=name) == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streams_pass_through_chunk_by_chunk(fleet: list[str], tmp_path: Path, path: str) -> None:
    body: dict[str, Any] = {"model": SERVED, "max_tokens": 12, "temperature": 0, "stream": True,
                            "ignore_eos": True}  # fmt: skip
    body.update({"prompt": PROMPTS[1]} if path.endswith("/completions") and "chat" not in path
                else {"messages": CHAT})  # fmt: skip

    async def stream(base: str) -> tuple[list[str], int, str]:
        async with (
            httpx.AsyncClient(timeout=120) as client,
            client.stream("POST", base + path, json=body) as answer,
        ):
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            chunks = [chunk async for chunk in answer.aiter_raw()]
            events = [e for e in b"".join(chunks).decode().split("\n\n") if e]
            return events, len(chunks), answer.headers.get("x-kvscope-engine", "")

    with router("--engines", ",".join(fleet), work=tmp_path) as url:
        events, chunks, engine = asyncio.run(stream(url))
        direct, _, _ = asyncio.run(stream(fleet[0]))
    assert engine and events[-1] == "data: [DONE]"
    # One event per detokenized piece (vLLM may merge tokens into one delta), then [DONE];
    # relayed as they came, not as one buffered body.
    assert len(events) >= 4 and len(direct) >= 4
    assert chunks >= len(events) // 2

    def text(events: list[str]) -> str:
        parts = [json.loads(e.removeprefix("data: "))["choices"] for e in events[:-1]]
        return "".join(c[0].get("text") or c[0].get("delta", {}).get("content") or ""
                       for c in parts if c)  # fmt: skip

    assert text(events) == text(direct)


def test_a_dead_engine_is_skipped(fleet: list[str], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    spec = f"dead={dead},{fleet[0]},{fleet[1]}"
    with router("--engines", spec, "--health-interval", "60", work=tmp_path) as url:
        health = httpx.get(f"{url}/healthz").json()
        assert health["ok"] and health["engines"]["dead"] == "down"
        for prompt in PROMPTS:
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 2}
            answer = post(f"{url}/v1/completions", body)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-kvscope-engine"] != "dead"
        page = httpx.get(f"{url}/metrics").text
    assert metric(page, "kvscope_route_engine_up", engine="dead") == 0
    assert metric(page, "kvscope_route_engine_errors_total", engine="dead", kind="health") >= 1


def test_bad_input_is_4xx_and_an_unreachable_index_no_error(
    fleet: list[str], tmp_path: Path
) -> None:
    index = f"http://127.0.0.1:{free_port()}"
    with router("--engines", ",".join(fleet), "--index", index, work=tmp_path) as url:
        answers = {
            "not json": post(f"{url}/v1/completions", b"{"),
            "no prompt": post(f"{url}/v1/completions", {"model": SERVED}),
            "engine refuses": post(
                f"{url}/v1/chat/completions",
                {"model": SERVED, "messages": [{"role": "user", "content": 5}]},
            ),
            "text, no index": post(f"{url}/v1/completions", {"model": SERVED, "prompt": "hi"}),
            "chat, no index": post(
                f"{url}/v1/chat/completions", {"model": SERVED, "messages": CHAT}
            ),
            "ids, no index": post(f"{url}/v1/completions", {"model": SERVED, "prompt": [5, 6]}),
        }
    for what, answer in answers.items():
        assert "Traceback" not in answer.text
        if "no index" in what:
            assert answer.status_code == 200, (what, answer.text)
        else:
            assert 400 <= answer.status_code < 500, (what, answer.text)
            assert answer.json()["error"]["message"]


def test_local_tokenizer_matches_the_engines_tokenize(fleet: list[str], model: Path) -> None:
    local = LocalTokenizer(str(model))
    texts = ["the cache", "alpha beta gamma " * 20, "  spaces\tand\nlines  ", "kafka"]
    for text in texts:
        for special in (True, False):
            engine = post(
                f"{fleet[0]}/tokenize",
                {"model": SERVED, "prompt": text, "add_special_tokens": special},
            ).json()["tokens"]
            assert asyncio.run(local.completion(text, SERVED, special)) == engine
    for messages in (CHAT, [*CHAT, {"role": "assistant", "content": "ok"}, *CHAT]):
        request = {"model": SERVED, "messages": messages}
        engine = post(f"{fleet[0]}/tokenize", request).json()["tokens"]
        assert asyncio.run(local.chat(request)) == engine


def chained_hashes(ids: list[int], block_size: int = 32) -> list[int]:
    """Block hashes of full blocks, each chained to the previous one (the shape of vLLM's)."""
    hashes: list[int] = []
    for end in range(block_size, len(ids) + 1, block_size):
        parent = hashes[-1] if hashes else 0
        hashes.append(hash((parent, *ids[end - block_size : end])) & (2**64 - 1))
    return hashes


def test_routes_by_an_in_process_index(fleet: list[str]) -> None:
    """A real `PrefixIndex` in the router's process, told that engine `b` stores a shared
    prefix: requests with that prefix go to `b` whatever the turn; an unknown prefix goes
    where load sends it, and its routed hint brings its follow-ups to the same engine."""
    from kvscope.index.state import PrefixIndex
    from kvscope.route.app import build_app
    from kvscope.route.config import EngineSpec, RouteConfig
    from kvscope.route.index_client import InProcessIndexClient
    from kvscope.schemas import Envelope, Source
    from kvscope.schemas.wire import BlockStored, KVEventBatch

    index = PrefixIndex()
    shared = list(range(3, 3 + 128))  # 4 blocks
    other = list(range(1000, 1000 + 64))
    for seq, (name, held) in enumerate((("a", other), ("b", shared))):  # b holds the prefix
        events = [BlockStored(block_hashes=chained_hashes(held), block_size=32,
                              token_count=len(held))]  # fmt: skip
        body = KVEventBatch(ts=float(seq), events=events)
        source = Source(instance=name, model=SERVED)
        index.apply(Envelope(source=source, epoch=1, seq=0, ts=float(seq), body=body))
    config = RouteConfig(engines=(EngineSpec("a", fleet[0]), EngineSpec("b", fleet[1])))
    app = build_app(config, index=InProcessIndexClient(index, chained_hashes))
    fresh = list(range(300, 300 + 70))

    async def exercise() -> list[tuple[str, str]]:
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://route", timeout=120) as c,
            app.router.lifespan_context(app),
        ):
            served = []
            requests = [("shared", [*shared, *[7] * (5 + i)]) for i in range(3)]
            requests += [("fresh", fresh), ("fresh", [*fresh, 9, 9]), ("shared", [*shared, 8]),
                         ("fresh", [*fresh, 5])]  # fmt: skip
            for label, prompt in requests:
                body = {"model": SERVED, "prompt": prompt, "max_tokens": 1}
                answer = await c.post("/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
                served.append((label, answer.headers["x-kvscope-engine"]))
                await asyncio.sleep(0.05)  # the routed hint lands
            return served

    served = asyncio.run(exercise())
    assert {engine for label, engine in served if label == "shared"} == {"b"}
    assert len({engine for label, engine in served if label == "fresh"}) == 1
    page = generate_latest().decode()
    assert metric(page, "kvscope_route_predicted_hit_tokens_total", engine="b") >= 4 * 128
