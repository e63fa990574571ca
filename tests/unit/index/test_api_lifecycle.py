"""The index's HTTP answers about its feed and its limits: /healthz reasons, `ready` in
/score, DELETE /sources/{instance}, the per-request token cap (a real PrefixIndex)."""

from __future__ import annotations

import pytest
from kvscope.index.api import IndexApi
from kvscope.index.hashing import BlockHasher
from kvscope.index.health import FeedStatus
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch
from starlette.testclient import TestClient

AUTH = {"Authorization": "Bearer t0k"}


def _index(instances: dict[str, int]) -> PrefixIndex:
    index = PrefixIndex()
    for instance, ranks in instances.items():
        for rank in range(ranks):
            body = KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=[1, 2], block_size=4)])
            source = Source(instance=instance, dp_rank=rank, model="m")
            index.apply(Envelope(source=source, epoch=1, seq=0, ts=1.0, body=body))  # type: ignore[arg-type]
    return index


CURRENT = FeedStatus()
"""A feed that is connected and caught up."""


def _client(status: FeedStatus = CURRENT, max_tokens: int = 1000) -> TestClient:
    api = IndexApi(
        _index({"a": 2, "b": 1}),
        BlockHasher(),
        token="t0k",
        status=lambda: status,
        max_tokens=max_tokens,
    )
    return TestClient(api.app())


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (FeedStatus(), 200, None),
        (FeedStatus(connected=False, caught_up=False), 503, "connecting to Kafka"),
        (FeedStatus(connected=False, since=1.0, last_error="KafkaError: gone"), 503, "gone"),
        (FeedStatus(caught_up=False), 503, "not caught up"),
    ],
)
def test_healthz_is_200_only_when_current_and_says_why_not(
    status: FeedStatus, code: int, reason: str | None
) -> None:
    client = _client(status)
    answer = client.get("/healthz")
    assert answer.status_code == code
    body = answer.json()
    assert body["ok"] is (code == 200) and body["connected"] is status.connected
    assert (body["reason"] is None) if reason is None else (reason in body["reason"])
    score = client.post("/score", json={"block_hashes": [1, 2]}, headers=AUTH).json()
    assert score["ready"] is (code == 200)
    assert len(score["sources"]) == 3  # answers go on from the state it holds
    assert '"connected"' in client.get("/sources", headers=AUTH).headers["x-kvscope-feed"]


def test_delete_forgets_one_rank_or_every_rank_and_needs_the_token() -> None:
    client = _client()
    assert client.delete("/sources/a").status_code == 401
    assert client.delete("/sources/a?dp_rank=1", headers=AUTH).json() == {
        "ok": True,
        "forgotten": 1,
    }
    rows = {(r["instance"], r["dp_rank"]) for r in client.get("/sources", headers=AUTH).json()}
    assert rows == {("a", 0), ("b", 0)}
    assert client.delete("/sources/a", headers=AUTH).json()["forgotten"] == 1
    gone = client.delete("/sources/a", headers=AUTH)
    assert gone.status_code == 404 and "GET /sources" in gone.json()["error"]
    assert client.delete("/sources/b?dp_rank=x", headers=AUTH).status_code == 400


@pytest.mark.parametrize("cap", [1, 64, 1000])
@pytest.mark.parametrize("path", ["/score", "/routed"])
def test_requests_over_the_token_cap_are_413_and_at_the_cap_are_answered(
    cap: int, path: str
) -> None:
    client = _client(max_tokens=cap)
    extra = {"instance": "b"} if path == "/routed" else {}
    at_cap = client.post(path, json={"block_hashes": list(range(cap)), **extra}, headers=AUTH)
    assert at_cap.status_code == 200
    for body in ({"block_hashes": list(range(cap + 1))}, {"token_ids": [1] * (cap + 1)}):
        over = client.post(path, json={**body, "model": "m", **extra}, headers=AUTH)
        assert over.status_code == 413
        assert f"cap of {cap:,}" in over.json()["error"]
