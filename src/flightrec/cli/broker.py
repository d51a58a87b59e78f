"""`flightrec broker start|stop|status|fetch` and `flightrec topics create`."""

from __future__ import annotations

import argparse
import asyncio

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "broker", help="run a local Kafka (KRaft: one node, or a cluster of three with --nodes 3) from Kafka's own jars"
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (
        ("start", "start the broker (idempotent) and create the topics"),
        ("stop", "stop the broker cleanly and wait"),
        ("status", "say whether the broker runs and answers"),
        ("fetch", "fetch Kafka's jars from Maven Central into the cache"),
    ):
        a = actions.add_parser(name, help=help_)
        a.add_argument("--port", type=int, default=9092, help="the PLAINTEXT port (default 9092)")
        a.add_argument(
            "--data",
            default=None,
            help="data folder (default $FLIGHTREC_HOME/broker-PORT; stop and status without it find the "
            "broker flightrec started on --port, wherever its data lives)",
        )
        if name != "fetch":
            a.add_argument(
                "--nodes",
                type=int,
                choices=[1, 3],
                default=1,
                help="1 (default): one broker; 3: a local cluster of three KRaft nodes on PORT, PORT+1, PORT+2 "
                "(data in $FLIGHTREC_HOME/cluster-PORT/node-N), topics with replication 3 and min.insync.replicas=2",
            )
        if name == "start":
            a.add_argument(
                "--security",
                choices=["plaintext", "sasl_ssl"],
                default=None,
                help="plaintext (default for a new data folder), or sasl_ssl: SCRAM-SHA-512 over TLS with "
                "certificates made on the spot, one user per role and Kafka's authorizer with their ACLs; the "
                "operator's client settings go to DATA/client.env, the agents' (write-only) to DATA/agent.env, "
                "a reader's to DATA/reader.env (docs/security.md)",
            )
        a.set_defaults(func=_broker)
    t = sub.add_parser("topics", help="create the flightrec topics on any Kafka cluster")
    t.add_argument("action", choices=["create"], help="create: make the four topics if they do not exist")
    t.add_argument("--bootstrap", default=None, help="bootstrap servers (default $FLIGHTREC_BOOTSTRAP)")
    t.add_argument("--partitions", type=int, default=None, help="partitions per topic (default 6)")
    t.add_argument("--replication", type=int, default=None, help="replication factor (default 1)")
    t.add_argument("--retention-ms", type=int, default=None, help="retention (default -1: keep everything)")
    t.set_defaults(func=_topics)


def _broker(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.broker import LocalBroker, fetch_kafka
    from flightrec.errors import BrokerError

    if args.action == "fetch":
        print(f"Kafka jars in {fetch_kafka(settings)}")
        return 0
    if args.nodes == 3:
        return _cluster(args, settings)
    if args.action == "start":
        b = LocalBroker(port=args.port, data=args.data, settings=settings, security=getattr(args, "security", None))
        print(b.start())
        return 0
    if args.data is None:  # find the broker on --port, wherever its data lives
        try:
            b = LocalBroker.on_port(args.port, settings)
        except BrokerError as exc:
            if args.action == "stop":
                raise
            print(str(exc))  # status: not answering for us; say why and which flag helps
            return 3
    else:
        b = LocalBroker(port=args.port, data=args.data, settings=settings)
    if args.action == "stop":
        print(b.stop())
        return 0
    status = b.status()
    print(status.line())
    return 0 if status.answering else 3


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.broker import ensure_topics

    s = settings.with_overrides(
        bootstrap=args.bootstrap,
        partitions=args.partitions,
        replication=args.replication,
        retention_ms=args.retention_ms,
    )
    created = asyncio.run(
        ensure_topics(s.kafka_kwargs(), partitions=s.partitions, replication=s.replication, retention_ms=s.retention_ms)
    )
    print("created: " + (", ".join(created) if created else "nothing (all topics exist)"))
    return 0


def _cluster(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.broker.cluster import LocalCluster
    from flightrec.errors import BrokerError

    if getattr(args, "security", None) not in (None, "plaintext"):
        raise BrokerError("a local cluster (--nodes 3) runs plaintext only; drop --security or use --nodes 1")
    c = LocalCluster(ports=[args.port, args.port + 1, args.port + 2], data=args.data, settings=settings)
    if args.action == "start":
        print(c.start())
    elif args.action == "stop":
        print(c.stop())
    else:
        status = c.status()
        print(status.line())
        return 0 if status.answering else 3
    return 0
