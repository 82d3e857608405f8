#!/usr/bin/python3
"""check.py: the exactly-once and resharding checks of the PL/Proxy scale-out
test (tests/integration/scale_out_plproxy.sh runs both). Requests go through
the proxy database's shop.create_order / shop.create_api_key; the checks read
every shard directly.

    check.py exactly-once --proxy DSN --shard DSN [--shard DSN ...]
        Many threads fire every key of many principals several times at once
        (duplicates overlap: the handler sleeps a little). Then: every answer
        201; per key one first run and the rest replays of the same bytes
        (status, headers, body); across the shards exactly one order per key,
        only on the owning shard (hashtext(principal) & (shards - 1)); one key
        row per key, only there, pointing at that order; a later retry with the
        body spelled differently replays the same bytes.

    check.py reshard --proxy DSN --shard DSN x4 --cluster-dir DIR
        The proxy starts on 2 of the 4 shards. Writes keys (orders and one-time
        secrets), keeps writing new keys from background threads, moves the
        principals to their owners under 4 partitions (reshard.py) and switches
        the proxy to 4 (plproxy_cluster.sh partitions DIR 4) while the writers
        run (a 503 SH503 during the move is retried, as a client would). Then:
        every key's retry replays its first answer byte for byte, another body
        is 422, a secret's retry is 409 one-time-secret, one effect per key
        across the shards, no key row or order on a shard that does not own it,
        and fences across the move with cleanup between: the sources hand out
        many more fences than the targets before the move (their sequences
        far ahead, as on busy nodes), no setval anywhere; after the move some
        moved keys expire and the target's cleanup deletes them; their next
        use on the target hands out a fence above every fence the key had;
        secret keys of the API keys' action, refused after expiry by a policy
        set on the sources only, expire into tombstones on their new shards
        (reshard.py copies the policy) and their retries are 410.

Prints "ok - ..." / "not ok - ..." lines and "N passed, N failed"; exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import psycopg

SECRET_ACTION = "POST /api-keys"  # the action of shop.create_api_key's keys
HERE = os.path.dirname(os.path.abspath(__file__))
Answer = Tuple[int, list, bytes, bool]

passed = 0
failed = 0


def check(what: str, condition: bool, detail: str = "") -> bool:
    global passed, failed
    if condition:
        passed += 1
        print(f"ok - {what}")
    else:
        failed += 1
        print(f"not ok - {what}")
        for line in detail.splitlines()[:20]:
            print(f"#   {line}")
    sys.stdout.flush()
    return condition


class Proxy:
    """One autocommit connection per thread to the proxy database."""

    def __init__(self, dsn: str, retry_moving: bool = False) -> None:
        self.dsn = dsn
        self.retry_moving = retry_moving
        self.local = threading.local()
        self.all: List[psycopg.Connection] = []
        self.lock = threading.Lock()
        self.moving_retries = 0

    def conn(self) -> psycopg.Connection:
        conn = getattr(self.local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = psycopg.connect(self.dsn, autocommit=True)
            self.local.conn = conn
            with self.lock:
                self.all.append(conn)
        return conn

    def order(self, principal: str, key: str, body: bytes, delay_ms: int = 0) -> Answer:
        """POST /orders through the proxy; with retry_moving, a 503 of a moving principal
        (SH503) is retried for 60 s at most, as a client retries a 503 (the window
        between the rows' move and the proxy's switch lasted over 10 s on a loaded
        machine: a stock-machine run under a load of 10 failed so)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                status, headers, out, replayed = self.conn().execute(
                    "SELECT status, headers, response_body, replayed"
                    " FROM shop.create_order(%s, %s, '/orders', %s, %s)",
                    (principal, key, body, delay_ms),
                ).fetchone()
                return status, headers, bytes(out), replayed
            except psycopg.Error as error:
                if self.retry_moving and getattr(error, "sqlstate", None) == "SH503" and time.monotonic() < deadline:
                    with self.lock:
                        self.moving_retries += 1
                    time.sleep(0.05)
                    continue
                raise

    def api_key(self, principal: str, key: str, body: bytes) -> Answer:
        status, headers, out, replayed = self.conn().execute(
            "SELECT status, headers, response_body, replayed FROM shop.create_api_key(%s, %s, %s)",
            (principal, key, body),
        ).fetchone()
        return status, headers, bytes(out), replayed

    def close(self) -> None:
        for conn in self.all:
            conn.close()


