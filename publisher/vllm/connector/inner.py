"""The connector `KvscopeConnector` wraps: its config, class and stats key (vLLM config only).

The wrapped connector is named in the wrapper's `kv_connector_extra_config["inner"]` (a
`KVTransferConfig` subset, as vLLM's `MultiConnector` names its children); everything
else (role, engine id, buffer device) comes from the wrapper's own config.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import TYPE_CHECKING

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

INNER_KEY = "inner"


def inner_transfer_config(outer: KVTransferConfig) -> KVTransferConfig:
    """The wrapped connector's config: the outer one with `extra_config["inner"]` applied."""
    inner = (outer.kv_connector_extra_config or {}).get(INNER_KEY)
    if not isinstance(inner, dict) or not inner.get("kv_connector"):
        raise ValueError(
            'KvscopeConnector needs kv_connector_extra_config={"inner": {"kv_connector": '
            '"NixlConnector", ...}} naming the connector to wrap'
        )
    return dataclasses.replace(
        outer,
        kv_connector=inner["kv_connector"],
        kv_connector_module_path=inner.get("kv_connector_module_path"),
        kv_connector_extra_config=dict(inner.get("kv_connector_extra_config") or {}),
    )


def inner_config(vllm_config: VllmConfig) -> VllmConfig:
    """A shallow copy of `vllm_config` whose `kv_transfer_config` names the inner connector."""
    assert vllm_config.kv_transfer_config is not None
    config = copy.copy(vllm_config)
    config.kv_transfer_config = inner_transfer_config(vllm_config.kv_transfer_config)
    return config


def inner_key(config: KVTransferConfig) -> str:
    """The name the inner connector's stats are keyed by (see `inner_key_of`)."""
    return inner_key_of(config.kv_connector, config.kv_connector_module_path)


def inner_key_of(name: str | None, module_path: str | None) -> str:
    """A connector's registry name, or `module:Class` when it is loaded from a module path."""
    return f"{module_path}:{name}" if module_path else str(name)


def class_by_key(key: str) -> type[KVConnectorBase_V1]:
    """The connector class an `inner_key_of` key names."""
    if ":" in key:
        module, name = key.rsplit(":", 1)
        found: type[KVConnectorBase_V1] = getattr(importlib.import_module(module), name)
        return found
    return KVConnectorFactory.get_connector_class_by_name(key)


def bytes_per_block(kv_cache_config: KVCacheConfig) -> int:
    """KV bytes one block holds across all layers (sum over the KV cache groups)."""
    return sum(
        group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        for group in kv_cache_config.kv_cache_groups
    )
