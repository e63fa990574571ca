"""The index's HTTP API over a real PrefixIndex: answers, bad input as 4xx JSON, the token;
the hostile inputs over a real uvicorn on 127.0.0.1 (the HTTP base's limits in place)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from kvscope.index.api import IndexApi
from kvscope.index.config import IndexConfig
from kvscope.index.hashing import BlockHasher
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Source
from kvscope.schemas.errors import ConfigError
from kvscope.schemas.wire import BlockStored, KVEventBatch
from starlette.testclient import TestClient
from support.live_http import body_bytes, live, raw_request

TOKENS = list(range(100, 164))


def _index(hasher: BlockHasher) -> PrefixIndex:
    index = PrefixIndex()
    held = hasher.block_hashes(TOKENS, 16)
    for n, (instance, blocks) in enumerate([("a", 4), ("b", 2), ("c", 0)]):
        events = [BlockStored(block_hashes=held[:blocks], block_size=16)] if blocks else []
        index.apply(
            Envelope(
                source=Source(instance=instance, model="m"),
                epoch=n + 1,
                seq=0,
                ts=1.0,
                body=KVEventBatch(ts=1.0, events=events),  # type: ignore[arg-type]
            )
        )
    return index


@pytest.fixture
def client() -> TestClient:
    hasher = BlockHasher()
    return TestClient(IndexApi(_index(hasher), hasher, token="t0k").app())


AUTH = {"Authorization": "Bearer t0k"}


def test_score_by_token_ids_and_by_hashes_agree(client: TestClient) -> None:
    by_tokens = client.post("/score", json={"token_ids": TOKENS, "model": "m"}, headers=AUTH)
    assert by_tokens.status_code == 200
    rows = {r["instance"]: r for r in by_tokens.json()["sources"]}
    assert {k: r["matched_blocks"] for k, r in rows.items()} == {"a": 4, "b": 2, "c": 0}
    assert rows["a"]["matched_tokens"] == 64 and rows["a"]["stale"] is False
    hashes = BlockHasher().block_hashes(TOKENS, 16)
    by_hashes = client.post("/score", json={"block_hashes": hashes}, headers=AUTH)
    assert by_hashes.json()["sources"] == by_tokens.json()["sources"]


def test_routed_hints_then_sources_and_resident(client: TestClient) -> None:
    hashes = BlockHasher().block_hashes(TOKENS, 16)
    answer = client.post("/routed", json={"block_hashes": hashes, "instance": "c"}, headers=AUTH)
    assert answer.status_code == 200
    rows = client.post("/score", json={"block_hashes": hashes}, headers=AUTH).json()["sources"]
    c = next(r for r in rows if r["instance"] == "c")
    assert (c["matched_blocks"], c["speculative_blocks"]) == (4, 4)
    sources = client.get("/sources", headers=AUTH).json()
    assert {(s["instance"], s["resident"]) for s in sources} == {("a", 4), ("b", 2), ("c", 0)}
    assert set(sources[0]) >= {"instance", "dp_rank", "epoch", "resident", "stale", "lag_s"}
    page = client.get("/resident?instance=a&dp_rank=0&limit=3", headers=AUTH).json()
    rest = client.get(f"/resident?instance=a&dp_rank=0&after={page['next']}", headers=AUTH).json()
    assert sorted(page["hashes"] + rest["hashes"]) == sorted(hashes[:4]) and rest["next"] is None


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", "/score", b"not json", 400),
        ("post", "/score", b"{}", 400),
        ("post", "/score", b'{"block_hashes": [-1]}', 400),
        ("post", "/score", b'{"block_hashes": [18446744073709551616]}', 400),
        ("post", "/score", b'{"block_hashes": ["x"]}', 400),
        ("post", "/score", b'{"token_ids": [1, 2]}', 400),
        ("post", "/score", b'{"token_ids": [1], "model": "nope"}', 404),
        ("post", "/score", b'{"token_ids": [1], "block_hashes": [1], "model": "m"}', 400),
        ("post", "/score", b'{"block_hashes": [1], "surprise": 1}', 400),
        ("post", "/routed", b'{"block_hashes": [1]}', 400),
        ("post", "/routed", b'{"block_hashes": [1], "instance": "zz"}', 404),
        ("get", "/resident", None, 400),
        ("get", "/resident?instance=a&limit=0", None, 400),
        ("get", "/resident?instance=a&dp_rank=x", None, 400),
        ("get", "/resident?instance=zz", None, 404),
        ("get", "/resident?instance=a&after=junk", None, 400),
        ("get", "/resident?instance=a&after=99.0", None, 409),
        ("get", "/score", None, 405),
    ],
)
def test_bad_input_is_a_one_line_json_error(
    client: TestClient, method: str, path: str, body: bytes | None, status: int
) -> None:
    answer = client.request(method, path, content=body, headers=AUTH)
    assert answer.status_code == status
    if status != 405:
        assert "\n" not in answer.json()["error"]


def test_the_token_guards_all_but_healthz(client: TestClient) -> None:
    assert client.get("/sources").status_code == 401
    assert client.get("/sources", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/healthz").status_code == 200
    metrics = client.get("/metrics", headers=AUTH)
    assert metrics.status_code == 200 and "kvscope_index_resident_hashes" in metrics.text


@pytest.fixture(scope="module")
def served() -> Iterator[httpx.Client]:
    """The API with the default limits, served by uvicorn on a free loopback port."""
    hasher = BlockHasher()
    app = IndexApi(_index(hasher), hasher, token="t0k").app()
    with live(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


DEEP = b'{"block_hashes": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", "/score", b'{"token_ids": [1], "model": "m\xff"}', 400),
        ("post", "/score", b'{"block_hashes": [1], "x": "\xc3"}', 400),
        ("post", "/score", DEEP, 400),
        ("post", "/score", b'{"block_hashes": [1], "x": ' + b"[" * 65 + b"]" * 65 + b"}", 400),
        ("get", "/resident?instance=a&limit=--5", None, 400),
        ("get", "/resident?instance=a&limit=\u00b2", None, 400),
        ("get", "/resident?instance=a&dp_rank=\u0663", None, 400),
        ("get", "/resident?instance=a&after=0." + "9" * 5000, None, 400),
        ("get", "/resident?instance=a&after=" + "9" * 5000 + ".0", None, 400),
        ("get", "/resident?instance=" + "a" * 5000, None, 400),
        ("get", "/nope", None, 404),
        ("post", "/score/", b'{"block_hashes": [1]}', 404),
        ("get", "/score", None, 405),
        ("delete", "/sources", None, 405),
    ],
)
def test_hostile_input_over_http_is_a_json_4xx(
    served: httpx.Client, method: str, path: str, body: bytes | None, status: int
) -> None:
    answer = served.request(method, path, content=body, headers=AUTH)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert isinstance(error, str) and error and "\n" not in error


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_scheme_is_case_insensitive_and_a_wrong_token_is_json(
    served: httpx.Client, scheme: str
) -> None:
    assert served.get("/sources", headers={"Authorization": f"{scheme} t0k"}).status_code == 200
    wrong = served.get("/sources", headers={"Authorization": f"{scheme} t0kk"})
    assert wrong.status_code == 401 and wrong.json() == {"error": "missing or wrong bearer token"}


@pytest.mark.parametrize(("size", "chunked"), [(20 << 20, False), (300 << 20, True)])
def test_huge_bodies_are_refused_while_read(served: httpx.Client, size: int, chunked: bool) -> None:
    before = body_bytes("index")
    url = str(served.base_url).rstrip("/")
    status, answer, sent = raw_request(url, "/score", size, chunked=chunked, headers=AUTH)
    assert status == 413 and b"--max-body-bytes" in answer
    assert body_bytes("index") - before <= IndexConfig.max_body_bytes
    assert sent < size


def test_the_default_body_limit_takes_a_score_at_the_token_cap(served: httpx.Client) -> None:
    """The token cap, not the body limit, decides: a prompt of the largest token ids at the
    cap is served, one token more is refused naming --max-request-tokens."""
    cap = IndexConfig.max_request_tokens
    for tokens, status in ((cap, 200), (cap + 1, 413)):
        body = b'{"model": "m", "token_ids": [' + b",".join([b"4294967295"] * tokens) + b"]}"
        assert len(body) < IndexConfig.max_body_bytes
        answer = served.post("/score", content=body, headers=AUTH)
        assert answer.status_code == status
        if status == 200:
            assert answer.json()["blocks"] == cap // 16
        else:
            assert "--max-request-tokens" in answer.json()["error"]


@pytest.mark.parametrize("limit", [0, 1023, (1 << 30) + 1])
def test_a_body_limit_that_cannot_work_names_the_flag(limit: int) -> None:
    hasher = BlockHasher()
    with pytest.raises(ConfigError, match="--max-body-bytes must be"):
        IndexApi(_index(hasher), hasher, max_body_bytes=limit).app()