def owner(proxy_dsn: str, principals: List[str], shards: int) -> Dict[str, int]:
    """hashtext(principal) & (shards - 1), computed by the proxy's server as PL/Proxy does."""
    with psycopg.connect(proxy_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT p, pg_catalog.hashtext(p) & %s FROM unnest(%s::text[]) p",
                            (shards - 1, principals)).fetchall()
    return dict(rows)


def body_of(key: str, spelled: bool = False) -> bytes:
    if spelled:  # the same document, spelled differently (member order, whitespace, escapes): same fingerprint
        item = json.dumps(key).replace("k", "\\u006b")
        return ('{ "quantity" : 1 ,\n "item" : %s }' % item).encode()
    return json.dumps({"item": key, "quantity": 1}, separators=(",", ":")).encode()


def placement(shard_dsns: List[str], prefix: str) -> Tuple[Dict, Dict, Dict]:
    """Key rows, orders and API keys of principals starting with prefix, per shard."""
    keys: Dict[Tuple[str, str], List[Tuple[int, Optional[str], int]]] = {}
    orders: Dict[Tuple[str, str], List[Tuple[int, int]]] = {}
    api: Dict[str, List[int]] = {}
    for index, dsn in enumerate(shard_dsns):
        with psycopg.connect(dsn, autocommit=True) as conn:
            for principal, key, resource, fence in conn.execute(
                "SELECT principal, key, resource_id, fence FROM idempotency.keys WHERE principal LIKE %s",
                (prefix + "%",),
            ):
                keys.setdefault((principal, key), []).append((index, resource, fence))
            for principal, item, order_id in conn.execute(
                "SELECT principal, item, id FROM public.orders WHERE principal LIKE %s", (prefix + "%",)
            ):
                orders.setdefault((principal, item), []).append((index, order_id))
            for (principal,) in conn.execute(
                "SELECT principal FROM public.api_keys WHERE principal LIKE %s", (prefix + "%",)
            ):
                api.setdefault(principal, []).append(index)
    return keys, orders, api


def check_placement(label: str, proxy_dsn: str, shard_dsns: List[str], prefix: str,
                    expected_keys: List[Tuple[str, str]], secrets: List[str]) -> None:
    keys, orders, api = placement(shard_dsns, prefix)
    principals = sorted({p for p, _ in expected_keys} | set(secrets))
    owners = owner(proxy_dsn, principals, len(shard_dsns))
    order_keys = [(p, k) for p, k in expected_keys]
    bad_orders = [(pk, orders.get(pk)) for pk in order_keys
                  if len(orders.get(pk, [])) != 1 or orders[pk][0][0] != owners[pk[0]]]
    stray_orders = [pk for pk in orders if pk not in set(order_keys)]
    check(f"{label}: one order per key ({len(order_keys)} keys), each on the owning shard of {len(shard_dsns)}",
          not bad_orders and not stray_orders, f"wrong: {bad_orders[:5]}\nstray: {stray_orders[:5]}")
    expected_key_rows = set(order_keys) | {(p, "secret") for p in secrets}
    bad_keys = [(pk, keys.get(pk)) for pk in expected_key_rows
                if len(keys.get(pk, [])) != 1 or keys[pk][0][0] != owners[pk[0]]]
    stray_keys = [pk for pk in keys if pk not in expected_key_rows]
    check(f"{label}: one key row per key ({len(expected_key_rows)}), each on the owning shard, none elsewhere",
          not bad_keys and not stray_keys, f"wrong: {bad_keys[:5]}\nstray: {stray_keys[:5]}")
    dangling = [pk for pk in order_keys if pk in keys and pk in orders
                and keys[pk][0][1] != str(orders[pk][0][1])]
    check(f"{label}: every key row's resource_id is its order's id", not dangling, repr(dangling[:5]))
    if not secrets:
        return
    bad_api = [(p, api.get(p)) for p in secrets if api.get(p) != [owners[p]]]
    check(f"{label}: one API key per secret key ({len(secrets)}), on the owning shard", not bad_api,
          repr(bad_api[:5]))


def fire(proxy: Proxy, jobs: List[Tuple[str, str]], dups: int, threads: int,
         delay_ms: int) -> Dict[Tuple[str, str], List[Answer]]:
    """Every (principal, key) sent dups times; the duplicates of a key are submitted together."""
    answers: Dict[Tuple[str, str], List[Answer]] = {job: [] for job in jobs}
    lock = threading.Lock()

    def one(job: Tuple[str, str], spelled: bool) -> None:
        answer = proxy.order(job[0], job[1], body_of(job[1], spelled), delay_ms)
        with lock:
            answers[job].append(answer)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(one, job, d % 2 == 1) for job in jobs for d in range(dups)]
        for future in futures:
            future.result()
    return answers


