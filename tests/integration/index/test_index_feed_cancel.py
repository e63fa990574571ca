"""A feed asked to stop stops, even when the cancellation itself is lost on the way.

Python 3.11's `asyncio.wait_for` returns the awaited call's result instead of raising
`CancelledError` when the cancel arrives as that call completes; a router shutting down
its embedded index then waited forever (seen once as a 600 s test timeout). The loss is
injected here: the feed's partition check is replaced by one that swallows the
cancellation, because the real race cannot be produced on demand."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index.feed import IndexFeed
from kvscope.index.state import PrefixIndex


@pytest.mark.parametrize("lost_at_call", [1, 2])
def test_a_feed_whose_cancellation_was_swallowed_still_stops(
    bootstrap_servers: str, topic_prefix: str, lost_at_call: int
) -> None:
    async def scenario() -> tuple[bool, int]:
        feed = IndexFeed(
            PrefixIndex(), KafkaSettings(bootstrap_servers=bootstrap_servers), f"{topic_prefix}kv"
        )
        check = feed._assign_new_partitions
        calls = 0
        entered = asyncio.Event()

        async def check_losing_the_cancel() -> None:
            nonlocal calls
            calls += 1
            await check()
            if calls == lost_at_call:
                entered.set()
                # what wait_for does when the call completes as the cancel arrives:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)

        feed._assign_new_partitions = check_losing_the_cancel  # type: ignore[method-assign]
        task = asyncio.create_task(feed.run())
        await asyncio.wait_for(entered.wait(), 30)
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except asyncio.CancelledError:
            pass
        except TimeoutError:
            task.cancel()  # once more, so the test's loop can end
        finally:
            await feed.stop()
        return task.cancelled(), calls

    cancelled, calls = asyncio.run(scenario())
    assert cancelled, "the feed ran on after it was cancelled"
    assert calls == lost_at_call
