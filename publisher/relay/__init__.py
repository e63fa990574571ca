"""`kvscope relay`: one per host, the Kafka client that engine processes hand records to.

Engines configured with `relay=ipc:///...` (`KVSCOPE_RELAY`) run no Kafka client: their
publisher encodes records and sends them here over a local ZMQ socket
(`kvscope.publisher.relay_client`); this service produces them to Kafka verbatim and acks
each batch with what was lost. `config` (settings and their defaults), `metrics`,
`service` (the ROUTER socket and the aiokafka producer). docs/publisher.md, "Relay".
"""
