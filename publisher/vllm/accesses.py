"""The access stream from vLLM's scheduler: one `BlockAccess` per request (stream kv-accesses).

vLLM has no interface that reports every prefix lookup without changing the engine's
configuration (the KV connector API sees each lookup, but only when a connector is
configured, and a connector changes how the scheduler runs). So the plugin attaches two
observers to each `Scheduler` vLLM builds, on the instance, in the engine-core process:

- the admission lookup: `KVCacheManager.record_prefix_cache_stats(request, num_hits)`,
  which the scheduler calls once per admitted request with the local prefix-cache hit
  ("Record at admission so unscheduled lookups are not counted"); the first admission is
  kept (a preempted request's re-admission is not a new request, and vLLM's own
  `num_cached_tokens` is the first admission's hit too);
- the release: `Scheduler._free_blocks(request)`, called once per finished request when
  its blocks go back to the pool (at finish, or when the KV connector is done with them).
  A release at finish comes from `_free_request`, which first adds the request's id to
  the scheduler's `finished_req_ids` (a new set every step); a release the connector
  delayed (a P/D prefill whose KV the decode side still reads) comes from a later step's
  `_update_from_kv_xfer_finished`, when the id is no longer there: that access is
  published with `held_until_free`.

At the release the request's `block_hashes` (the same 32-byte hashes BlockStored carries),
its prompt length, computed tokens, arrival time and session (`session_id`, else
`cache_salt`) are read, and the blocks it held counted; everything is queued as a tuple and
turned into a `BlockAccess` on the publisher's sender thread, so the engine thread only
appends. Only the hashes of blocks whose KV was computed are published: `block_hashes`
also covers the last sampled token, whose KV no step computed, so when prompt and output
end on a block boundary its last hash names a block vLLM never cached (replaying it would
keep a block the engine never had and evict one the engine kept).

These are private scheduler methods, so the observers are attached only on the vLLM
versions they were read from (`SUPPORTED_VERSIONS`) and only when the methods exist; any
other version logs one warning and runs without the stream. An observer never raises
into the engine: a failure is logged once and the request skipped.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import SourcePublisher, shared_kafka_publisher
from kvscope.publisher.vllm.connector.plans import external_request_id
from kvscope.publisher.vllm.source import served_model_name, vllm_source, vllm_version
from kvscope.publisher.vllm.switch import engine_config
from kvscope.schemas import BlockAccess
from kvscope.schemas.engines import normalize_hash
from kvscope.schemas.streams import Stream

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("0.32.",)
"""vLLM versions (prefixes) whose scheduler the observers were read from."""
_MARK = "__kvscope_accesses__"


class Released(NamedTuple):
    """What the engine thread hands over at a release (converted on the sender thread)."""

    request_id: str
    prompt_tokens: int
    block_size: int
    hashes: list[Any]
    computed_tokens: int
    """Tokens whose KV the engine computed (the last sampled token has none)."""
    hit_tokens: int
    held_blocks: int
    arrival_ts: float
    lookup_ts: float
    free_ts: float
    session: str
    held_until_free: bool = False
    """The request had left the scheduler before its blocks were freed (a P/D prefill)."""


_make_released = Released._make
"""Builds a `Released` from a tuple in one C call: the keyword constructor is a Python
function with eleven arguments, run once per request on the engine thread."""
_ACCESSES = Stream.KV_ACCESSES.value


def to_body(released: Released) -> BlockAccess:
    """The `BlockAccess` of one release (runs on the sender thread): the hashes of the
    blocks whose KV was computed, which are the ones vLLM cached."""
    size = released.block_size
    computed = released.hashes[: released.computed_tokens // size] if size else []
    return BlockAccess(
        request_id=external_request_id(released.request_id),
        prompt_tokens=released.prompt_tokens,
        block_size=size,
        block_hashes=[normalize_hash(h) for h in computed],
        hit_blocks=released.hit_tokens // size if size else 0,
        held_blocks=released.held_blocks,
        arrival_ts=released.arrival_ts,
        lookup_ts=released.lookup_ts,
        free_ts=released.free_ts,
        session=str(released.session),
        held_until_free=released.held_until_free,
    )


class AccessRecorder:
    """The lookups of one scheduler's live requests; a release publishes one `BlockAccess`."""

    def __init__(self, publisher: SourcePublisher, block_size: int) -> None:
        self._publisher = publisher
        self._block_size = block_size
        self._lookups: dict[str, tuple[float, int]] = {}
        self._failed = False

    def looked_up(self, request: Any, num_hits: int) -> None:
        """The scheduler admitted `request` with `num_hits` tokens found in the prefix cache."""
        try:
            if request.num_preemptions == 0:
                self._lookups[request.request_id] = (time.time(), num_hits)
        except Exception:
            self._fail("lookup")

    def released(
        self, request: Any, held_blocks: Callable[[str], int], held_until_free: bool = False
    ) -> None:
        """`request`'s blocks go back to the pool: queue its access. `held_until_free`: it
        finished in an earlier step and its blocks waited (for a KV transfer)."""
        try:
            lookup = self._lookups.pop(request.request_id, None)
            if lookup is None:
                return  # never admitted (aborted while waiting): it looked nothing up
            now = time.time()
            released = _make_released(  # positional, in `Released`'s field order
                (
                    request.request_id,
                    request.num_prompt_tokens,
                    self._block_size,
                    request.block_hashes,
                    request.num_computed_tokens,
                    lookup[1],
                    held_blocks(request.request_id),
                    request.arrival_time,
                    lookup[0],
                    now,
                    request.session_id or request.cache_salt or "",
                    held_until_free,
                )
            )
            self._publisher.publish_raw(_ACCESSES, released, now, to_body)
        except Exception:
            self._fail("release")

    def pending(self) -> int:
        """Requests looked up and not yet released."""
        return len(self._lookups)

    def _fail(self, where: str) -> None:
        if not self._failed:
            self._failed = True
            log.warning(
                "kvscope access stream: a %s observer failed; skipping", where, exc_info=True
            )


