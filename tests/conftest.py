"""Shared fixtures: the real local Kafka-protocol broker and the real ClickHouse engine (chDB).

chDB allows one data directory per process, so the whole test session shares one
directory and every test gets its own database (`ch_database`). Every test that
talks to Kafka gets its own topic prefix (`topic_prefix`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvscope.collector.errors import BrokerError
from kvscope.local.broker import LocalBroker

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A job a shell starts in the background begins with SIGINT ignored, and every child
    # inherits that; the tests that press Ctrl-C on a demo need it delivered.
    signal.signal(signal.SIGINT, signal.default_int_handler)

_VLLM_CACHE = pytest.StashKey[str]()
WHOLLY_VLLM = re.compile(r"^pytestmark = pytest\.mark\.vllm$", re.MULTILINE)
"""A test module all of whose tests need a real vLLM engine says so in this one line."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With the real-engine tests deselected (`-m "not vllm"`, tools/run-tests' first pass),
    a module marked `vllm` as a whole is not even imported: importing vLLM costs each
    process about 20 s of CPU, and those tests would all be deselected anyway."""
    if config.getoption("markexpr", "").strip() != "not vllm":
        return None
    if not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    if WHOLLY_VLLM.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    """One vLLM cache directory for every engine the session starts (in process or
    `vllm serve`): vLLM inspects the model class once and keeps the answer there, where a
    fresh cache per engine costs each start a subprocess importing torch and vLLM."""
    if "VLLM_CACHE_ROOT" not in os.environ:
        config.stash[_VLLM_CACHE] = os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(
            prefix="kvscope-vllm-cache-"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's vLLM cache directory (only one this session made)."""
    made = config.stash.get(_VLLM_CACHE, None)
    if made is not None:
        os.environ.pop("VLLM_CACHE_ROOT", None)
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="session")
def broker() -> Iterator[LocalBroker]:
    """A Tansu broker on a free loopback port for the whole session."""
    local = LocalBroker()
    try:
        local.start()
    except BrokerError as exc:
        pytest.exit(f"the local Kafka broker did not start: {exc}", returncode=3)
    yield local
    local.stop()


@pytest.fixture
def bootstrap_servers(broker: LocalBroker) -> str:
    """`host:port` of the session broker."""
    return broker.bootstrap_servers


@pytest.fixture
def topic_prefix() -> str:
    """A topic prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one chDB data directory."""
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture
def ch_database() -> str:
    """A database name no other test uses."""
    return f"test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clickhouse(chdb_path: Path, ch_database: str) -> Iterator[object]:
    """A clickhouse-connect client on the session chDB directory, in a fresh database.

    The server tests (test_collector_server.py) use an HTTP front over the same directory.
    """
    from support.chdb_database import fresh_database

    with fresh_database(chdb_path, ch_database) as client:
        yield client


@pytest.fixture
def clickhouse_url(chdb_path: Path, ch_database: str) -> str:
    """kvscope's ClickHouse target URL for this test's database (chDB on the session dir)."""
    return f"chdb://{chdb_path}?database={ch_database}"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a locally trained tokenizer (see tests/tinyllama.py).

    Use `kvscope.local.demo_vllm.offline_vllm_env(tmp)` for the environment and
    `tinyllama.tiny_engine_kwargs` for vLLM.
    """
    from support.tinyllama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
