"""The `kvscope bridge` sidecar: ZMQ KV events of an unmodified engine to Kafka.

`loop` runs the bridge, `frames` and `replay` speak the engines' ZMQ protocol, `seq`
repairs sequence holes, `state` persists progress, `scrape` turns an engine's
Prometheus `/metrics` into records, `metrics` holds the bridge's own metrics.
"""