def check_answers(label: str, answers: Dict[Tuple[str, str], List[Answer]]) -> Dict[Tuple[str, str], Answer]:
    """One first run per key, the others replays of its bytes; returns each key's first answer."""
    firsts: Dict[Tuple[str, str], Answer] = {}
    bad_status, bad_first, bad_replay = [], [], []
    for job, got in answers.items():
        if any(a[0] != 201 for a in got):
            bad_status.append((job, [a[0] for a in got]))
            continue
        first = [a for a in got if not a[3]]
        if len(first) != 1:
            bad_first.append((job, len(first)))
            continue
        firsts[job] = first[0]
        for a in got:
            if a[3] and (a[2] != first[0][2] or a[1] != first[0][1] + [["Idempotent-Replay", "true"]]):
                bad_replay.append((job, a, first[0]))
    total = sum(len(v) for v in answers.values())
    check(f"{label}: all {total} answers are 201", not bad_status, repr(bad_status[:5]))
    check(f"{label}: exactly one first run per key", not bad_first, repr(bad_first[:5]))
    check(f"{label}: every duplicate replays the first answer byte for byte (body, headers + Idempotent-Replay)",
          not bad_replay, repr(bad_replay[:3]))
    return firsts


def replays_again(label: str, proxy: Proxy, firsts: Dict[Tuple[str, str], Answer]) -> None:
    bad = []
    for (principal, key), first in firsts.items():
        again = proxy.order(principal, key, body_of(key, spelled=True))
        if again != (first[0], first[1] + [["Idempotent-Replay", "true"]], first[2], True):
            bad.append(((principal, key), again, first))
    check(f"{label}: a later retry of each of {len(firsts)} keys (body spelled differently) replays the same bytes",
          not bad, repr(bad[:3]))


def exactly_once(args: argparse.Namespace) -> None:
    prefix = f"eo-{uuid.uuid4().hex[:8]}-"
    jobs = [(f"{prefix}{p}", f"key-{k}") for p in range(args.principals) for k in range(args.keys)]
    proxy = Proxy(args.proxy)
    try:
        started = time.monotonic()
        answers = fire(proxy, jobs, args.dups, args.threads, args.delay_ms)
        print(f"# {len(jobs)} keys x {args.dups} duplicates through the proxy in {time.monotonic() - started:.1f} s")
        firsts = check_answers("exactly once", answers)
        check_placement("exactly once", args.proxy, args.shard, prefix, jobs, [])
        replays_again("exactly once", proxy, firsts)
        shards_used = {o for o in owner(args.proxy, sorted({p for p, _ in jobs}), len(args.shard)).values()}
        check(f"exactly once: the principals spread over all {len(args.shard)} shards",
              shards_used == set(range(len(args.shard))), repr(shards_used))
    finally:
        proxy.close()


