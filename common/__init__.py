"""Shared by the engine side and the service side: backoff, log throttling, the one way to
declare Prometheus metrics and the Kafka client settings. Light dependencies only: engine
processes import it."""
