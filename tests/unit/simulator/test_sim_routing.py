"""The simulator's routing policies: round-robin, random, approximate, exact-index, oracle."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from kvscope.cli.main import main
from kvscope.schemas import ConfigError, RequestFinished, Source
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances

CHATS = {"turns": 6, "system_prompt_len": 128, "user_len": 48, "output_len": 128, "think_s": 3}
"""Chats long enough (in decode steps) that the load balance spreads them over engines."""


def _config(instances: int | str, capacity: int, **overrides: Any) -> SimConfig:
    settings: dict[str, Any] = {
        "instances": parse_instances(str(instances)),
        "workload": "multi-turn",
        "workload_params": dict(CHATS),
        "requests": 240,
        "rate": 30.0,
        "capacity_blocks": capacity,
        "seed": 3,
    }
    settings.update(overrides)
    return SimConfig(**settings)


def _run(config: SimConfig) -> tuple[dict[str, Any], Counter[str]]:
    served: Counter[str] = Counter()

    def sink(source: Source, epoch: int, body: Any, ts: float) -> None:
        if isinstance(body, RequestFinished):
            served[source.instance] += 1

    return Fleet(config, sink).run(), served


def _evicted(truth: dict[str, Any]) -> int:
    return sum(s["removed_blocks"] for s in truth["sources"].values())


@pytest.mark.parametrize("instances", [1, 2, 3, 5])
@pytest.mark.parametrize("capacity", [80, 300, 4000])
@pytest.mark.parametrize(
    "routing", ["round-robin", "random", "approximate", "exact-index", "oracle"]
)
def test_every_policy_serves_every_request(routing: str, capacity: int, instances: int) -> None:
    truth, served = _run(_config(instances, capacity, routing=routing))
    assert sum(served.values()) == truth["routing"]["decisions"] == 240
    assert truth["routing"]["resident_blocks"] <= truth["fleet"]["prefix_hits"] // 16 + 240
    if routing == "round-robin":
        assert max(served.values()) - min(served.values()) <= 1 and len(served) == instances
    if instances == 1:
        assert truth["routing"]["chose_best_share"] == 1.0


@pytest.mark.parametrize("capacity", [80, 300, 4000])
def test_prefix_aware_is_the_oracle(capacity: int) -> None:
    oracle, served = _run(_config(3, capacity, routing="oracle"))
    alias, alias_served = _run(_config(3, capacity, routing="prefix-aware"))
    assert (alias["fleet"], alias["routing"], alias_served) == (
        oracle["fleet"],
        oracle["routing"],
        served,
    )
    stats = oracle["routing"]
    assert stats["predicted_blocks"] == stats["resident_blocks"] > 0


@pytest.mark.parametrize("instances", [2, 4])
def test_approximate_matches_the_oracle_until_evictions(instances: int) -> None:
    guess, _ = _run(_config(instances, 4000, routing="approximate"))
    oracle, _ = _run(_config(instances, 4000, routing="oracle"))
    rr, _ = _run(_config(instances, 4000, routing="round-robin"))
    assert _evicted(guess) == _evicted(oracle) == 0
    assert abs(guess["fleet"]["hit_rate"] - oracle["fleet"]["hit_rate"]) < 0.01
    assert oracle["fleet"]["hit_rate"] > rr["fleet"]["hit_rate"] + 0.1
    g = guess["routing"]  # it does not know the engine also cached the answers
    assert g["resident_blocks"] * 0.7 <= g["predicted_blocks"] <= g["resident_blocks"]

    overestimates = []
    for capacity in (150, 600, 1200):
        tight, served = _run(_config(instances, capacity, routing="approximate"))
        tight_oracle, oracle_served = _run(_config(instances, capacity, routing="oracle"))
        assert _evicted(tight) > 0
        assert served != oracle_served  # other decisions
        t = tight["routing"]
        overestimates.append(t["predicted_blocks"] / t["resident_blocks"])
        if capacity >= 600:  # evictions it never sees, with room to do better
            assert tight["fleet"]["hit_rate"] < tight_oracle["fleet"]["hit_rate"] - 0.05
    assert overestimates == sorted(overestimates, reverse=True) and overestimates[-1] > 1.02


def test_approximate_guessers_per_replica_and_assumed_capacity() -> None:
    one, _ = _run(_config(4, 5000, routing="approximate"))
    four, _ = _run(_config(4, 5000, routing="approximate", router_replicas=4))
    assert four["routing"]["chose_best_share"] < one["routing"]["chose_best_share"] - 0.05
    assert four["fleet"]["hit_rate"] < one["fleet"]["hit_rate"]
    small, _ = _run(_config(4, 5000, routing="approximate", assumed_capacity_blocks=20))
    assert small["routing"]["predicted_blocks"] < one["routing"]["predicted_blocks"]


@pytest.mark.parametrize("instances", ["2", "3", "1p,2d"])
@pytest.mark.parametrize("capacity", [80, 300, 1200, 4000])
def test_exact_index_at_zero_lag_is_within_a_point_of_the_oracle(
    capacity: int, instances: str
) -> None:
    exact, _ = _run(_config(instances, capacity, routing="exact-index"))
    oracle, _ = _run(_config(instances, capacity, routing="oracle"))
    assert abs(exact["fleet"]["hit_rate"] - oracle["fleet"]["hit_rate"]) <= 0.01
    stats = exact["routing"]  # the index saw every event published before the decision
    assert stats["predicted_blocks"] == stats["resident_blocks"] > 0


@pytest.mark.parametrize("lag_s", [0.5, 1.0, 5.0])
def test_index_lag_leaves_the_index_behind_the_engines(lag_s: float) -> None:
    lagged, _ = _run(_config(3, 300, routing="exact-index", index_lag_s=lag_s))
    stats = lagged["routing"]
    assert stats["predicted_blocks"] != stats["resident_blocks"]
    assert stats["chose_best"] < stats["decisions"]
    current, _ = _run(_config(3, 300, routing="exact-index"))
    assert stats["chose_best"] < current["routing"]["chose_best"]


def test_cli_exact_index_writes_the_truth(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = tmp_path / "truth.json"
    argv = ["simulate", "--dry-run", "--requests", "60", "--instances", "3"]
    argv += ["--routing", "exact-index", "--index-lag", "0.5", "--truth", str(truth)]
    assert main(argv) == 0
    written = json.loads(truth.read_text())
    assert written["config"]["routing"] == "exact-index"
    assert written["config"]["index_lag_s"] == 0.5
    assert f"hit rate {written['fleet']['hit_rate']:.4f}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides",
    [
        {"router_replicas": 0},
        {"router_replicas": 1001},
        {"assumed_capacity_blocks": 0},
        {"index_lag_s": -1.0},
        {"index_lag_s": float("nan")},
        {"routing": "exact"},
    ],
)
def test_invalid_routing_options_fail_fast(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        _config(2, 200, **overrides).validate()


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["--routing", "nope"], 2, "invalid choice: 'nope'"),
        (["--router-replicas", "2"], 2, "applies only to --routing approximate"),
        (["--routing", "oracle", "--assumed-capacity-blocks", "9"], 2, "applies only to"),
        (["--routing", "oracle", "--index-lag", "1"], 2, "applies only to --routing exact-index"),
        (["--routing", "exact-index", "--index-lag", "-1"], 2, "--index-lag must be"),
        (["--routing", "approximate", "--router-replicas", "0"], 2, "--router-replicas must"),
    ],
)
def test_cli_routing_errors_are_one_line(
    argv: list[str], code: int, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        result = main(["simulate", "--dry-run", "--requests", "10", *argv])
    except SystemExit as exc:
        result = exc.code
    err = capsys.readouterr().err
    assert result == code
    assert err.count("\n") == 1 and text in err, err
