#!/usr/bin/python3
"""Drives one example service while its database fails under it (issue 41).

    driver.py --base-url http://127.0.0.1:8080 --dsn "host=... dbname=..." \\
              --restart-cmd "pg_ctl ... restart" [--clients 8] [--keys 24] [--seconds 20]

CLIENTS threads post orders over a small key space (KEYS keys of one principal,
POST /orders, now and then with ?delay_ms so that faults land inside the
handler) while a fault thread terminates (pg_terminate_backend) and cancels
(pg_cancel_backend) the service's backends and, once, runs RESTART_CMD (a
server restart). Then it waits for the database and the service and asks every
key once more, and checks:

- every answer is a 2xx, a 409 request-in-progress, or the fault answer of
  client/protocol.json (database_fault: 503, problem+json, Retry-After, the
  body byte for byte); a request without an answer is a failure;
- every 2xx of a key is byte-identical (status and body) to the key's first;
- no key is stuck: after the run each key gets a 2xx within a bounded wait;
- one effect per key: exactly one row of the example's orders table per key;
- faults happened: at least one termination, the restart, one fault answer.

With --mode proxy (examples/proxy-service: the lease protocol, an effect outside
the database) the clients post to /v1/call/charge and the effect is the
upstream's call, which the database cannot undo: a holder whose lease or whose
completion the faults took may have called upstream without storing the answer,
so a key may be called again by the holder after it (docs/leases.md). There the
checks are: every 2xx of a key whose outcome (X-Lease-Outcome) is fresh or a
replay is byte-identical to the stored one; a `fresh_unfenced` 2xx (the lease was
lost while the call ran) is counted, not compared; every key ends replayed; and
every upstream call beyond one per key is explained by a holder that did not
store its answer (a fault answer or a fresh_unfenced one).

Standard library and psycopg only. Prints a summary and "ok"/"not ok" lines;
exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import psycopg

PROTOCOL = json.loads((Path(__file__).resolve().parents[2] / "client" / "protocol.json")
                      .read_text("utf-8"))
FAULT = PROTOCOL["database_fault"]
FAULT_KIND = PROTOCOL["problems"][FAULT["problem"]]
IN_PROGRESS_TYPE = (PROTOCOL["problem_type_base"]
                    + PROTOCOL["problems"]["request_in_progress"]["type"])
# The fault answer, byte for byte: the clients' problem bodies are compact JSON
# with sorted members and raw UTF-8.
FAULT_BODY = json.dumps({"detail": FAULT["detail"], "status": FAULT_KIND["status"],
                         "title": FAULT_KIND["title"],
                         "type": PROTOCOL["problem_type_base"] + FAULT_KIND["type"]},
                        ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
RETRY_AFTER = str(PROTOCOL["default_retry_after_seconds"])

Answer = Tuple[int, Dict[str, str], bytes]


class Run:
    """What the clients and the fault thread saw, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: collections.Counter = collections.Counter()
        self.faults: collections.Counter = collections.Counter()
        self.first_2xx: Dict[str, Tuple[int, bytes]] = {}
        self.unfenced = 0  # --mode proxy: 2xx answers of holders that lost their lease
        self.failures: List[str] = []
        self.requests = 0

    def fail(self, what: str) -> None:
        with self.lock:
            if len(self.failures) < 200:
                self.failures.append(what)


PATH = "/orders"  # --mode proxy: /v1/call/charge


def post(base: str, key: str, body: bytes, principal: str, query: str = "",
         timeout: float = 20.0) -> Answer:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", PATH + query, body=body,
                     headers={"Content-Type": "application/json", "Idempotency-Key": key,
                              "Authorization": "Bearer " + principal})
        response = conn.getresponse()
        data = response.read()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, data
    finally:
        conn.close()


