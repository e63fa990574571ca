"""The HTTP base's readers: JSON nesting and UTF-8, strict integers; each refusal a 400."""

from __future__ import annotations

import json

import pytest
from kvscope.web.errors import BadInput
from kvscope.web.limits import (
    MAX_JSON_DEPTH,
    MAX_QUERY_TEXT,
    body_limit_problem,
    check_json,
    decode_json,
    nesting_problem,
    parse_int,
    query_params,
)
from starlette.datastructures import QueryParams


def nest(depth: int, kind: str) -> bytes:
    """A JSON value nested `depth` containers deep (arrays, objects or both in turn)."""
    value: object = '[{]}"\\[[['  # brackets inside a string (escapes too) count for nothing
    for level in range(depth):
        array = kind == "array" or (kind == "mixed" and level % 2)
        value = [value, 1] if array else {"k[": value, "n": "}"}
    return json.dumps(value).encode()


@pytest.mark.parametrize("kind", ["array", "object", "mixed"])
@pytest.mark.parametrize("depth", [0, 1, 2, 3, 63, 64, 65, 66, 200])
def test_nesting_is_measured_outside_strings(kind: str, depth: int) -> None:
    raw = nest(depth, kind)
    assert json.loads(raw) is not None
    assert (nesting_problem(raw) is not None) is (depth > MAX_JSON_DEPTH)
    assert nesting_problem(raw, depth) is None
    if depth:
        assert "deeper than" in (nesting_problem(raw, depth - 1) or "")


@pytest.mark.parametrize("deep", [65, 1000, 200_000])
def test_deep_json_is_a_400_not_a_recursion_error(deep: int) -> None:
    raw = b"[" * deep + b"]" * deep
    with pytest.raises(BadInput) as refused:
        check_json(raw)
    assert refused.value.status_code == 400 and "deeper than 64" in refused.value.detail


def test_wide_shallow_json_passes() -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "["}] * 5000}).encode()
    check_json(raw)
    assert len(decode_json(raw, dict)["messages"]) == 5000


@pytest.mark.parametrize(
    "raw",
    [b'{"prompt": "\xff"}', b'{"prompt": "\xc3"}', b'{"\xed\xa0\x80": 1}', b"\xfe\xff{}"],
)
def test_invalid_utf8_is_a_400(raw: bytes) -> None:
    with pytest.raises(BadInput) as refused:
        check_json(raw)
    assert refused.value.status_code == 400 and "not UTF-8" in refused.value.detail


@pytest.mark.parametrize("count", [65, 200_000])
def test_unbalanced_brackets_are_measured_up_to_the_first_stray_closer(count: int) -> None:
    assert "deeper than" in (nesting_problem(b"[" * count) or "")
    assert "deeper than" in (nesting_problem(b"[]" * count + b"[" * count) or "")
    for raw in (b"]" * count + b"[" * count, b"[]" * count + b"]", b"[" + b"[]" * count):
        assert nesting_problem(raw) is None
        with pytest.raises(BadInput) as refused:
            decode_json(raw, list)
        assert refused.value.detail == "the body is not JSON"


def test_broken_json_is_a_400() -> None:
    for raw in (b"[" * 70, b"]" * 70 + b"[" * 70, b"[{]}" * 40, b"not json", b"[1,]"):
        with pytest.raises(BadInput) as refused:
            decode_json(raw, list)
        assert refused.value.status_code == 400


@pytest.mark.parametrize(
    "text",
    ["--5", "-5", "+5", "²", "٣", "1e3", " 5", "5 ", "", "0x10", "5.0", "9" * 19, "9" * 5000],
)
def test_integers_are_ascii_digits_in_range(text: str) -> None:
    with pytest.raises(BadInput) as refused:
        parse_int(text, "limit", 1, 10**18)
    assert refused.value.status_code == 400 and "limit must be an integer" in refused.value.detail
    assert len(refused.value.detail) < 120


@pytest.mark.parametrize(("text", "low", "high"), [("1", 1, 1), ("007", 0, 7), ("0", 0, 0)])
def test_integers_in_range_parse(text: str, low: int, high: int) -> None:
    assert parse_int(text, "n", low, high) == int(text)
    with pytest.raises(BadInput):
        parse_int(str(high + 1), "n", low, high)


@pytest.mark.parametrize(
    ("limit", "ok"), [(0, False), (1023, False), (1024, True), (1 << 30, True), (1 << 31, False)]
)
def test_body_limit_range(limit: int, ok: bool) -> None:
    assert (body_limit_problem(limit) is None) is ok


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {}),
        ("a=1&b=", {"a": "1", "b": ""}),
        ("a=1&token=x&token=y", {"a": "1"}),  # ignored names may repeat
        ("a=" + "x" * MAX_QUERY_TEXT, {"a": "x" * MAX_QUERY_TEXT}),
        ("a=1&b=2&a=3", "a given more than once"),
        ("b=1&a=2&b=1&a=2", "a, b given more than once"),
        ("a=" + "x" * (MAX_QUERY_TEXT + 1), f"a is longer than {MAX_QUERY_TEXT}"),
    ],
)
def test_query_params_are_each_given_once_and_short(query: str, expected: object) -> None:
    params = QueryParams(query)
    if isinstance(expected, dict):
        assert query_params(params, ignore=("token",)) == expected
        return
    with pytest.raises(BadInput) as refused:
        query_params(params, ignore=("token",))
    assert refused.value.status_code == 400 and str(expected) in refused.value.detail
