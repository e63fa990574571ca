"""kvscope.consumer: read kvscope's Kafka topics from your own code, as decoded envelopes.

    async with EnvelopeConsumer("kafka:9092", streams=["kv-events"]) as consumer:
        async for record in consumer:
            print(record.envelope.source.instance, record.envelope.seq, record.envelope.body)

Depends on kvscope.schemas and aiokafka only. See docs/consumer.md.
"""

from kvscope.consumer.iterator import EnvelopeConsumer, Record, read_envelopes

__all__ = ["EnvelopeConsumer", "Record", "read_envelopes"]