def reshard(args: argparse.Namespace) -> None:
    shards = args.shard
    if len(shards) != 4:
        raise SystemExit("reshard: four --shard DSNs")
    prefix = f"rs-{uuid.uuid4().hex[:8]}-"
    jobs = [(f"{prefix}{p}", f"key-{k}") for p in range(args.principals) for k in range(args.keys)]
    secrets = [f"{prefix}{p}" for p in range(0, args.principals, 4)]
    proxy = Proxy(args.proxy, retry_moving=True)
    try:
        with psycopg.connect(args.proxy, autocommit=True) as conn:
            parts = conn.execute("SELECT shop.partitions()").fetchone()[0]
        check("reshard: the proxy starts with 2 partitions", parts == 2, f"{parts}")
        for dsn in shards[:2]:  # busy sources: sequences far ahead of the new shards' (0.7.0 drew from them)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT count(nextval('idempotency.fences')) FROM generate_series(1, 5000)")
                # API keys refuse their expired keys (0.8.0), set on the sources only: the move takes it along
                conn.execute("SELECT idempotency.set_expiry_policy(%s, 'refuse')", (SECRET_ACTION,))
        firsts = check_answers("before the move", fire(proxy, jobs, 2, args.threads, 0))
        secret_first = {p: proxy.api_key(p, "secret", b'{"name":"ci"}') for p in secrets}
        check("before the move: API keys created (201)", all(a[0] == 201 for a in secret_first.values()),
              repr([a[0] for a in secret_first.values()]))
        check_placement("before the move", args.proxy, shards[:2], prefix, jobs, secrets)
        owners2 = owner(args.proxy, sorted({p for p, _ in jobs}), 2)
        owners4 = owner(args.proxy, sorted({p for p, _ in jobs}), 4)
        moving = [p for p in owners2 if owners2[p] != owners4[p]]
        check("some principals move (owner under 4 != owner under 2), some stay",
              0 < len(moving) < len(owners2), f"{len(moving)} of {len(owners2)}")
        fences_before = fences_of(shards[:2], prefix)

        # Writers keep going during the move: new keys, new principals and old ones.
        stop = threading.Event()
        live_jobs: List[Tuple[str, str]] = []
        live_answers: Dict[Tuple[str, str], List[Answer]] = {}
        live_lock = threading.Lock()

        def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                job = (f"{prefix}{(w * 7 + n) % args.principals}", f"live-{w}-{n}")
                a = proxy.order(job[0], job[1], body_of(job[1]))
                b = proxy.order(job[0], job[1], body_of(job[1], spelled=True))
                with live_lock:
                    live_jobs.append(job)
                    live_answers[job] = [a, b]
                n += 1

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        time.sleep(0.5)
        move = subprocess.run([sys.executable, os.path.join(HERE, "reshard.py"), "--old", "2", "--new", "4", *shards],
                              capture_output=True, text=True)
        print("".join("# " + line + "\n" for line in move.stdout.splitlines()), end="")
        check("reshard.py moved the rows", move.returncode == 0, move.stdout + move.stderr)
        time.sleep(0.3)  # writers of moving principals get 503 (SH503) now, and retry
        switch = subprocess.run(["bash", os.path.join(HERE, "plproxy_cluster.sh"), "partitions", args.cluster_dir, "4"],
                                capture_output=True, text=True)
        check("the proxy switched to 4 partitions", switch.returncode == 0, switch.stdout + switch.stderr)
        time.sleep(0.5)
        stop.set()
        for t in writers:
            t.join()
        print(f"# {len(live_jobs)} keys written (and retried) by 4 writers during the move;"
              f" {proxy.moving_retries} attempt(s) refused by a shard that no longer owned the principal (SH503)")
        live_firsts = check_answers("written during the move", live_answers)

        check_placement("after the move", args.proxy, shards, prefix, jobs + live_jobs, secrets)
        replays_again("after the move", proxy, {**firsts, **live_firsts})
        mismatches = [job for job in jobs if proxy.order(job[0], job[1], b'{"item":"other"}')[0] != 422]
        check(f"after the move: another body under each of {len(jobs)} old keys is 422", not mismatches,
              repr(mismatches[:5]))
        secret_again = {p: proxy.api_key(p, "secret", b'{"name":"ci"}') for p in secrets}
        check("after the move: a secret's retry is 409 one-time-secret with Idempotent-Replay",
              all(a[0] == 409 and a[3] and b"one-time-secret" in a[2] and b"sk_" not in a[2]
                  for a in secret_again.values()), repr(list(secret_again.values())[:2]))
        fresh = [(f"{prefix}{p}", "after-move") for p in range(args.principals)]
        fresh_firsts = check_answers("new keys after the move", fire(proxy, fresh, 2, args.threads, 0))
        check_placement("after the move, new keys too", args.proxy, shards, prefix,
                        jobs + live_jobs + list(fresh_firsts), secrets)
        moved_keys = [job for job in jobs if owners2[job[0]] != owners4[job[0]]]
        fences_after_cleanup(proxy, shards, prefix, moved_keys, owners4, fences_before)
        refused_after_move(proxy, shards, [p for p in secrets if owners2[p] != owners4[p]], owners4)
    finally:
        proxy.close()


def fences_of(shard_dsns: List[str], prefix: str) -> Dict[Tuple[str, str], int]:
    """The fence of every key row of principals starting with prefix, over the shards."""
    fences: Dict[Tuple[str, str], int] = {}
    for dsn in shard_dsns:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for principal, key, fence in conn.execute(
                    "SELECT principal, key, fence FROM idempotency.keys WHERE principal LIKE %s", (prefix + "%",)):
                fences[(principal, key)] = fence
    return fences


