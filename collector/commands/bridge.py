"""`kvscope bridge`: forward an unmodified engine's ZMQ KV events to Kafka."""

from __future__ import annotations

import argparse
import signal
from types import FrameType

from kvscope.schemas import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bridge` command."""
    parser = subparsers.add_parser(
        "bridge",
        help="forward an unmodified vLLM/SGLang engine's ZMQ KV events to Kafka",
        description=(
            "Subscribe to one or more engine KV-event PUB sockets (vLLM or SGLang, as they "
            "are), repair sequence gaps from the engines' replay sockets, record a Gap for "
            "what cannot be repaired, and publish kvscope envelopes to Kafka. Give --zmq once "
            "per publisher (e.g. per DP rank) and --replay after it for its replay socket. "
            "See docs/bridge.md."
        ),
    )
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument(
        "--zmq",
        action="append",
        required=True,
        metavar="URL",
        help="engine PUB endpoint, e.g. tcp://10.0.0.5:5557 (repeatable)",
    )
    parser.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="URL",
        help="replay endpoint; the n-th --replay belongs to the n-th --zmq",
    )
    parser.add_argument("--instance", default="", help="instance name (default: from topic)")
    parser.add_argument("--model", default="", help="model name (default: from topic)")
    parser.add_argument("--role", choices=["prefill", "decode", "both"], default="both")
    parser.add_argument("--engine-version", default="", help="engine version for the source")
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka brokers host:port,...")
    parser.add_argument("--topic-prefix", default="kvscope.", help="(default: %(default)s)")
    parser.add_argument("--state-dir", default=None, help="keep positions here across restarts")
    parser.add_argument(
        "--forward-token-ids", action="store_true", help="forward token ids of stored blocks"
    )
    parser.set_defaults(run=run)


def _endpoints(args: argparse.Namespace) -> list:
    """Pair the n-th --replay with the n-th --zmq (later --zmq may have none)."""
    from kvscope.publisher.bridge import Endpoint

    if len(args.replay) > len(args.zmq):
        raise ConfigError("more --replay than --zmq endpoints")
    replays = args.replay + [None] * (len(args.zmq) - len(args.replay))
    return [Endpoint(zmq=z, replay=r) for z, r in zip(args.zmq, replays, strict=True)]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Run the bridge in the foreground until Ctrl-C / SIGTERM."""
    from kvscope.publisher.bridge import Bridge, BridgeConfig
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.kafka import KafkaPublisher

    config = BridgeConfig(
        engine=args.engine,
        endpoints=_endpoints(args),
        instance=args.instance,
        model=args.model,
        role=args.role,
        engine_version=args.engine_version,
        state_dir=args.state_dir,
        keep_token_ids=args.forward_token_ids,
    ).validate()
    kafka = KafkaPublisher(
        PublisherConfig(
            bootstrap_servers=args.bootstrap_servers,
            topic_prefix=args.topic_prefix,
            client_id="kvscope-bridge",
        )
    )
    bridge = Bridge(config, kafka.for_source, kafka.flush)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        bridge.run()
    except KeyboardInterrupt:
        pass
    finally:
        kafka.shutdown(10)
    return 0
