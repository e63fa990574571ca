"""One-machine tooling: the local Kafka-protocol broker, child processes and the demo."""
