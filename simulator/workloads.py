"""Request streams for the fleet simulator: the workloads people benchmark prefix caching with.

- `generated-shared-prefix`: groups of prompts sharing a system prompt, each with its own
  question, shuffled (SGLang `bench_serving --dataset-name generated-shared-prefix`).
- `multi-turn`: conversations whose every turn re-sends the whole history (system prompt,
  earlier questions and answers) plus a new question, after a think time.
- `zipf`: requests over a fixed set of documents picked with Zipf popularity, each
  followed by a distinct question.

Every workload is a pure function of its parameters and the seed, so a re-run with another
cache size sees exactly the same requests (the capacity what-if depends on it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvscope.schemas.errors import ConfigError

VOCAB = 32000


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request: when it arrives, its prompt tokens and the tokens it will generate."""

    request_id: str
    arrival_s: float
    prompt: list[int]
    output: list[int]
    session: str = ""
    """The conversation a request belongs to (multi-turn chats), "" for none."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One workload parameter (`--workload-param K=V`): its default and least value."""

    default: float
    minimum: float
    whole: bool = True
    """A count of something (tokens, groups): a whole number."""
    maximum: float = math.inf
    """The largest value (what the generator must hold in memory at once)."""


KNOBS: dict[str, dict[str, Knob]] = {
    "generated-shared-prefix": {
        "groups": Knob(8, 1),
        "system_prompt_len": Knob(512, 0),
        "question_len": Knob(64, 1),
        "output_len": Knob(32, 0),
    },
    "multi-turn": {
        "turns": Knob(4, 1),
        "system_prompt_len": Knob(256, 0),
        "user_len": Knob(64, 1),
        "output_len": Knob(64, 0),
        "think_s": Knob(10.0, 0, whole=False),
    },
    "zipf": {
        "documents": Knob(200, 1, maximum=10_000_000),  # their popularity weights
        "doc_len": Knob(512, 0),
        "question_len": Knob(32, 1),
        "output_len": Knob(32, 0),
        "alpha": Knob(1.0, 0, whole=False),
    },
}
"""Each workload's parameters (a prompt always has at least one token of its own)."""


def knob_values(name: str, params: Mapping[str, float]) -> dict[str, float]:
    """Workload `name`'s parameters: `params` over the defaults; `ConfigError` for a
    parameter the workload does not have or a value it cannot use."""
    knobs = KNOBS[name]
    for key, value in params.items():
        knob = knobs.get(key)
        if knob is None:
            raise ConfigError(
                f"workload {name} has no parameter {key!r}; it has {', '.join(knobs)}"
            )
        if not (math.isfinite(value) and knob.minimum <= value <= knob.maximum) or (
            knob.whole and value != int(value)
        ):
            kind = "a whole number" if knob.whole else "a number"
            most = f" and <= {knob.maximum:,.0f}" if math.isfinite(knob.maximum) else ""
            raise ConfigError(
                f"workload parameter {key}={value:g}: give {kind} >= {knob.minimum:g}{most}"
            )
    return {key: params.get(key, knob.default) for key, knob in knobs.items()}


def longest_request(name: str, n: int, params: Mapping[str, float]) -> int:
    """The most tokens (prompt and output) one of `n` requests of workload `name` can have,
    known before any token is drawn (exact but for multi-turn with several conversations and
    `n` not a multiple of `turns`: the last turn may be among the requests cut off)."""
    k = knob_values(name, params)
    if name == "multi-turn":
        turns = min(int(k["turns"]), n)  # turn t needs its t - 1 earlier turns among the n
        return int(k["system_prompt_len"]) + turns * int(k["user_len"] + k["output_len"])
    prefix = k["system_prompt_len"] if name == "generated-shared-prefix" else k["doc_len"]
    return int(prefix + k["question_len"] + k["output_len"])


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def generated_shared_prefix(
    n: int, rate: float, rng: random.Random, params: Mapping[str, float]
) -> list[SimRequest]:
    """Groups x prompts per group: a shared system prompt plus a distinct question each.

    With more groups than requests every request is a group of its own, as with `n`
    groups: only those are drawn (`groups` may exceed `n` by far).
    """
    k = knob_values("generated-shared-prefix", params)
    groups, system_len = min(int(k["groups"]), n), int(k["system_prompt_len"])
    question_len, output_len = int(k["question_len"]), int(k["output_len"])
    per_group = max(1, math.ceil(n / groups))
    systems = [_tokens(rng, system_len) for _ in range(groups)]
    prompts = [
        systems[g] + _tokens(rng, question_len) for g in range(groups) for _ in range(per_group)
    ]
    rng.shuffle(prompts)
    times = _arrivals(rng, n, rate)
    return [
        SimRequest(f"gsp-{i}", times[i], prompts[i], _tokens(rng, output_len)) for i in range(n)
    ]


def multi_turn(
    n: int, rate: float, rng: random.Random, params: Mapping[str, float]
) -> list[SimRequest]:
    """Conversations re-sending their history each turn; turn k+1 follows after a think time."""
    k = knob_values("multi-turn", params)
    turns, system_len = int(k["turns"]), int(k["system_prompt_len"])
    user_len, output_len, think_s = int(k["user_len"]), int(k["output_len"]), k["think_s"]
    system = _tokens(rng, system_len)
    conversations = max(1, math.ceil(n / turns))
    starts = _arrivals(rng, conversations, rate / turns)
    requests = []
    for c, start in enumerate(starts):
        history = list(system)
        t = start
        for turn in range(turns):
            prompt = history + _tokens(rng, user_len)
            output = _tokens(rng, output_len)
            requests.append(SimRequest(f"chat-{c}-{turn}", t, prompt, output, f"chat-{c}"))
            history = prompt + output
            t += think_s * (0.5 + rng.random())
    requests.sort(key=lambda r: r.arrival_s)
    return requests[:n]


def zipf(n: int, rate: float, rng: random.Random, params: Mapping[str, float]) -> list[SimRequest]:
    """Requests over `documents` prefixes with Zipf(`alpha`) popularity plus a question each
    (a document's tokens are drawn when it is first picked)."""
    k = knob_values("zipf", params)
    documents, doc_len = int(k["documents"]), int(k["doc_len"])
    question_len, output_len, alpha = int(k["question_len"]), int(k["output_len"]), k["alpha"]
    weights = [1.0 / (k + 1) ** alpha for k in range(documents)]
    picks = rng.choices(range(documents), weights=weights, k=n)
    docs: dict[int, list[int]] = {}
    for d in picks:
        if d not in docs:
            docs[d] = _tokens(rng, doc_len)
    times = _arrivals(rng, n, rate)
    return [
        SimRequest(
            f"zipf-{i}", times[i], docs[d] + _tokens(rng, question_len), _tokens(rng, output_len)
        )
        for i, d in enumerate(picks)
    ]


Generator = Callable[[int, float, random.Random, Mapping[str, float]], list[SimRequest]]
WORKLOADS: dict[str, Generator] = {
    "generated-shared-prefix": generated_shared_prefix,
    "multi-turn": multi_turn,
    "zipf": zipf,
}


def generate(
    name: str, n: int, seed: int, rate: float, params: Mapping[str, float] | None = None
) -> list[SimRequest]:
    """The request stream of workload `name`: `n` requests arriving at `rate` per second."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    if n <= 0 or rate <= 0:
        raise ValueError("requests and rate must be positive")
    return WORKLOADS[name](n, rate, random.Random(f"{name}/{seed}"), params or {})
