"""``python -m cdcsync.devstack.workload``: produce a stream and print its counts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdcsync.core.errors import CdcsyncError

if TYPE_CHECKING:
    pass

from cdcsync.devstack.workload.events import generate, malformed_events, stale_replays
from cdcsync.devstack.workload.kafka import produce

# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdcsync.devstack.workload",
        description="Produce a synthetic Debezium changelog of an orders table to Kafka.",
    )
    parser.add_argument(
        "--bootstrap",
        default=None,
        help="Kafka bootstrap servers (default: from cdcsync settings: $CDCSYNC__KAFKA__BOOTSTRAP_SERVERS, "
        "cdcsync.yaml, else the dev stack's broker)",
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--changes", type=int, default=10_000, help="change events to produce")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct primary keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4, help="partitions when the topic is created")
    parser.add_argument("--wrapped", action="store_true", help="JsonConverter schemas.enable=true envelopes")
    parser.add_argument("--no-tombstones", action="store_true", help="no tombstone after deletes")
    parser.add_argument("--malformed", action="store_true", help="also produce messages that must be dead-lettered")
    parser.add_argument("--replays", type=int, default=0, help="re-send N stale changes after the stream")
    args = parser.parse_args(argv)

    workload = generate(
        args.changes, args.keys, seed=args.seed, wrapped=args.wrapped, tombstones=not args.no_tombstones
    )
    events = list(workload.events)
    malformed = malformed_events(wrapped=args.wrapped) if args.malformed else []
    replays = stale_replays(workload, args.replays, seed=args.seed) if args.replays else []
    events += malformed + replays
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from cdcsync.config.settings import load_settings

            bootstrap = load_settings().bootstrap_servers
        delivered = produce(bootstrap, args.topic, events, partitions=args.partitions)
    except CdcsyncError as error:
        print(f"error: {error}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return 1
    counts = workload.counts
    print(
        f"produced {delivered} messages to {args.topic}: {counts['c']} inserts, {counts['u']} updates, "
        f"{counts['d']} deletes, {counts['tombstone']} tombstones, {len(malformed)} malformed, "
        f"{len(replays)} stale replays; {len(workload.expected)} live keys expected"
    )
    return 0