def classify(run: Run, key: str, answer: Answer) -> str:
    """'ok' (a 2xx, the key's bytes), 'in_progress' (409), 'fault' (the 503), or 'bad'."""
    status, headers, data = answer
    with run.lock:
        run.statuses[status] += 1
    if 200 <= status < 300 and headers.get("x-lease-outcome") == "fresh_unfenced":
        with run.lock:
            run.unfenced += 1
        return "ok"
    if 200 <= status < 300:
        with run.lock:
            first = run.first_2xx.setdefault(key, (status, data))
        if first != (status, data):
            run.fail(f"key {key}: a 2xx differs from its first: {status} {data[:200]!r}"
                     f" after {first[0]} {first[1][:200]!r}")
            return "bad"
        return "ok"
    if status == 409 and headers.get("content-type") == PROTOCOL["problem_content_type"]:
        try:
            if json.loads(data).get("type") == IN_PROGRESS_TYPE:
                return "in_progress"
        except ValueError:
            pass
    if (status == FAULT_KIND["status"] and data == FAULT_BODY
            and headers.get("content-type") == PROTOCOL["problem_content_type"]
            and headers.get("retry-after") == RETRY_AFTER):
        return "fault"
    run.fail(f"key {key}: answer {status} content-type={headers.get('content-type')}"
             f" retry-after={headers.get('retry-after')} body={data[:300]!r}")
    return "bad"


def client_loop(run: Run, args, keys: List[str], bodies: Dict[str, bytes], deadline: float,
                seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(args.max_requests):
        if time.monotonic() >= deadline:
            return
        key = rng.choice(keys)
        query = rng.choice(["", "", "?delay_ms=20", "?delay_ms=80"])
        with run.lock:
            run.requests += 1
        try:
            answer = post(args.base_url, key, bodies[key], args.principal, query)
        except (OSError, http.client.HTTPException) as error:
            run.fail(f"key {key}: no answer from the service: {error!r}")
            time.sleep(0.2)
            continue
        if classify(run, key, answer) != "ok":
            time.sleep(0.05)


def connect_admin(dsn: str, deadline: float) -> Optional[psycopg.Connection]:
    while time.monotonic() < deadline:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=2)
        except psycopg.Error:
            time.sleep(0.2)
    return None


