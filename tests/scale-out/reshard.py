#!/usr/bin/python3
"""reshard.py: moves principals between the shards of the PL/Proxy cluster of
tests/scale-out when the partition count grows from OLD to NEW (powers of 2):
every principal whose owner hashtext(principal) & (NEW - 1) is not the shard
it is on moves, with its key rows (idempotency.keys) and its effects (orders,
api_keys), to its new owner. Then point the proxy at NEW partitions
(plproxy_cluster.sh partitions DIR NEW).

    reshard.py --old 2 --new 4 SHARD_DSN_0 SHARD_DSN_1 SHARD_DSN_2 SHARD_DSN_3

Per source shard, in one transaction on the source:

 1. pg_advisory_xact_lock(7235001): waits for the writers in flight on that
    shard (shop.check_owner takes the lock's shared side in every write) and
    holds new ones back until the move commits;
 2. UPDATE shop.shard SET nparts = NEW: the writers held back, and every later
    write the proxy still sends there under OLD, find that the shard no longer
    owns a moving principal and fail with SQLSTATE SH503 (503 + Retry-After):
    nothing is written on a shard that does not own the principal;
 3. per target shard, in a transaction on the target: COPY the moving
    principals' rows out of the source (binary) into temporary tables, INSERT
    them (ON CONFLICT DO NOTHING: a rerun after a failure between the two
    commits copies nothing twice); commit. Nothing is done about fences: from
    0.8.0 a moved key's next fence is above its old ones on any shard (the
    row carries its fence; docs/scale-out.md, "Fences across moves"). 0.7.0
    needed the target's sequence advanced past the source's here. First, in
    that transaction, the source's expiry policies (0.8.0) that the target
    lacks are copied to it (a policy the target has stays as it is): a moved
    key of a refusing action must expire into a tombstone on its new shard,
    not be deleted and run again.
 4. DELETE the moved rows from the source; commit (this releases the lock).

Orders and API keys keep their ids: each shard draws them from a range of its
own (shard.sql), so ids never collide on the target. Prints one line per move.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Tuple

import psycopg

LOCK = 7235001
TABLES = ("idempotency.keys", "public.orders", "public.api_keys")
POLICIES = "idempotency.expiry_policies"


def policies(conn: psycopg.Connection) -> Optional[List[Tuple[str, str, object]]]:
    """The expiry policies of a shard (action, on_expiry, grace); None before 0.8.0 (no table)."""
    if conn.execute("SELECT pg_catalog.to_regclass(%s)", (POLICIES,)).fetchone()[0] is None:
        return None
    return conn.execute(f"SELECT action, on_expiry, grace FROM {POLICIES} ORDER BY 1").fetchall()


def copy_policies(source: Optional[list], dst: psycopg.Connection, target: int) -> int:
    """The source's policies the target lacks, inserted on the target; returns how many."""
    if not source:
        return 0
    if policies(dst) is None:
        raise RuntimeError(f"shard {target} has no {POLICIES} (idempotency before 0.8.0) and the"
                           " source has expiry policies: update the extension on every shard first")
    copied = 0
    for row in source:
        cur = dst.execute(f"INSERT INTO {POLICIES} (action, on_expiry, grace) VALUES (%s, %s, %s)"
                          " ON CONFLICT (action) DO NOTHING", row)
        copied += cur.rowcount
    return copied


def move_from(source_dsn: str, me: int, new: int, shard_dsns: List[str]) -> Dict[int, int]:
    """Moves every principal of shard `me` that it does not own under `new` partitions;
    returns the number of principals moved to each target."""
    moved: Dict[int, int] = {}
    with psycopg.connect(source_dsn) as src:
        src.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (LOCK,))
        (index,) = src.execute("SELECT me FROM shop.shard").fetchone()
        if index != me:
            raise RuntimeError(f"shard {me}'s DSN reaches shard {index}")
        src.execute("UPDATE shop.shard SET nparts = %s", (new,))
        src.execute(
            "CREATE TEMP TABLE moving ON COMMIT DROP AS"
            " SELECT principal, pg_catalog.hashtext(principal) & (%s - 1) AS target FROM ("
            "   SELECT principal FROM idempotency.keys UNION SELECT principal FROM public.orders"
            "   UNION SELECT principal FROM public.api_keys) p"
            " WHERE pg_catalog.hashtext(principal) & (%s - 1) <> %s",
            (new, new, me),
        )
        targets = [t for (t,) in src.execute("SELECT DISTINCT target FROM moving ORDER BY 1")]
        source_policies = policies(src)
        for target in targets:
            with psycopg.connect(shard_dsns[target]) as dst:
                (index,) = dst.execute("SELECT me FROM shop.shard").fetchone()
                if index != target:
                    raise RuntimeError(f"shard {target}'s DSN reaches shard {index}")
                copied = copy_policies(source_policies, dst, target)
                if copied:
                    print(f"reshard: shard {me} -> shard {target}: {copied} expiry policies"
                          " the target lacked copied")
                for table in TABLES:
                    staged = "staged_" + table.split(".")[1]
                    dst.execute(f"CREATE TEMP TABLE {staged} (LIKE {table}) ON COMMIT DROP")
                    with src.cursor().copy(
                        f"COPY (SELECT t.* FROM {table} t JOIN moving m USING (principal)"
                        f" WHERE m.target = {int(target)}) TO STDOUT (FORMAT binary)"
                    ) as out, dst.cursor().copy(f"COPY {staged} FROM STDIN (FORMAT binary)") as into:
                        for chunk in out:
                            into.write(chunk)
                    dst.execute(f"INSERT INTO {table} SELECT * FROM {staged} ON CONFLICT DO NOTHING")
                (count,) = dst.execute("SELECT count(DISTINCT principal) FROM staged_keys").fetchone()
                moved[target] = count
            # the target committed; now the source lets go of the rows
        for table in TABLES:
            src.execute(f"DELETE FROM {table} t USING moving m WHERE t.principal = m.principal")
    return moved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=int, required=True, help="partitions before")
    parser.add_argument("--new", type=int, required=True, help="partitions after")
    parser.add_argument("shard_dsn", nargs="+", help="every shard's DSN, in partition order (NEW of them)")
    args = parser.parse_args()
    for n in (args.old, args.new):
        if n < 1 or n & (n - 1):
            parser.error("partition counts are powers of 2")
    if args.new < args.old or len(args.shard_dsn) != args.new:
        parser.error("NEW >= OLD and one DSN per NEW partition")
    for me in range(args.old):
        moved = move_from(args.shard_dsn[me], me, args.new, args.shard_dsn)
        for target, count in sorted(moved.items()):
            print(f"reshard: shard {me} -> shard {target}: {count} principal(s) with keys moved")
        if not moved:
            print(f"reshard: shard {me}: nothing to move")
    return 0


if __name__ == "__main__":
    sys.exit(main())
