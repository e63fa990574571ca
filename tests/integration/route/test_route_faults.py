"""`kvscope route` under faults of its index and engines: every request a healthy engine can
serve is served, failing engines leave rotation for their own faults only, and a broken-off
answer reaches the client as an error.

The engines and the index are fakes (`support.route_fleet.FakeEngine`/`FakeIndex`, served by
uvicorn on loopback): they exist to be slow, stall, answer 5xx or break off on demand, which
real ones cannot. The router is the real app served by uvicorn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from kvscope.local.broker import free_port
from kvscope.route.app import build_app
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.route.engines import Fleet
from kvscope.route.http_client import HttpClient
from kvscope.route.lora import MISS_REFRESH_S
from prometheus_client import REGISTRY
from support.route_fleet import FakeEngine, FakeIndex, Servers

BODY = {"model": "tiny", "prompt": "hello there", "max_tokens": 4}


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@contextmanager
def fleet(
    engines: list[FakeEngine], index: FakeIndex | None = None, **settings: Any
) -> Iterator[httpx.Client]:
    """The fakes served, and a client of a router in front of them (settings: RouteConfig's;
    the index's budget 2 s unless given, so a loaded machine cannot turn a test of what the
    index answers into one of routing by load)."""
    settings.setdefault("index_timeout_s", 2.0)
    with Servers() as servers:
        specs = tuple(EngineSpec(e.name, servers.start(e)) for e in engines)
        index_url = servers.start(index) if index is not None else None
        config = RouteConfig(engines=specs, index_url=index_url, **settings)
        url = servers.start(build_app(config), lifespan="on")
        try:
            with httpx.Client(base_url=url, timeout=10) as client:
                yield client
        finally:
            for fake in (*engines, index):
                if fake is not None:
                    fake.release.set()


@pytest.mark.parametrize(
    ("mode", "healthy", "basis"),
    [
        ("slow", True, "index_timeout"),
        ("refuse", True, "index_refused"),
        ("not_ready", True, "index_not_ready"),
        ("5xx", True, "index_down"),
        ("ok", False, "index_not_ready"),
    ],
)
def test_a_failing_index_means_routing_by_load(mode: str, healthy: bool, basis: str) -> None:
    engines = [FakeEngine("a"), FakeEngine("b")]
    index = FakeIndex("a")
    index.mode, index.healthy = mode, healthy
    before = sum(metric("kvscope_route_decisions_total", engine=e.name, basis=basis)
                 for e in engines)  # fmt: skip
    budget = 0.05 if mode == "slow" else 2.0  # the slow index answers never: any budget runs out
    with fleet(engines, index, index_timeout_s=budget) as client:
        answers = [client.post("/v1/completions", json=BODY) for _ in range(6)]
        health = client.get("/healthz")
    assert [a.status_code for a in answers] == [200] * 6
    served = {a.json()["engine"] for a in answers}
    assert served == {"a", "b"}  # by load: round robin, not all to the index's holder
    after = sum(metric("kvscope_route_decisions_total", engine=e.name, basis=basis)
                for e in engines)  # fmt: skip
    assert after - before == 6
    assert health.status_code == 200
    assert health.json()["index"]["state"] == basis.removeprefix("index_")


def test_an_index_that_goes_away() -> None:
    engines = [FakeEngine("a"), FakeEngine("b")]
    with Servers() as servers:
        specs = tuple(EngineSpec(e.name, servers.start(e)) for e in engines)
        index_url = servers.start(FakeIndex("a"))
        config = RouteConfig(
            engines=specs, index_url=index_url, health_interval_s=0.1, index_timeout_s=2.0
        )
        with httpx.Client(base_url=servers.start(build_app(config), lifespan="on")) as client:
            first = [client.post("/v1/completions", json=BODY).json()["engine"] for _ in range(4)]
            servers.stop(index_url)  # its port refuses now
            gone = [client.post("/v1/completions", json=BODY) for _ in range(4)]
            health = client.get("/healthz").json()
    assert first == ["a"] * 4  # the index's holder while it answers
    assert [a.status_code for a in gone] == [200] * 4
    assert {a.json()["engine"] for a in gone} == {"a", "b"}
    assert health["index"]["state"] == "down"


def test_an_index_that_catches_up_is_used_again() -> None:
    index = FakeIndex("a")
    index.healthy = False
    with fleet([FakeEngine("a"), FakeEngine("b")], index, health_interval_s=0.1) as client:
        early = [client.post("/v1/completions", json=BODY).json()["engine"] for _ in range(4)]
        index.healthy = True
        while client.get("/healthz").json()["index"]["state"] != "ok":
            threading.Event().wait(0.05)
        late = [client.post("/v1/completions", json=BODY).json()["engine"] for _ in range(4)]
    assert sorted(early) == ["a", "a", "b", "b"]  # by load while it catches up
    assert late == ["a"] * 4  # its holder once it is ready


@pytest.mark.parametrize("after", [1, 3])
def test_an_engine_answering_5xx_is_ejected_and_a_4xx_never_counts(after: int) -> None:
    bad, client_error, good = FakeEngine("bad"), FakeEngine("c4xx"), FakeEngine("good")
    bad.mode, client_error.mode = "5xx", "4xx"
    requests = 12
    with fleet([bad, client_error, good], eject_after=after, max_ejected_share=0.5) as client:
        answers = [client.post("/v1/completions", json=BODY) for _ in range(requests)]
        health = client.get("/healthz").json()
    by_engine = [a.headers["x-kvscope-engine"] for a in answers]
    assert by_engine.count("bad") == after  # ejected at its `after`-th failure in a row
    assert by_engine.count("c4xx") >= requests // 3  # a client's 4xx is no engine fault
    assert health["engines"] == {"bad": "ejected", "c4xx": "up", "good": "up"}
    assert metric("kvscope_route_ejections_total", engine="c4xx") == 0


def test_at_most_the_allowed_share_is_ejected() -> None:
    engines = [FakeEngine(f"e{i}") for i in range(4)]
    for engine in engines[:3]:
        engine.mode = "5xx"
    with fleet(engines, eject_after=1, max_ejected_share=0.5) as client:
        for _ in range(12):
            client.post("/v1/completions", json=BODY)
        states = client.get("/healthz").json()["engines"]
    assert list(states.values()).count("ejected") == 2
    assert states["e3"] == "up"


def test_a_stalled_holder_of_the_prefix_stops_drawing_its_traffic() -> None:
    holder, other = FakeEngine("holder"), FakeEngine("other")
    index = FakeIndex("holder")
    holder.mode = "stall"
    streamed = {**BODY, "stream": True}
    before = metric("kvscope_route_engine_errors_total", engine="holder", kind="stall")
    with fleet([holder, other], index, stall_s=0.3, health_interval_s=0.05) as client:
        stuck = threading.Thread(target=lambda: client.post("/v1/completions", json=streamed))
        stuck.start()
        while not holder.seen:
            threading.Event().wait(0.01)
        threading.Event().wait(0.5)
        answers = [client.post("/v1/completions", json=streamed) for _ in range(3)]
        holder.release.set()
        stuck.join()
    assert [a.headers["x-kvscope-engine"] for a in answers] == ["other"] * 3
    assert all(a.text.endswith("data: [DONE]\n\n") for a in answers)
    assert metric("kvscope_route_engine_errors_total", engine="holder", kind="stall") == before + 1


def test_a_break_off_mid_body_is_a_502() -> None:
    engine = FakeEngine("cut")
    engine.mode = "break_body"
    before = metric("kvscope_route_break_offs_total", engine="cut")
    with fleet([engine]) as client:
        answer = client.post("/v1/completions", json=BODY)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == 502
    assert metric("kvscope_route_break_offs_total", engine="cut") == before + 1


def test_a_break_off_mid_stream_is_an_error_event_and_a_dropped_connection() -> None:
    engine = FakeEngine("cut")
    engine.mode = "break_stream"
    received: list[bytes] = []
    with (
        fleet([engine]) as client,
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as answer,
    ):
        assert answer.status_code == 200
        received.extend(answer.iter_raw())
    text = b"".join(received).decode()
    assert '"error"' in text and "broke off" in text
    assert "[DONE]" not in text


@pytest.mark.parametrize("fault", ["slow", "5xx"])
def test_a_failing_tokenize_routes_by_load_and_keeps_the_engine(fault: str) -> None:
    engines = [FakeEngine("a"), FakeEngine("b")]
    for engine in engines:
        engine.tokenize = fault
    with fleet(engines, FakeIndex("a"), tokenize_timeout_s=0.2) as client:
        answers = [client.post("/v1/completions", json=BODY) for _ in range(4)]
        health = client.get("/healthz").json()
    assert [a.status_code for a in answers] == [200] * 4
    assert sum(len(e.tokenized) for e in engines) == 4  # one engine's /tokenize per request
    assert health["engines"] == {"a": "up", "b": "up"}


def test_a_prompt_the_engine_refuses_is_the_clients_4xx() -> None:
    engine = FakeEngine("a")
    engine.tokenize = "4xx"
    with fleet([engine], FakeIndex("a")) as client:
        answer = client.post("/v1/completions", json=BODY)
    assert answer.status_code == 400 and "tokenize says 400" in answer.text


def test_a_20_mb_prompt_is_a_413_and_the_next_is_served() -> None:
    """The body limit refuses it before any engine is asked; nothing is marked down."""
    engines = [FakeEngine("a"), FakeEngine("b")]
    with fleet(engines, FakeIndex("a")) as client:
        huge = client.post("/v1/completions", json={**BODY, "prompt": "y" * (20 << 20)})
        normal = client.post("/v1/completions", json=BODY)
        health = client.get("/healthz").json()
    assert huge.status_code == 413 and "--max-body-bytes" in huge.json()["error"]["message"]
    assert normal.status_code == 200
    assert all(len(e.tokenized) <= 1 for e in engines)  # only the normal request tokenized
    assert health["engines"] == {"a": "up", "b": "up"}


@pytest.mark.parametrize("chars", [4 << 20, 50_000])
def test_a_huge_prompt_is_cut_before_tokenizing_and_the_next_is_served(chars: int) -> None:
    engines = [FakeEngine("a"), FakeEngine("b")]
    index = FakeIndex("a")
    cap = 1000
    with fleet(engines, index, max_hash_tokens=cap) as client:
        huge = client.post("/v1/completions", json={**BODY, "prompt": "y" * chars})
        normal = client.post("/v1/completions", json=BODY)
    assert huge.status_code == 200 and normal.status_code == 200
    assert max(n for e in engines for n in e.tokenized) <= cap * 16
    assert len(index.scored[0]["token_ids"]) <= cap


def test_token_ids_past_the_cap_are_capped() -> None:
    index = FakeIndex("a")
    before = metric("kvscope_route_capped_prompts_total")
    with fleet([FakeEngine("a")], index, max_hash_tokens=4096) as client:
        answer = client.post("/v1/completions", json={**BODY, "prompt": [7] * 200_000})
    assert answer.status_code == 200
    assert len(index.scored[0]["token_ids"]) == 4096
    assert metric("kvscope_route_capped_prompts_total") == before + 1


@pytest.mark.parametrize(
    ("router_token", "engine_key", "sent", "expected"),
    [
        (None, None, "Bearer client-key-000000", "Bearer client-key-000000"),
        (None, "engine-key-0000000", "Bearer client-key-000000", "Bearer engine-key-0000000"),
        ("router-token-0000000", None, "Bearer router-token-0000000", None),
        ("router-token-0000000", "engine-key-0000000", "Bearer router-token-0000000",
         "Bearer engine-key-0000000"),
    ],
)  # fmt: skip
def test_engine_auth_and_encodings(
    router_token: str | None, engine_key: str | None, sent: str, expected: str | None
) -> None:
    engine = FakeEngine("a")
    with fleet([engine], token=router_token, engine_api_key=engine_key) as client:
        plain = client.post(
            "/v1/completions",
            json=BODY,
            headers={"Authorization": sent, "Accept-Encoding": "identity"},
        )
        zipped = client.post(
            "/v1/completions", json=BODY, headers={"Authorization": sent, "Accept-Encoding": "gzip"}
        )
    assert plain.status_code == 200 and zipped.status_code == 200
    assert [h.get("authorization") for h in engine.seen] == [expected, expected]
    assert engine.seen[0]["accept-encoding"] == "identity"
    assert zipped.headers["content-encoding"] == "gzip" and zipped.json()["engine"] == "a"


def test_cache_salt_reaches_the_index_and_unknown_sources_are_no_error() -> None:
    index = FakeIndex("a")
    unknown = metric("kvscope_route_hints_unknown_source_total")
    errors = metric("kvscope_route_index_errors_total", call="routed")
    with fleet([FakeEngine("a")], index) as client:
        answer = client.post("/v1/completions", json={**BODY, "cache_salt": "tenant-7"})
        while not index.routed:
            threading.Event().wait(0.01)
        salt = client.post("/v1/completions", json={**BODY, "cache_salt": ""})
    assert answer.status_code == 200 and salt.status_code == 400
    assert index.scored[0]["cache_salt"] == "tenant-7"
    assert metric("kvscope_route_hints_unknown_source_total") == unknown + 1
    assert metric("kvscope_route_index_errors_total", call="routed") == errors


@pytest.mark.parametrize("loaded", ["before_start", "at_runtime"])
def test_a_lora_request_is_scored_under_its_base_model_with_its_adapter(loaded: str) -> None:
    """An adapter listed at start, or loaded later (found by its first request)."""
    engine = FakeEngine("a")
    adapters = [{"id": "sql", "root": "/adapters/sql-v2", "parent": "tiny"}]
    if loaded == "before_start":
        engine.adapters = adapters
    index = FakeIndex("a")
    with fleet([engine], index) as client:
        engine.adapters = adapters
        lora = client.post("/v1/completions", json={**BODY, "model": "sql"})
        base = client.post("/v1/completions", json=BODY)
        lists = engine.calls["/v1/models"]
        started = time.monotonic()
        unknown = [client.post("/v1/completions", json={**BODY, "model": "x"}) for _ in range(6)]
        took = time.monotonic() - started
    assert lora.status_code == 200 and base.status_code == 200
    keys = [(s["model"], s["lora_name"], s["lora_path"]) for s in index.scored]
    assert keys[:2] == [("tiny", "sql", "/adapters/sql-v2"), ("tiny", None, None)]
    assert lists == (1 if loaded == "before_start" else 2)  # at start, and for "sql" unlisted
    assert [a.status_code for a in unknown] == [200] * 6
    # unknown names: at most one read per MISS_REFRESH_S, not one per request
    assert engine.calls["/v1/models"] - lists <= 1 + int(took / MISS_REFRESH_S)


def test_health_checks_skip_engines_whose_answers_show_them_up() -> None:
    """An engine that sent a first byte within the interval is not asked for /health; an
    idle one and a down one are (the one whose port refuses is marked down)."""
    engines = [FakeEngine("busy"), FakeEngine("idle")]
    now = [1000.0]
    with Servers() as servers:
        specs = [EngineSpec(e.name, servers.start(e)) for e in engines]
        dead = EngineSpec("dead", f"http://127.0.0.1:{free_port()}")
        state = Fleet(RouteConfig(engines=(*specs, dead)), clock=lambda: now[0])
        for name in ("busy", "idle", "dead"):
            state.answered(name, state.sent(name, streamed=False))
        now[0] += 1.5
        state.answered("busy", state.sent("busy", streamed=False))

        async def check() -> None:
            client = HttpClient(connect_timeout_s=2.0, read_timeout_s=600.0)
            try:
                await state.check_health(client, 2.0, {}, idle_s=1.0)
            finally:
                await client.close()

        before = {n: metric("kvscope_route_engine_errors_total", engine=n, kind="health")
                  for n in ("busy", "idle", "dead")}  # fmt: skip
        asyncio.run(check())
    assert [e.calls["/health"] for e in engines] == [0, 1]
    assert state.engines["idle"].last_health == now[0]
    assert [state.describe(n) for n in ("busy", "idle", "dead")] == ["up", "up", "down"]
    after = {n: metric("kvscope_route_engine_errors_total", engine=n, kind="health") - was
             for n, was in before.items()}  # fmt: skip
    assert after == {"busy": 0, "idle": 0, "dead": 1}


def test_healthz_is_503_when_no_engine_can_be_routed_to() -> None:
    engine = FakeEngine("a")
    with fleet([engine], eject_after=1) as client:
        up = client.get("/healthz")
        engine.mode = "5xx"
        client.post("/v1/completions", json=BODY)
        down = client.get("/healthz")
    assert up.status_code == 200 and up.json()["ok"] is True
    assert up.json()["index"] == {"state": "none"}
    assert down.status_code == 503 and down.json() == {
        "ok": False, "engines": {"a": "ejected"}, "index": {"state": "none"}
    }  # fmt: skip
