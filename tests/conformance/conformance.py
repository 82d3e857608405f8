#!/usr/bin/python3
"""HTTP conformance suite for the example services of pg_idempotency.

    conformance.py --base-url http://127.0.0.1:8080 --dsn "host=... dbname=..."

Plays the Idempotency-Key contract against a running service and checks every
answer byte for byte: statuses, bodies (problem bodies exactly as the C++
client writes them), Idempotent-Replay and the kept headers, Retry-After. The
DSN reaches the service's database: it counts effects (orders and api_keys
rows of the scenario's principal: exactly one per key) and holds keys to
provoke 409s. Every scenario uses a principal of its own, so the suite can run
again against the same database.

Routes every example service provides (examples/orders-service is the
reference): POST /orders (?delay_ms=N), POST /reject/orders (reject mode), POST /flaky/orders,
POST /api-keys, POST /orders/stream (scenario `stream`, in streams.py). Scenario `expired`
(expired.py) needs --dsn as a superuser and a 0.8.0 extension (set_expiry_policy); it
fails, saying why, on an older one.

A service whose data is spread over shards (tests/scale-out: PL/Proxy) names
each shard's DSN with --shard-dsn, in partition order: effects are then counted
summed over every shard, and keys are held and looked up on the shard that owns
the principal, partition hashtext(principal) & (shards - 1) as PL/Proxy
computes it (hashtext evaluated on --dsn, the proxy's database).
Prints "ok - ..." / "not ok - ..." lines and "N passed, N failed"; exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import email.utils
import http.client
import json
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

import psycopg

from streams import stream_scenario  # tests/conformance/streams.py: the script's folder is on sys.path
import expired
import vectors  # tests/conformance/vectors.py: the shared scenario vectors of vectors.json

# The protocol table every client follows: problem types, titles, statuses,
# details, the replay header and the problem content type come from it.
PROTOCOL = json.loads((Path(__file__).resolve().parents[2] / "client" / "protocol.json").read_text("utf-8"))
PROBLEM_JSON = PROTOCOL["problem_content_type"]
REPLAY_HEADER = PROTOCOL["replay_header"]
EXPIRES_HEADER = PROTOCOL["expires_header"]
assert PROTOCOL["expires_format"] == "IMF-fixdate", "the suite checks IMF-fixdate expiry values only"

ORDER = b'{"item":"book","quantity":2}'
# The same document spelled differently: member order, whitespace, number
# spelling and a string escape. Its RFC 8785 form is ORDER's.
ORDER_RESPELLED = b'{ "quantity" : 2.0e0,\n  "item" : "b\\u006fok" }'
OTHER_ORDER = b'{"item":"pen","quantity":2}'


def problem(status: int, type_uri: str, title: str, detail: str) -> bytes:
    """A problem body exactly as nlohmann_json serializes it in the C++ client."""
    document = {"detail": detail, "status": status, "title": title, "type": type_uri}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def status(body: bytes) -> int:
    """The HTTP status of an expected problem body (the table's status)."""
    return int(json.loads(body)["status"])


@dataclass
class Reply:
    status: int
    headers: List[Tuple[str, str]]
    body: bytes

    def headers_named(self, name: str) -> List[str]:
        return [value for field_name, value in self.headers if field_name.lower() == name.lower()]

    def header(self, name: str) -> Optional[str]:
        for field_name, value in self.headers:
            if field_name.lower() == name.lower():
                return value
        return None

    def describe(self) -> str:
        heads = ", ".join(f"{n}: {v}" for n, v in self.headers if n.lower() not in ("date", "server"))
        return f"{self.status} [{heads}] {self.body[:300]!r}"


class Suite:
    def __init__(self, base_url: str, dsn: str, problem_base: str, shard_dsns: Optional[List[str]] = None) -> None:
        url = urlsplit(base_url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        self.dsn = dsn
        self.shard_dsns = shard_dsns or []
        if self.shard_dsns and len(self.shard_dsns) & (len(self.shard_dsns) - 1):
            raise ValueError("the number of --shard-dsn must be a power of 2 (PL/Proxy's partitions)")
        self.run_id = uuid.uuid4().hex[:8]
        self.protocol, self.problem_base = PROTOCOL, problem_base  # for scenarios in modules of their own
        self.passed = 0
        self.failed = 0
        base = problem_base
        problems, outcomes = PROTOCOL["problems"], PROTOCOL["outcomes"]

        def expected(name: str, detail: str) -> bytes:
            kind = problems[name]
            return problem(kind["status"], base + kind["type"], kind["title"], detail)

        self.missing = expected("key_missing", "POST requests need an Idempotency-Key header.")
        self.malformed = expected("key_malformed", "The Idempotency-Key must be 1 to 255 visible ASCII characters.")
        self.reuse = expected(outcomes["mismatch"]["problem"], outcomes["mismatch"]["detail"])
        self.in_progress = expected(outcomes["in_progress"]["problem"], outcomes["in_progress"]["detail"])
        self.secret = expected(outcomes["secret_replay"]["problem"], outcomes["secret_replay"]["detail"])
        self.invalid_order = problem(400, "about:blank", "Invalid order",
                                     'The body must be a JSON object with a non-empty "item" string.')
        self.internal = problem(500, "about:blank", "Internal error",
                                "The request failed; it is safe to retry with the same key.")

    # -- plumbing -----------------------------------------------------------

    def principal(self, scenario: str) -> str:
        return f"conformance-{self.run_id}-{scenario}"

    def post(self, path: str, body: bytes, principal: str, key: Union[str, bytes, None]) -> Reply:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            connection.putrequest("POST", path)
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(len(body)))
            connection.putheader("Authorization", f"Bearer {principal}")
            if key is not None:
                connection.putheader("Idempotency-Key", key)
            connection.endheaders(body)
            response = connection.getresponse()
            return Reply(response.status, response.getheaders(), response.read())
        finally:
            connection.close()

    def check(self, what: str, condition: bool, detail: str = "") -> bool:
        if condition:
            self.passed += 1
            print(f"ok - {what}")
        else:
            self.failed += 1
            print(f"not ok - {what}")
            if detail:
                for line in detail.splitlines():
                    print(f"#   {line}")
        sys.stdout.flush()
        return condition

    def expect(self, what: str, reply: Reply, status: int, body: Optional[bytes] = None,
               replay: Optional[bool] = None, content_type: Optional[str] = None) -> bool:
        ok = reply.status == status
        if body is not None:
            ok = ok and reply.body == body
        if replay is not None:
            ok = ok and (reply.header(REPLAY_HEADER) == "true") == replay
        if content_type is not None:
            ok = ok and reply.header("Content-Type") == content_type
        expected = f"expected {status}" + (f" {body!r}" if body is not None else "")
        if replay is not None:
            expected += f", Idempotent-Replay {'true' if replay else 'absent'}"
        if content_type is not None:
            expected += f", Content-Type {content_type}"
        return self.check(what, ok, f"{expected}\ngot {reply.describe()}")

    def key_dsn(self, principal: str) -> str:
        """Where the principal's keys live: the DSN, or the shard that owns it."""
        if not self.shard_dsns:
            return self.dsn
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            owner = conn.execute("SELECT pg_catalog.hashtext(%s) & %s",
                                 (principal, len(self.shard_dsns) - 1)).fetchone()[0]
        return self.shard_dsns[owner]

    def count(self, table: str, principal: str) -> int:
        total = 0
        for dsn in self.shard_dsns or [self.dsn]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(f"SELECT count(*) FROM {table} WHERE principal = %s", (principal,)).fetchone()
                total += row[0]
        return total

    def effects(self, what: str, table: str, principal: str, expected: int) -> None:
        got = self.count(table, principal)
        self.check(f"{what}: {expected} {table} row(s) in the database", got == expected, f"counted {got}")

    # -- scenarios ----------------------------------------------------------

    def first_request_and_replay(self) -> None:
        who, key = self.principal("replay"), "key-replay"
        first = self.post("/orders", ORDER, who, key)
        self.expect("first request is 201", first, 201, replay=False, content_type="application/json")
        document = json.loads(first.body) if first.status == 201 else {}
        self.check("first body is the order", document.get("item") == "book" and document.get("quantity") == 2,
                   first.describe())
        self.check("first request has Location /orders/<id>",
                   first.header("Location") == f"/orders/{document.get('id')}", first.describe())
        retry = self.post("/orders", ORDER_RESPELLED, who, key)
        self.expect("retry with the body spelled differently is 201 with the same bytes", retry, 201,
                    body=first.body, replay=True)
        for name in ("Content-Type", "Location"):
            self.check(f"replay keeps {name}", retry.header(name) == first.header(name) is not None,
                       f"first {first.header(name)!r}, replay {retry.header(name)!r}")
        other = self.post("/orders", OTHER_ORDER, who, key)
        self.expect("another body under the same key is 422 problem+json", other, status(self.reuse), body=self.reuse,
                    content_type=PROBLEM_JSON)
        again = self.post("/orders", ORDER, who, key)
        self.expect("the original request still replays after the 422", again, 201, body=first.body, replay=True)
        self.effects("one key, four requests", "orders", who, 1)

    def missing_and_malformed_keys(self) -> None:
        who = self.principal("keys")
        self.expect("no Idempotency-Key is 400", self.post("/orders", ORDER, who, None), status(self.missing),
                    body=self.missing,
                    content_type=PROBLEM_JSON)
        # An empty field value: some HTTP servers (cpp-httplib) drop the field,
        # so "missing" is as right as "malformed"; either body, byte for byte.
        empty = self.post("/orders", ORDER, who, "")
        self.check("an empty Idempotency-Key is 400 (missing or malformed)",
                   empty.status == status(self.missing) and empty.body in (self.missing, self.malformed),
                   empty.describe())
        cases: Dict[str, Union[str, bytes]] = {
            "256 characters": "k" * 256,
            "non-ASCII": "cl\u00e9".encode("utf-8"),
        }
        for name, key in cases.items():
            self.expect(f"a {name} Idempotency-Key is 400", self.post("/orders", ORDER, who, key),
                        status(self.malformed), body=self.malformed, content_type=PROBLEM_JSON)
        self.expect("a 255-character key is accepted", self.post("/orders", ORDER, who, "k" * 255), 201)
        self.effects("rejected keys have no effect", "orders", who, 1)

    def concurrent_requests(self) -> None:
        who, key = self.principal("concurrent"), "key-concurrent"
        replies: Dict[str, Reply] = {}

        def first() -> None:
            replies["first"] = self.post("/orders?delay_ms=1000", ORDER, who, key)

        thread = threading.Thread(target=first)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        replies["second"] = self.post("/orders?delay_ms=1000", ORDER, who, key)
        waited = time.monotonic() - started
        thread.join()
        a, b = replies["first"], replies["second"]
        self.expect("concurrent: the first is 201", a, 201, replay=False)
        self.expect("concurrent: the second waits and replays the same bytes", b, 201, body=a.body, replay=True)
        self.check("concurrent: the second waited for the first", waited >= 0.4, f"it took {waited:.2f} s")
        self.effects("two concurrent requests under one key", "orders", who, 1)

    def wait_runs_out(self) -> None:
        who, key = self.principal("held"), "key-held"
        with psycopg.connect(self.key_dsn(who)) as holder:
            outcome = holder.execute(
                "SELECT outcome FROM idempotency.begin(%s, %s, 'conformance',"
                " idempotency.fingerprint('POST', '/orders', %s))",
                (who, key, ORDER),
            ).fetchone()[0]
            self.check("the suite holds the key in a transaction", outcome == "started", outcome)
            # Read after begin: the setting exists once the extension's library is loaded.
            wait = holder.execute("SELECT current_setting('idempotency.wait_timeout')").fetchone()[0]
            started = time.monotonic()
            busy = self.post("/orders", ORDER, who, key)
            took = time.monotonic() - started
            holder.rollback()
        self.expect(f"a key held past the wait ({wait}) is 409 problem+json", busy, status(self.in_progress),
                    body=self.in_progress,
                    content_type=PROBLEM_JSON)
        retry_after = busy.header("Retry-After") or ""
        self.check("the 409 has Retry-After in seconds", retry_after.isdigit() and int(retry_after) >= 1,
                   f"Retry-After {retry_after!r} after {took:.1f} s")
        self.effects("a request that found the key held", "orders", who, 0)
        self.expect("after the holder rolled back the retry runs", self.post("/orders", ORDER, who, key), 201,
                    replay=False)
        self.effects("after the holder rolled back", "orders", who, 1)

    def lease_held(self) -> None:
        who, key = self.principal("lease"), "key-lease"
        with psycopg.connect(self.key_dsn(who), autocommit=True) as holder:
            fence = holder.execute(
                "SELECT fence FROM idempotency.acquire(%s, %s, 'conformance',"
                " idempotency.fingerprint('POST', '/orders', %s), lease => '30 seconds')",
                (who, key, ORDER),
            ).fetchone()[0]
            busy = self.post("/orders", ORDER_RESPELLED, who, key)
            self.expect("a key under a live lease is 409 problem+json", busy, status(self.in_progress),
                        body=self.in_progress)
            retry_after = busy.header("Retry-After") or ""
            self.check("Retry-After is the rest of the lease (1..30 s)",
                       retry_after.isdigit() and 1 <= int(retry_after) <= 30, f"Retry-After {retry_after!r}")
            holder.execute("SELECT idempotency.release(%s, %s, %s)", (who, key, fence))
        self.expect("after release the retry runs", self.post("/orders", ORDER, who, key), 201, replay=False)
        self.effects("a key taken by a lease, then released", "orders", who, 1)

    def failure_is_not_stored(self) -> None:
        who, key = self.principal("flaky"), "key-flaky"
        failed = self.post("/flaky/orders", ORDER, who, key)
        self.expect("a handler that fails answers 500", failed, 500, body=self.internal, replay=False)
        self.effects("the failed attempt left no effect", "orders", who, 0)
        retry = self.post("/flaky/orders", ORDER, who, key)
        self.expect("the retry runs again (201, not a replay)", retry, 201, replay=False)
        again = self.post("/flaky/orders", ORDER_RESPELLED, who, key)
        self.expect("and is then replayed", again, 201, body=retry.body, replay=True)
        self.effects("500, then 201, then a replay", "orders", who, 1)

    def final_error_is_stored(self) -> None:
        who, key = self.principal("final4xx"), "key-final"
        first = self.post("/orders", b'{"item":""}', who, key)
        self.expect("an invalid order is a final 400", first, 400, body=self.invalid_order, replay=False,
                    content_type=PROBLEM_JSON)
        retry = self.post("/orders", b'{ "item" : "" }', who, key)
        self.expect("its retry replays the 400 with the same bytes", retry, 400, body=self.invalid_order,
                    replay=True, content_type=PROBLEM_JSON)
        other = self.post("/orders", ORDER, who, key)
        self.expect("the stored 400 holds the key: another body is 422", other, status(self.reuse), body=self.reuse)
        self.effects("a final 4xx", "orders", who, 0)

    def expiry_header(self) -> None:
        who, key = self.principal("expiry"), "key-expiry"
        first = self.post("/orders", ORDER, who, key)
        self.expect("expiry: the first request is 201", first, 201, replay=False)
        values = first.headers_named(EXPIRES_HEADER)
        self.check(f"expiry: the first response has one {EXPIRES_HEADER}", len(values) == 1, first.describe())
        with psycopg.connect(self.key_dsn(who), autocommit=True) as conn:
            row = conn.execute(
                "SELECT floor(extract(epoch FROM expires_at))::bigint, extract(epoch FROM expires_at - now()),"
                " extract(epoch FROM expires_at - created_at) FROM idempotency.lookup(%s, %s)", (who, key)
            ).fetchone()
        stored_epoch, left, ttl = int(row[0]), float(row[1]), float(row[2])
        value = values[0] if values else ""
        self.check("expiry: the value is an IMF-fixdate (RFC 9110)",
                   email.utils.formatdate(email.utils.parsedate_to_datetime(value).timestamp(), usegmt=True) == value
                   if value else False, f"{EXPIRES_HEADER}: {value!r}")
        self.check("expiry: it is the stored row's expires_at (to the second), in the future within the ttl",
                   value == email.utils.formatdate(stored_epoch, usegmt=True) and 0 < left <= ttl,
                   f"{EXPIRES_HEADER}: {value!r}, stored {email.utils.formatdate(stored_epoch, usegmt=True)!r},"
                   f" {left:.1f} s left of a ttl of {ttl:.0f} s")
        time.sleep(1.1)  # a recomputed now() + ttl would move by a second
        retry = self.post("/orders", ORDER_RESPELLED, who, key)
        self.expect("expiry: the retry replays", retry, 201, body=first.body, replay=True)
        self.check(f"expiry: the replay has one {EXPIRES_HEADER} with the first response's value",
                   retry.headers_named(EXPIRES_HEADER) == values, retry.describe())
        other = self.post("/orders", OTHER_ORDER, who, key)
        self.expect("expiry: another body is 422", other, status(self.reuse), body=self.reuse)
        self.check(f"expiry: the 422 tells the same {EXPIRES_HEADER}", other.headers_named(EXPIRES_HEADER) == values,
                   other.describe())
        with psycopg.connect(self.key_dsn(who), autocommit=True) as conn:
            stored = conn.execute("SELECT response_headers::text FROM idempotency.keys"
                                  " WHERE principal = %s AND key = %s", (who, key)).fetchone()
        self.check(f"expiry: {EXPIRES_HEADER} is not stored with the response",
                   stored is not None and EXPIRES_HEADER.lower() not in (stored[0] or "").lower(), repr(stored))
        self.effects("expiry: one key, three requests", "orders", who, 1)

    def stored_header_values(self) -> None:
        """Every RFC 9110 field value that the extension lets a service store
        (visible ASCII, SP, HTAB, U+0080..U+00FF) is replayed, and the service
        lives: a stored value is put into the key's row by hand, then a retry
        must answer the stored response with it. A client sends a character of
        U+0080..U+00FF as its Latin-1 octet (Node, WSGI, ASGI) or as UTF-8, the
        way its own server sent it the first time (Go, C++)."""
        who, key = self.principal("headers"), "key-headers"
        first = self.post("/orders", ORDER, who, key)
        self.expect("stored header values: the first request is 201", first, 201, replay=False)
        value = "a\tb c \u0080\u00e9\u00ff!"
        # The new value is computed here and written as a constant: Citus refuses
        # functions in a CASE or COALESCE of an UPDATE on a distributed table.
        with psycopg.connect(self.key_dsn(who), autocommit=True) as conn:
            row = conn.execute("SELECT response_headers::text FROM idempotency.keys WHERE principal = %s AND key = %s",
                               (who, key)).fetchone()
            stored = json.loads(row[0]) if row and row[0] else {}
            kept = stored + [["X-Kept", value]] if isinstance(stored, list) else {**stored, "X-Kept": value}
            changed = conn.execute("UPDATE idempotency.keys SET response_headers = %s::jsonb"
                                   " WHERE principal = %s AND key = %s", (json.dumps(kept), who, key)).rowcount
        self.check("stored header values: the row took the value", changed == 1, f"{changed} rows")
        retry = self.post("/orders", ORDER, who, key)
        self.expect("stored header values: the retry replays the stored response", retry, 201, body=first.body,
                    replay=True)
        got = retry.header("X-Kept")  # http.client reads header octets as Latin-1
        as_utf8 = None
        if got is not None:
            try:
                as_utf8 = got.encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                pass
        self.check("stored header values: replayed as Latin-1 octets or as UTF-8",
                   got is not None and value in (got, as_utf8), f"stored {value!r}, got {got!r}")
        after = self.post("/orders", ORDER, who, key)
        self.expect("stored header values: the service still answers", after, 201, body=first.body, replay=True)
        self.effects("stored header values: one key, three requests", "orders", who, 1)

    def reject_mode(self) -> None:
        who, key = self.principal("reject"), "key-reject"
        replies: Dict[str, Reply] = {}

        def first() -> None:
            replies["first"] = self.post("/reject/orders?delay_ms=1500", ORDER, who, key)

        thread = threading.Thread(target=first)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        busy = self.post("/reject/orders?delay_ms=1500", ORDER, who, key)
        took = time.monotonic() - started
        thread.join()
        self.expect("reject: the duplicate is 409 problem+json at once", busy, status(self.in_progress),
                    body=self.in_progress, content_type=PROBLEM_JSON, replay=False)
        self.check("reject: it did not wait for the first (well before the delay ends)", took < 0.7,
                   f"it took {took:.2f} s")
        retry_after = busy.header("Retry-After") or ""
        self.check("reject: the 409 has Retry-After in seconds", retry_after.isdigit() and int(retry_after) >= 1,
                   f"Retry-After {retry_after!r}")
        a = replies["first"]
        self.expect("reject: the first is 201", a, 201, replay=False)
        retry = self.post("/reject/orders", ORDER, who, key)
        self.expect("reject: a retry after the first finished replays", retry, 201, body=a.body, replay=True)
        self.effects("reject: two requests at once, then a retry", "orders", who, 1)

    def one_time_secret(self) -> None:
        who, key = self.principal("secret"), "key-secret"
        first = self.post("/api-keys", b'{"name":"ci"}', who, key)
        self.expect("creating an API key is 201", first, 201, replay=False, content_type="application/json")
        document = json.loads(first.body) if first.status == 201 else {}
        self.check("the response carries the secret", str(document.get("secret", "")).startswith("sk_"),
                   first.describe())
        retry = self.post("/api-keys", b'{"name":"ci"}', who, key)
        self.expect("a retry of a one-time-secret response is 409", retry, status(self.secret), body=self.secret,
                    replay=True,
                    content_type=PROBLEM_JSON)
        self.check("the secret is not in the retry", b"sk_" not in retry.body, retry.describe())
        with psycopg.connect(self.key_dsn(who), autocommit=True) as conn:
            row = conn.execute("SELECT response_status, one_time_secret FROM idempotency.lookup(%s, %s)",
                               (who, key)).fetchone()
        self.check("the key row keeps the status and the marker only", row == (201, True), repr(row))
        self.effects("one API key", "api_keys", who, 1)

    def run(self, only: Optional[List[str]], without: Optional[List[str]] = None) -> int:
        scenarios: List[Tuple[str, Callable[[], None]]] = [
            ("replay", self.first_request_and_replay),
            ("keys", self.missing_and_malformed_keys),
            ("concurrent", self.concurrent_requests),
            ("held", self.wait_runs_out),
            ("lease", self.lease_held),
            ("flaky", self.failure_is_not_stored),
            ("final4xx", self.final_error_is_stored),
            ("secret", self.one_time_secret),
            ("expiry", self.expiry_header),
            ("reject", self.reject_mode),
            ("headers", self.stored_header_values),
            ("stream", lambda: stream_scenario(self, problem)),
            ("expired", lambda: expired.scenario(self, problem, PROTOCOL)),  # tests/conformance/expired.py
            ("vectors", lambda: vectors.scenario(self, problem)),  # tests/conformance/vectors.json
        ]
        for name, scenario in scenarios:
            if only and name not in only:
                continue
            if without and name in without:
                print(f"# {name}: NOT RUN (--without: the service does not implement it)")
                continue
            print(f"# {name}")
            try:
                scenario()
            except Exception:  # a crashed scenario is a failure, never a skip
                self.check(f"{name}: scenario ran to the end", False, traceback.format_exc())
        print(f"{self.passed} passed, {self.failed} failed")
        return 0 if self.failed == 0 and self.passed > 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description="HTTP conformance suite for pg_idempotency example services")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dsn", required=True, help="libpq connection string of the service's database")
    parser.add_argument("--problem-base", default=PROTOCOL["problem_type_base"], help="prefix of problem type URIs")
    parser.add_argument("--only", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--without", action="append",
                        help="leave this scenario out, saying so (repeatable): for a service that does not"
                             " implement it yet; every example service runs them all")
    parser.add_argument("--shard-dsn", action="append", default=[],
                        help="DSN of one shard, in partition order (repeatable): count effects over all of them and"
                             " hold keys on the principal's owner, hashtext(principal) & (shards - 1);"
                             " --dsn is then the proxy's database")
    args = parser.parse_args()
    return Suite(args.base_url, args.dsn, args.problem_base, args.shard_dsn).run(args.only, args.without)


if __name__ == "__main__":
    sys.exit(main())
