"""The router's Prometheus metrics (default registry, served on its `/metrics`)."""

from __future__ import annotations

from kvscope.common.metrics import counter, gauge, histogram

DECISIONS = counter(
    "kvscope_route_decisions_total",
    "Requests routed, by engine and basis: index (scored by the index), load (no index "
    "configured), no_tokens (the prompt could not be tokenized in time), index_down, "
    "index_timeout, index_not_ready, index_refused (routed by load: the index failed open)",
    ["engine", "basis"],
)
PREDICTED_HIT_TOKENS = counter(
    "kvscope_route_predicted_hit_tokens_total",
    "Prompt tokens the index said the chosen engine holds",
    ["engine"],
)
PROMPT_TOKENS = counter(
    "kvscope_route_prompt_tokens_total", "Prompt tokens of the requests scored by the index"
)
BEST_NOT_CHOSEN = counter(
    "kvscope_route_best_not_chosen_total",
    "Decisions where load sent the request to an engine with fewer cached tokens than the best",
)
FORGONE_HIT_TOKENS = counter(
    "kvscope_route_forgone_hit_tokens_total",
    "Cached tokens given up for load: best candidate's predicted hit minus the chosen one's",
)
OVERHEAD = histogram(
    "kvscope_route_overhead_seconds",
    "Time the router adds before forwarding a request (parse, tokenize, score, choose)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1, 1.0),
)
STAGE = histogram(
    "kvscope_route_stage_seconds",
    "Time of one routing stage: tokenize (engine /tokenize or local) or score (the index)",
    ["stage"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0),
)
ENGINE_ERRORS = counter(
    "kvscope_route_engine_errors_total",
    "Failures talking to an engine, by kind (connect, timeout, protocol, status, stream, "
    "body, stall, health)",
    ["engine", "kind"],
)
INDEX_ERRORS = counter(
    "kvscope_route_index_errors_total", "Index calls that failed, by call (score, routed)", ["call"]
)
HINTS_UNKNOWN = counter(
    "kvscope_route_hints_unknown_source_total",
    "Routed hints the index did not take: the engine has not published yet (not an error)",
)
EJECTIONS = counter(
    "kvscope_route_ejections_total", "Engines ejected by outlier detection", ["engine"]
)
BREAK_OFFS = counter(
    "kvscope_route_break_offs_total",
    "Answers an engine broke off after it began them (the client got an error)",
    ["engine"],
)
CAPPED_PROMPTS = counter(
    "kvscope_route_capped_prompts_total",
    "Prompts longer than --max-hash-tokens: only their leading tokens were scored",
)
ENGINE_UP = gauge(
    "kvscope_route_engine_up", "1 while the engine is routed to, 0 while skipped", ["engine"]
)
IN_FLIGHT = gauge("kvscope_route_in_flight", "Requests in flight to the engine", ["engine"])