def fences_after_cleanup(proxy: Proxy, shards: List[str], prefix: str, moved: List[Tuple[str, str]],
                         owners4: Dict[str, int], before: Dict[Tuple[str, str], int]) -> None:
    """Moved keys expire (their times put back two days) and their new shard's cleanup
    deletes them; each one's next use there must hand out a fence above the key's fence
    from before the move (issue 24: fences never repeat across moves, no setval)."""
    sample = moved[:24]
    check("fences: moved keys kept their fence on their new shard",
          all(fences_of([shards[owners4[p]]], prefix).get((p, k)) == before[(p, k)] for p, k in sample[:4]),
          repr(sample[:4]))
    for target in sorted({owners4[p] for p, _ in sample}):
        mine = [k for k in sample if owners4[k[0]] == target]
        with psycopg.connect(shards[target], autocommit=True) as conn:
            conn.execute("UPDATE idempotency.keys SET created_at = created_at - interval '2 days',"
                         " expires_at = expires_at - interval '2 days'"
                         " WHERE (principal, key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                         ([p for p, _ in mine], [k for _, k in mine]))
            conn.execute("CALL idempotency.cleanup()")
    gone = [k for k in sample if k in fences_of(shards, prefix)]
    check(f"fences: cleanup on the new shards deleted the {len(sample)} expired moved keys", not gone, repr(gone[:4]))
    again = {job: proxy.order(job[0], job[1], body_of(job[1])) for job in sample}
    check("fences: each cleaned-up key runs anew (201, not a replay)",
          all(a[0] == 201 and not a[3] for a in again.values()), repr(list(again.values())[:2]))
    after = fences_of(shards, prefix)
    repeated = [(job, before[job], after.get(job)) for job in sample if not (after.get(job, 0) > before[job])]
    check(f"fences: after the move and a cleanup, the {len(sample)} keys' new fences are above their old ones"
          " (the targets' sequences far behind, no setval)", not repeated, repr(repeated[:4]))


def refused_after_move(proxy: Proxy, shards: List[str], moved: List[str], owners4: Dict[str, int]) -> None:
    """Expiry policies across moves: the sources refuse expired API keys (set before the
    move, on them only). Each moved secret key expires on its new shard and that shard's
    cleanup keeps a tombstone; its retry through the proxy is 410, not a second API key."""
    if not check("policies: some principals with a secret key moved", bool(moved)):
        return
    states = []
    for target in sorted({owners4[p] for p in moved}):
        mine = [p for p in moved if owners4[p] == target]
        with psycopg.connect(shards[target], autocommit=True) as conn:
            conn.execute("UPDATE idempotency.keys SET created_at = created_at - interval '2 days',"
                         " expires_at = expires_at - interval '2 days'"
                         " WHERE key = 'secret' AND principal = ANY(%s)", (mine,))
            conn.execute("CALL idempotency.cleanup()")
            states += conn.execute("SELECT principal, state FROM idempotency.keys"
                                   " WHERE key = 'secret' AND principal = ANY(%s)", (mine,)).fetchall()
    check(f"policies: the {len(moved)} moved secret keys expired into tombstones on their new shards",
          sorted(p for p, state in states if state == "expired") == sorted(moved), repr(states[:4]))
    again = {p: proxy.api_key(p, "secret", b'{"name":"ci"}') for p in moved}
    check("policies: their retries through the proxy are 410 idempotency-key-expired, no new API key",
          all(a[0] == 410 and b"idempotency-key-expired" in a[2] for a in again.values()),
          repr(list(again.values())[:2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("exactly-once", "reshard"))
    parser.add_argument("--proxy", required=True, help="DSN of the proxy database")
    parser.add_argument("--shard", action="append", required=True, help="shard DSN, in partition order")
    parser.add_argument("--cluster-dir", help="the folder of plproxy_cluster.sh (reshard)")
    parser.add_argument("--principals", type=int, default=48)
    parser.add_argument("--keys", type=int, default=4, help="keys per principal")
    parser.add_argument("--dups", type=int, default=4, help="copies of each request fired at once")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--delay-ms", type=int, default=20, help="handler sleep: the duplicates overlap")
    args = parser.parse_args()
    try:
        exactly_once(args) if args.mode == "exactly-once" else reshard(args)
    except Exception:  # a crash is a failure, never a skip
        import traceback

        check(f"{args.mode}: ran to the end", False, traceback.format_exc())
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