def fault_loop(run: Run, args, deadline: float, stop: threading.Event) -> None:
    rng = random.Random(args.seed)
    restart_at = time.monotonic() + args.seconds * 0.3
    admin: Optional[psycopg.Connection] = None
    while not stop.is_set() and time.monotonic() < deadline:
        stop.wait(rng.uniform(0.1, 0.35))
        if time.monotonic() >= restart_at and run.faults["restart"] == 0:
            if admin is not None:
                admin.close()
                admin = None
            done = subprocess.run(["/bin/bash", "-c", args.restart_cmd], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                run.fail(f"the restart failed: {done.stdout} {done.stderr}")
            with run.lock:
                run.faults["restart"] += 1
            continue
        try:
            if admin is None:
                admin = connect_admin(args.dsn, deadline)
                if admin is None:
                    return
            kind = "terminate" if rng.random() < 0.6 else "cancel"
            function = "pg_terminate_backend" if kind == "terminate" else "pg_cancel_backend"
            # The service's backends, busy ones first: a fault inside a transaction.
            rows = admin.execute(
                f"SELECT {function}(pid) FROM (SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
                " ORDER BY state = 'idle', random() LIMIT %s) s",
                (rng.choice([1, 1, 2]),)).fetchall()
            with run.lock:
                run.faults[kind] += sum(1 for (signalled,) in rows if signalled)
        except psycopg.Error:
            if admin is not None:
                admin.close()
            admin = None
    if admin is not None:
        admin.close()


def wait_for_service(base: str, deadline: float) -> bool:
    url = urlsplit(base)
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    return False


def final_pass(run: Run, args, keys: List[str], bodies: Dict[str, bytes]) -> None:
    """Each key once more, until a 2xx (faults are retried with the same key)."""
    for key in keys:
        deadline = time.monotonic() + args.settle_seconds
        while True:
            try:
                kind = classify(run, key, post(args.base_url, key, bodies[key], args.principal))
            except (OSError, http.client.HTTPException) as error:
                run.fail(f"key {key}: no answer from the service after the run: {error!r}")
                return
            if kind == "ok":
                break
            if kind == "bad" or time.monotonic() >= deadline:
                run.fail(f"key {key}: stuck, no final answer after the run ({kind})")
                break
            time.sleep(0.2)


def check_effects(run: Run, args, keys: List[str], items: Dict[str, str]) -> None:
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        counts = dict(conn.execute("SELECT item, count(*) FROM orders WHERE principal = %s"
                                   " GROUP BY item", (args.principal,)).fetchall())
    for key in keys:
        if counts.get(items[key], 0) != 1:
            run.fail(f"key {key}: {counts.get(items[key], 0)} orders, not one")
    stray = set(counts) - set(items.values())
    if stray:
        run.fail(f"orders of no key: {sorted(stray)[:5]}")


def check_upstream_calls(run: Run, args, keys: List[str]) -> None:
    """--mode proxy: at least one upstream call per key, and every further call
    made by a holder that did not store its answer."""
    url = urlsplit(args.upstream_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("GET", "/calls")
        calls = int(json.loads(conn.getresponse().read())["calls"])
    finally:
        conn.close()
    unstored = run.statuses[FAULT_KIND["status"]] + run.unfenced
    print(f"{args.label}: {calls} upstream calls for {len(keys)} keys;"
          f" {run.unfenced} fresh_unfenced answers")
    if calls < len(keys):
        run.fail(f"{calls} upstream calls for {len(keys)} keys that all ended replayed")
    if calls - len(keys) > unstored:
        run.fail(f"{calls - len(keys)} upstream calls beyond one per key, but only {unstored}"
                 " holders that did not store their answer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--restart-cmd", required=True)
    parser.add_argument("--label", default="service")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--keys", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-requests", type=int, default=4000, help="per client")
    parser.add_argument("--settle-seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--mode", choices=["orders", "proxy"], default="orders")
    parser.add_argument("--upstream-url", help="--mode proxy: the upstream (GET /calls)")
    args = parser.parse_args()
    global PATH
    if args.mode == "proxy":
        PATH = "/v1/call/charge"
        if not args.upstream_url:
            parser.error("--mode proxy needs --upstream-url")
    run_id = uuid.uuid4().hex[:8]
    args.principal = f"faults-{run_id}"
    keys = [f"fault-{run_id}-{i}" for i in range(args.keys)]
    items = {key: "item-" + key for key in keys}
    bodies = {key: json.dumps({"item": items[key], "quantity": 1}).encode() for key in keys}
    if args.mode == "proxy":
        bodies = {key: json.dumps({"amount": 100 + i}).encode() for i, key in enumerate(keys)}

    run = Run()
    started = time.monotonic()
    deadline = started + args.seconds
    stop = threading.Event()
    faults = threading.Thread(target=fault_loop, args=(run, args, deadline, stop))
    clients = [threading.Thread(target=client_loop,
                                args=(run, args, keys, bodies, deadline, args.seed * 100 + i))
               for i in range(args.clients)]
    faults.start()
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    stop.set()
    faults.join()
    load = dict(run.statuses)

    if connect_admin(args.dsn, time.monotonic() + 30) is None:
        run.fail("the database did not come back within 30 s")
    elif not wait_for_service(args.base_url, time.monotonic() + 30):
        run.fail("the service does not answer /health after the run")
    else:
        final_pass(run, args, keys, bodies)
        if args.mode == "proxy":
            check_upstream_calls(run, args, keys)
        else:
            check_effects(run, args, keys, items)
    if run.faults["terminate"] == 0 or run.faults["restart"] != 1:
        run.fail(f"the faults did not happen: {dict(run.faults)}")
    if load.get(FAULT_KIND["status"], 0) == 0:
        run.fail("no request got the fault answer: the faults missed the service")

    print(f"{args.label}: {run.requests} requests in {time.monotonic() - started:.1f} s,"
          f" {args.clients} clients, {args.keys} keys;"
          f" faults {dict(sorted(run.faults.items()))};"
          f" answers during the run {dict(sorted(load.items()))};"
          f" all answers {dict(sorted(run.statuses.items()))}")
    for failure in run.failures[:30]:
        print(f"  {failure}")
    if len(run.failures) > 30:
        print(f"  ... and {len(run.failures) - 30} more")
    print(("ok" if not run.failures else "not ok") + f" - {args.label} under database faults")
    return 0 if not run.failures else 1


if __name__ == "__main__":
    sys.exit(main())
