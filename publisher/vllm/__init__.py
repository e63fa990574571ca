"""The vLLM integration: plugin entry point, KV-event tee, stat logger, event conversion.

vLLM loads `kvscope.publisher.vllm.plugin:register` (general plugin) and
`kvscope.publisher.vllm.stats:KvscopeStatLogger` (stat-logger plugin) itself; both do
nothing unless kvscope is configured through the environment.
"""