def attach(scheduler: Any, recorder: AccessRecorder) -> None:
    """Observe `scheduler`'s admission lookups and releases (instance attributes only)."""
    manager = scheduler.kv_cache_manager
    record = manager.record_prefix_cache_stats
    free_blocks = scheduler._free_blocks

    blocks_of = manager.coordinator.single_type_managers[0].req_to_blocks

    def held(request_id: str) -> int:  # get_blocks(request_id).blocks[0], without its copies
        return len(blocks_of.get(request_id) or ())

    def record_prefix_cache_stats(request: Any, num_hits: int) -> None:
        recorder.looked_up(request, num_hits)
        record(request, num_hits)

    def observed_free_blocks(request: Any) -> None:
        # `_free_request` adds the id to `finished_req_ids` (a new set every step) and frees
        # at once unless the KV connector delays it; a delayed free comes steps later.
        left_before = request.request_id not in scheduler.finished_req_ids
        recorder.released(request, held, left_before)
        free_blocks(request)

    manager.record_prefix_cache_stats = record_prefix_cache_stats
    scheduler._free_blocks = observed_free_blocks


def unsupported_reason(version: str) -> str | None:
    """Why the access stream cannot run on this vLLM, or None when it can."""
    if not version.startswith(SUPPORTED_VERSIONS):
        supported = ", ".join(f"{v}x" for v in SUPPORTED_VERSIONS)
        return f"vLLM {version or '(unknown version)'} is not one it was built for ({supported})"
    try:
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError as exc:
        return f"vLLM's scheduler did not import ({exc})"
    for cls, name in (
        (Scheduler, "_free_blocks"),
        (KVCacheManager, "record_prefix_cache_stats"),
        (KVCacheManager, "get_blocks"),
    ):
        if not callable(getattr(cls, name, None)):
            return f"vLLM's {cls.__name__} has no {name}()"
    return None


def install() -> str | None:
    """Give every `Scheduler` vLLM builds from now on an `AccessRecorder` when kvscope is on
    for it (`--kv-events-config` with `publisher: kvscope`, else `KVSCOPE_*`) with the access
    stream on and not in sidecar mode. Idempotent.

    Returns why the stream cannot run on this vLLM, None when it can; the caller warns
    once kvscope is known to be on.
    """
    reason = unsupported_reason(vllm_version())
    if reason is not None:
        return reason
    from vllm.v1.core.sched.scheduler import Scheduler

    init = Scheduler.__init__
    if getattr(init, _MARK, False):
        return None

    @functools.wraps(init)
    def observed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            config = engine_config(self.vllm_config)
            if not config.enabled or not config.access_stream or config.kv_events_sidecar:
                return
            source = vllm_source(
                config,
                dp_rank=self.parallel_config.data_parallel_index,
                model=served_model_name(self.vllm_config),
            )
            publisher = shared_kafka_publisher(config).for_source(source)
            attach(self, AccessRecorder(publisher, self.block_size))
        except Exception:
            log.warning("kvscope: could not attach the access stream; it is off", exc_info=True)

    setattr(observed_init, _MARK, True)
    Scheduler.__init__ = observed_init  # type: ignore[method-assign]
    return None


def warn_if_off(config: PublisherConfig, reason: str | None) -> None:
    """One warning when kvscope is on with the access stream asked for, but this vLLM
    cannot give it (`reason` from `install()`)."""
    if reason and config.enabled and config.access_stream and not config.kv_events_sidecar:
        log.warning("kvscope: the access stream (kv-accesses) is off: %s", reason)
