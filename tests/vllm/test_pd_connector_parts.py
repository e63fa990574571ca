"""`KvscopeConnector` against vLLM's own connector API, without starting an engine.

The forwarding check reads vLLM's `KVConnectorBase_V1` and `SupportsHMA` as installed,
so a method a new vLLM release adds to the API fails here until the wrapper forwards it.
"""

from __future__ import annotations

import inspect

import pytest
from kvscope.publisher.vllm.connector import KvscopeConnector
from kvscope.publisher.vllm.connector.inner import inner_key, inner_transfer_config
from kvscope.publisher.vllm.connector.plans import WRAPPER_NAME
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

pytestmark = pytest.mark.vllm

# Base-class members that only touch the wrapper's own state, so need no forwarding.
OWN_STATE = {"role", "has_connector_metadata"}

NIXL_STATS = {
    "transfer_duration": [0.004, 0.010],
    "post_duration": [0.001, 0.001],
    "bytes_transferred": [4096, 8192],
    "num_descriptors": [2, 4],
    "num_failed_transfers": [],
    "num_failed_notifications": [],
    "num_failed_handshakes": [],
    "num_kv_expired_reqs": [],
    "num_notifications_after_expiry": [],
}
"""`NixlKVConnectorStats.to_dict()` of two transfers, as it crosses processes."""


def outer(inner: dict[str, object]) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="KvscopeConnector",
        kv_connector_module_path="kvscope.publisher.vllm.connector",
        kv_role="kv_consumer",
        engine_id="decode-0",
        kv_buffer_device="cpu",
        kv_connector_extra_config={"inner": inner},
    )


@pytest.mark.parametrize("api", [KVConnectorBase_V1, SupportsHMA])
def test_every_public_member_of_the_connector_api_is_forwarded(api: type) -> None:
    public = {name for name in vars(api) if not name.startswith("_")} - OWN_STATE
    missing = sorted(name for name in public if name not in vars(KvscopeConnector))
    assert missing == []


def test_vllm_loads_the_wrapper_by_module_path_and_the_inner_config_is_the_named_one() -> None:
    config = outer(
        {"kv_connector": "NixlConnector", "kv_connector_extra_config": {"num_threads": 1}}
    )
    assert KVConnectorFactory.get_connector_class(config) is KvscopeConnector
    assert KvscopeConnector.__name__ == WRAPPER_NAME  # the stat logger recognises it by name
    inner = inner_transfer_config(config)
    assert (inner.kv_connector, inner.kv_connector_module_path) == ("NixlConnector", None)
    assert inner.kv_connector_extra_config == {"num_threads": 1}
    assert (inner.kv_role, inner.engine_id, inner.kv_buffer_device) == (
        "kv_consumer",
        "decode-0",
        "cpu",
    )
    assert inner_key(inner) == "NixlConnector"


def test_a_missing_inner_connector_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match='"inner"'):
        inner_transfer_config(outer({}))


@pytest.mark.parametrize(
    ("inner", "piecewise"),
    [
        ({"kv_connector": "NixlConnector"}, False),
        ({"kv_connector": "ExampleConnector"}, False),
    ],
)
def test_classmethods_answer_for_the_inner_connector(
    inner: dict[str, object], piecewise: bool
) -> None:
    inner_cls = KVConnectorFactory.get_connector_class_by_name(str(inner["kv_connector"]))
    assert KvscopeConnector.requires_piecewise_for_cudagraph({"inner": inner}) is piecewise
    assert inner_cls.requires_piecewise_for_cudagraph({}) is piecewise


def test_stats_from_the_worker_are_rebuilt_with_the_inner_connectors_class() -> None:
    """vLLM's front end rebuilds the stats dict that crossed processes with the wrapper's
    classmethod; NIXL's reduce() must then work on it as on NIXL's own."""
    rebuilt = KvscopeConnector.build_kv_connector_stats({"NixlConnector": NIXL_STATS})
    assert isinstance(rebuilt, MultiKVConnectorStats)
    nixl_cls = KVConnectorFactory.get_connector_class_by_name("NixlConnector")
    direct = nixl_cls.build_kv_connector_stats(data=NIXL_STATS)
    assert direct is not None
    assert rebuilt.reduce() == {"NixlConnector": direct.reduce()}
    assert KvscopeConnector.build_kv_connector_stats(None).is_empty()  # type: ignore[union-attr]


def test_forwarders_keep_the_base_signatures() -> None:
    for name, member in vars(KVConnectorBase_V1).items():
        if name.startswith("_") or name in OWN_STATE or not callable(member):
            continue
        base_params = list(inspect.signature(getattr(KVConnectorBase_V1, name)).parameters)
        wrapper_params = list(inspect.signature(getattr(KvscopeConnector, name)).parameters)
        assert wrapper_params == base_params, name
