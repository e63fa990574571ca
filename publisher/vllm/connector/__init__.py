"""`KvscopeConnector`, a vLLM v1 KV connector that wraps another one and times its loads.

This module path is what `kv_connector_module_path` names
(`"kvscope.publisher.vllm.connector"`). As vLLM's own connectors grew into folders, the
parts live apart: `wrapper` (the connector: forwards every method to the inner one),
`scheduler` (scheduler side: `LoadPlanner`), `worker` (worker side: `LoadTracker`),
`plans` (what both sides share), `inner` (building the inner connector's config).
"""

from kvscope.publisher.vllm.connector.plans import WRAPPER_NAME
from kvscope.publisher.vllm.connector.wrapper import KvscopeConnector, KvscopeConnectorMetadata

__all__ = ["WRAPPER_NAME", "KvscopeConnector", "KvscopeConnectorMetadata"]
