"""The clients of a run: each draws random operations over a small key space
and records every call in the model; and the fault thread.

A client is a thread with one connection (autocommit off on the server side:
every transaction is opened with an explicit BEGIN and closed with COMMIT or
ROLLBACK, so the checker always knows whether COMMIT was in flight when a
connection broke). Clients ride out faults: a broken connection is reopened
(waiting for the server to come back), an in-doubt commit is recorded as
`unknown` and resolved later from the effect table when it can be.
"""

import datetime
import hashlib
import os
import random
import signal
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

from model import Op

PRINCIPALS = ["alice", "bob", "carol", "dave"]
ISOLATION = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
# SQLSTATEs any operation may answer: serialization failure and deadlock.
RETRYABLE = {"40001", "40P01"}
# Connection-level failures after a backend was killed or the server restarted.
CONNECTION_LOST = {"57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004"}


def fingerprint(number):
    """The 32-byte fingerprint of request variant `number`."""
    return hashlib.sha256(("model-request-%s" % number).encode()).digest()


def seconds(value):
    """A timedelta of `value` seconds."""
    return datetime.timedelta(seconds=value)


def epoch(value):
    """A server timestamp as epoch seconds (None stays None)."""
    return None if value is None else value.timestamp()


class ConnectionLost(Exception):
    """The connection broke (server crash, restart, killed backend)."""


class ServerError(Exception):
    """The server answered an error; `sqlstate` says which."""

    def __init__(self, sqlstate, message):
        super().__init__(message)
        self.sqlstate = sqlstate


class Settings:
    """What a run draws from: key space, timings, operation weights, faults."""

    def __init__(self, args):
        self.principals = PRINCIPALS[: args.principals]
        self.keys = ["k%d" % i for i in range(args.keys)]
        self.fingerprints = args.fingerprints
        self.ttl_ms = (args.ttl_min, args.ttl_max)
        self.lease_ms = (args.lease_min, args.lease_max)
        self.lease_within_ttl = args.lease_within_ttl
        self.max_ttl_ms = max(args.ttl_max, 6 * args.lease_max + 100) if args.lease_within_ttl else args.ttl_max
        self.weights = dict(args.ops)
        self.faults = set(args.faults)
        self.header_arrays = False  # set per run from the extension version (0.6.0 stores [name, value] pairs)
        self.fault_rate = args.fault_rate
        self.owners = {}  # principal -> owning shard (the function-call form through PL/Proxy)


class Client(threading.Thread):
    """One client: a connection, a random stream from (seed, number), a step budget."""

    def __init__(self, number, seed, settings, model, conninfo, stop, steps, deadline, stats):
        super().__init__(name="model-c%d" % number, daemon=True)
        self.number = number
        self.rng = random.Random("%s:client:%d" % (seed, number))
        self.settings = settings
        self.model = model
        self.conninfo = conninfo
        self.stop = stop
        self.steps_left = steps
        self.deadline = deadline
        self.stats = stats
        self.conn = None
        self.counter = 0
        self.steps = 0
        self.unresolved = []  # txn ops whose commit is unknown

    # -- connection ---------------------------------------------------------

    def connect(self):
        """Opens the connection, waiting (up to 90 s) while the server restarts."""
        give_up = time.time() + 90
        while not self.stop.is_set():
            try:
                self.conn = psycopg.connect(self.conninfo, autocommit=True, application_name=self.name,
                                            connect_timeout=5)
                self.conn.execute("SET idempotency.wait_timeout = '300ms'")
                self.conn.execute("SET statement_timeout = '20s'")
                self.resolve_unknown()
                return True
            except psycopg.Error:
                self.conn = None
                if time.time() > give_up:
                    raise
                time.sleep(0.2)
        return False

    def drop_connection(self):
        """Closes the connection (if any) and forgets it; the loop reconnects."""
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None

    def q(self, sql, params=None):
        """Runs one statement; returns its rows (or None). Raises ConnectionLost or ServerError."""
        try:
            cur = self.conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else None
        except psycopg.Error as error:
            state = getattr(error, "sqlstate", None)
            if self.conn is None or self.conn.broken or self.conn.closed or state in CONNECTION_LOST or (
                    state is None and isinstance(error, psycopg.OperationalError)):
                self.drop_connection()
                raise ConnectionLost(str(error)) from None
            raise ServerError(state, str(error).strip()) from None

    def rollback_quietly(self):
        """ROLLBACK, ignoring errors (the connection may be gone)."""
        if self.conn is None:
            return
        try:
            self.q("ROLLBACK")
        except (ConnectionLost, ServerError):
            pass

    def resolve_unknown(self):
        """In-doubt transactional commits: the effect row commits with the key row."""
        still = []
        for op in self.unresolved:
            rows = self.conn.execute("SELECT 1 FROM model_effects WHERE op_id = %s", (op.id,)).fetchall()
            with self.model.lock:
                op.commit = "yes" if rows else "no"
                op.commit_acked = time.time()
                op.note = (op.note + " in-doubt commit resolved").strip()
        self.unresolved = still

    # -- the loop -----------------------------------------------------------

    def run(self):
        """The client loop: draw an operation, run it, ride out a lost connection."""
        try:
            while not self.stop.is_set():
                if self.steps_left is not None and self.steps >= self.steps_left:
                    break
                if self.deadline is not None and time.time() >= self.deadline:
                    break
                if self.conn is None and not self.connect():
                    break
                kind = self.pick(self.settings.weights)
                try:
                    getattr(self, "op_" + kind)()
                except ConnectionLost:
                    self.drop_connection()
        except Exception as error:  # a bug in the checker itself: report, do not hang the run
            self.model.violation("ERR", None, "client %d crashed: %r" % (self.number, error))
            self.stop.set()
        finally:
            self.drop_connection()

    def pick(self, weights):
        """A name drawn from {name: weight}."""
        total = sum(weights.values())
        point = self.rng.uniform(0, total)
        for name, weight in weights.items():
            point -= weight
            if point <= 0:
                return name
        return next(iter(weights))

    def new_op(self, kind, principal=None, key=None, fp=None):
        """Counts a step and registers a new op, sent now."""
        self.counter += 1
        self.steps += 1
        with self.stats["lock"]:
            self.stats["steps"] += 1
        op = Op("c%d.%d" % (self.number, self.counter), self.number, kind, principal, key, fp)
        # Until its answer says otherwise, a call that can write a key row may have.
        op.writes = kind in ("acquire", "save_final", "claim")
        op.sent = time.time()
        self.model.add(op)
        return op

    def draw_key(self):
        """A (principal, key) from the small key space."""
        return self.rng.choice(self.settings.principals), self.rng.choice(self.settings.keys)

    def draw_ttl_lease(self):
        """A ttl and a lease in seconds."""
        lease = self.rng.randint(*self.settings.lease_ms)
        ttl = self.rng.randint(*self.settings.ttl_ms)
        if self.settings.lease_within_ttl:
            ttl = max(ttl, 6 * lease + 100)  # longer than any lease with its renewals
        return ttl / 1000.0, lease / 1000.0

    def response(self, op, statuses):
        """A status from `statuses` and a body and headers unique to `op`."""
        status = self.rng.choice(statuses)
        body = b"op=" + op.id.encode() + b";" + bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(0, 12)))
        number = str(self.rng.randint(0, 10 ** 6))
        shape = self.rng.random()
        if shape < 0.3:
            headers = None
        elif shape < 0.65 or not self.settings.header_arrays:
            headers = {"X-Op": op.id, "X-N": number}
        else:  # 0.6.0: [name, value] pairs, order and repeated names kept
            headers = [["X-Op", op.id], ["Set-Cookie", "a=" + number], ["Set-Cookie", "b=1"]]
        return status, headers, body

    def fault(self, name):
        """Whether to inject client fault `name` now."""
        return name in self.settings.faults and self.rng.random() < self.settings.fault_rate

    def count_fault(self):
        """Counts one injected fault."""
        with self.stats["lock"]:
            self.stats["faults"] += 1

    def unexpected(self, op, error):
        """Records an error the operation may not raise (ERR)."""
        op.outcome = "error " + str(error.sqlstate)
        self.model.violation("ERR", op.key_id(), "%s %s raised %s: %s" % (op.kind, op.id, error.sqlstate, error),
                             [op])

    def commit(self, op):
        """COMMIT; sets op.commit to yes, no (the server refused) or unknown (connection lost)."""
        op.commit_sent = time.time()
        try:
            self.q("COMMIT")
            op.commit_acked = time.time()
            op.commit = "yes"
        except ServerError as error:
            op.commit_acked = time.time()
            op.commit = "no"
            return error
        except ConnectionLost:
            op.commit = "unknown"
            raise
        return None

    # -- operations ---------------------------------------------------------

    def op_txn(self):
        """begin -> effect -> complete -> COMMIT, or one of the ways to fail."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1, 0.3])
        iso = self.rng.choice(ISOLATION)
        variant = self.pick({"complete": 70, "rollback": 8, "no_complete": 6, "stmt_error": 6, "secret": 5,
                             "timeout": 3 if "timeout" in self.settings.faults else 0,
                             "disconnect": 3 if "disconnect" in self.settings.faults else 0})
        op = self.new_op("txn", principal, key, fp)
        op.params = {"iso": iso.split()[0], "ttl": ttl, "wait": wait, "variant": variant}
        try:
            self.q("BEGIN ISOLATION LEVEL " + iso)
            rows = self.q(
                "SELECT o.outcome, o.response_status, o.response_headers, o.response_body, o.resource_id,"
                "       o.expires_at, o.fence, now(), clock_timestamp()"
                "  FROM idempotency.begin(%s, %s, %s, %s, ttl => %s, wait => %s) AS o",
                (principal, key, "t:" + op.id, fingerprint(fp), seconds(ttl), seconds(wait)))
        except ServerError as error:
            op.acked = time.time()
            op.commit = "no"
            op.outcome = "error " + error.sqlstate
            self.rollback_quietly()
            if error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
            return
        except ConnectionLost:
            op.acked = time.time()
            op.commit = "no"
            op.outcome = "lost"
            raise
        outcome, status, headers, body, resource_id, expires, fence, now, clock = rows[0]
        op.acked = time.time()
        op.outcome = outcome
        op.now, op.clock = epoch(now), epoch(clock)
        if outcome != "started":
            if outcome == "in_progress":
                try:
                    self.q("SELECT 1")  # I5: the transaction must still be usable
                except ServerError as error:
                    self.model.violation("I5", op.key_id(), "%s: after begin answered in_progress, SELECT 1 "
                                         "raised %s" % (op.id, error.sqlstate), [op])
                    self.rollback_quietly()
                    return
            elif outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(op, outcome, status, headers, body and bytes(body),
                                        resource_id, fence)
            self.commit(op)
            return
        op.fence, op.expires = fence, epoch(expires)
        op.holds_lock = True
        self.model.check_start(op)
        try:
            op.last_sent = time.time()
            self.q("INSERT INTO model_effects (principal, key, fence, client, op_id, kind)"
                   " VALUES (%s, %s, %s, %s, %s, 'txn')", (principal, key, fence, self.number, op.id))
            if variant in ("complete", "secret"):
                status, headers, body = self.response(op, [200, 201, 202, 204])
                secret = variant == "secret"
                op.writes = True
                op.secret = secret
                op.response = (status, None, None) if secret else (status, headers, body)
                op.last_sent = time.time()
                self.q("SELECT idempotency.complete(%s, %s, status => %s, body => %s, headers => %s,"
                       " resource_id => %s, one_time_secret => %s)",
                       (principal, key, status, body, Jsonb(headers) if headers is not None else None, op.id,
                        secret))
                error = self.commit(op)
                if error is not None and error.sqlstate not in RETRYABLE:
                    self.unexpected(op, error)
            elif variant == "rollback":
                op.last_sent = time.time()
                self.q("ROLLBACK")
                op.commit = "no"
            elif variant == "no_complete":
                error = self.commit(op)
                if error is None:
                    self.model.violation("I1", op.key_id(), "%s: COMMIT without complete() succeeded: an effect "
                                         "committed without its key" % op.id, [op])
                elif error.sqlstate not in {"55000"} | RETRYABLE:
                    self.unexpected(op, error)
            elif variant == "stmt_error":
                try:
                    op.last_sent = time.time()
                    self.q("SELECT 1 / 0")
                except ServerError:
                    pass
                self.q("ROLLBACK")
                op.commit = "no"
            elif variant == "timeout":
                self.count_fault()
                op.note = "statement_timeout fault"
                try:
                    self.q("SET LOCAL statement_timeout = '5ms'")
                    op.last_sent = time.time()
                    self.q("SELECT pg_sleep(0.2)")
                except ServerError:
                    pass
                self.q("ROLLBACK")
                op.commit = "no"
            elif variant == "disconnect":
                self.count_fault()
                op.note = "disconnect fault"
                op.commit = "no"
                op.last_sent = time.time()
                self.drop_connection()
        except ServerError as error:
            if op.commit is None:
                op.commit = "no"
            self.rollback_quietly()
            if error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
        except ConnectionLost:
            if op.commit is None:
                op.commit = "no"  # COMMIT was never sent: the server rolls it back
            elif op.commit == "unknown":
                self.unresolved.append(op)
            raise
        finally:
            # The lock goes with the transaction: at COMMIT/ROLLBACK, or at the first error.
            op.lock_until = op.commit_sent if op.commit_sent is not None else op.last_sent

    def short_txn(self, op, sql, params, iso=None):
        """One call in a transaction of its own; returns its row or None after an error."""
        try:
            self.q("BEGIN ISOLATION LEVEL " + (iso or self.rng.choice(ISOLATION)))
            rows = self.q(sql, params)
        except ServerError as error:
            op.acked = time.time()
            op.outcome = "error " + error.sqlstate
            op.commit = "no"
            self.rollback_quietly()
            if error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
            return None
        except ConnectionLost:
            op.acked = time.time()
            op.outcome = "lost"
            op.commit = "no"
            raise
        op.acked = time.time()
        return rows[0]

    def finish(self, op):
        """COMMIT of a short transaction; raises ConnectionLost (then op.commit is unknown)."""
        error = self.commit(op)
        if error is not None and error.sqlstate not in RETRYABLE:
            self.unexpected(op, error)

    def op_save_final(self):
        """save_final of a final 4xx (or a non-final 500, which must answer false)."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("save_final", principal, key, fp)
        status, headers, body = self.response(op, [404, 409, 422, 422, 500])
        op.params = {"ttl": ttl, "status": status}
        row = self.short_txn(op, "SELECT now(), idempotency.save_final(%s, %s, %s, %s, %s, %s, %s, %s),"
                                 " clock_timestamp()",
                             (principal, key, "s:" + op.id, fingerprint(fp), status, body,
                              Jsonb(headers) if headers is not None else None, seconds(ttl)))
        if row is None:
            op.writes = False
            return
        now, saved, clock = row
        op.outcome = saved
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(saved)
        if saved:
            op.response = (status, headers, body)
            op.expires = op.now + ttl
            self.model.check_start(op)
        self.finish(op)

    def op_claim(self):
        """claim with a short ttl."""
        principal, key = self.draw_key()
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("claim", principal, key, "claim")
        op.params = {"ttl": ttl}
        row = self.short_txn(op, "SELECT now(), idempotency.claim(%s, %s, %s), clock_timestamp()",
                             (principal, key, seconds(ttl)))
        if row is None:
            op.writes = False
            return
        now, claimed, clock = row
        op.outcome = claimed
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(claimed)
        if claimed:
            op.expires = op.now + ttl
            self.model.check_start(op)
        self.finish(op)

    def op_forget(self):
        """forget (the operator tool)."""
        principal, key = self.draw_key()
        op = self.new_op("forget", principal, key)
        row = self.short_txn(op, "SELECT idempotency.forget(%s, %s)", (principal, key), iso="READ COMMITTED")
        if row is None:
            return
        op.outcome = row[0]
        self.finish(op)

    def op_cleanup(self):
        """CALL idempotency.cleanup() (outside a transaction block)."""
        op = self.new_op("cleanup")
        try:
            rows = self.q("CALL idempotency.cleanup()")
            op.outcome = rows[0][0] if rows else None
        except ServerError as error:
            op.outcome = "error " + error.sqlstate
            if error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
        op.acked = time.time()

    def op_inspect(self):
        """Reads the key's row directly and checks it against the model."""
        principal, key = self.draw_key()
        op = self.new_op("inspect", principal, key)
        rows = self.q("SELECT k.action, k.fence, k.state, k.response_status, k.response_headers, k.response_body,"
                      "       now(), clock_timestamp()"
                      "  FROM (SELECT 1) AS one LEFT JOIN idempotency.keys AS k"
                      "    ON k.principal = %s AND k.key = %s", (principal, key))
        op.acked = time.time()
        action, fence, state, status, headers, body, now, clock = rows[0]
        op.now, op.clock = epoch(now), epoch(clock)
        if action is None:
            op.outcome = "absent"
            self.model.check_row(op, None)
            return
        op.outcome = "%s/%s/fence %s" % (action, state, fence)
        self.model.check_row(op, {"action": action, "fence": fence, "state": state, "status": status,
                                  "headers": headers, "body": body and bytes(body)})

    def op_wait(self):
        """A pause of 10-200 ms."""
        time.sleep(self.rng.uniform(0.01, 0.2))

    def op_lease(self):
        """acquire -> record the external effect -> renew(s) -> complete(fence), release or abandon."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, lease = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1])
        acq = self.new_op("acquire", principal, key, fp)
        acq.params = {"ttl": ttl, "lease": lease, "wait": wait}
        row = self.short_txn(acq, "SELECT o.outcome, o.response_status, o.response_headers, o.response_body,"
                                  "       o.resource_id, o.expires_at, o.fence, extract(epoch FROM o.lease_until)::float8, now(),"
                                  "       clock_timestamp()"
                                  "  FROM idempotency.acquire(%s, %s, %s, %s, lease => %s, ttl => %s,"
                                  "                           wait => %s) AS o",
                             (principal, key, "l:" + acq.id, fingerprint(fp), seconds(lease), seconds(ttl),
                              seconds(wait)))
        if row is None:
            acq.writes = False
            return
        outcome, status, headers, body, resource_id, expires, fence, lease_until, now, clock = row
        acq.outcome = outcome
        acq.now, acq.clock = epoch(now), epoch(clock)
        acq.writes = outcome == "started"
        if outcome != "started":
            if outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(acq, outcome, status, headers, body and bytes(body),
                                        resource_id, fence)
            elif outcome == "in_progress":
                try:
                    self.q("SELECT 1")  # I5: the transaction must still be usable
                except ServerError as error:
                    self.model.violation("I5", acq.key_id(), "%s: after acquire answered in_progress, SELECT 1 "
                                         "raised %s" % (acq.id, error.sqlstate), [acq])
                    self.rollback_quietly()
                    acq.commit = "no"
                    return
            self.finish(acq)
            return
        acq.fence, acq.expires, acq.lease_min = fence, epoch(expires), lease_until
        acq.holds_lock = True  # until its COMMIT (commit_sent)
        self.model.check_start(acq)
        self.finish(acq)
        if acq.commit != "yes":
            return
        # The external effect, recorded in a transaction of its own.
        effect = self.new_op("effect", principal, key, fp)
        effect.holder, effect.fence = acq, fence
        if self.short_txn(effect, "INSERT INTO model_effects (principal, key, fence, client, op_id, kind)"
                                  " VALUES (%s, %s, %s, %s, %s, 'lease') RETURNING 1",
                          (principal, key, fence, self.number, acq.id), iso="READ COMMITTED") is not None:
            self.finish(effect)
        for _ in range(self.rng.choice([0, 0, 1, 1, 2, 3])):
            # Work between renewals; sometimes a stall past the lease.
            time.sleep(lease * self.rng.choice([0.2, 0.3, 0.5, 0.8, 1.3]))
            renewal = self.new_op("renew", principal, key, fp)
            renewal.holder, renewal.fence = acq, fence
            renewal.params = {"lease_s": lease}
            with self.model.lock:
                acq.renewed_by.append(renewal)
            row = self.short_txn(renewal, "SELECT now(), idempotency.renew(%s, %s, %s, %s), clock_timestamp()",
                                 (principal, key, fence, seconds(lease)))
            if row is None:
                break
            now, renewed, clock = row
            renewal.outcome = renewed
            renewal.now, renewal.clock = epoch(now), epoch(clock)
            if renewed:
                self.model.check_fenced_success(renewal)
            self.finish(renewal)
            if not renewed:
                break
        time.sleep(lease * self.rng.choice([0.1, 0.3, 0.6, 1.2]))
        last = self.pick({"complete": 60, "release": 25, "abandon": 15})
        if last == "abandon":
            acq.note = "abandoned"
            return
        done = self.new_op(last, principal, key, fp)
        done.holder, done.fence = acq, fence
        with self.model.lock:
            (acq.completed_by if last == "complete" else acq.released_by).append(done)
        if last == "complete":
            secret = self.rng.random() < 0.1
            status, headers, body = self.response(done, [200, 201, 402, 404, 409, 500])
            done.secret = secret
            done.response = (status, None, None) if secret else (status, headers, body)
            done.params = {"status": status}
            row = self.short_txn(done, "SELECT idempotency.complete(%s, %s, status => %s, body => %s,"
                                       " headers => %s, resource_id => %s, one_time_secret => %s, fence => %s)",
                                 (principal, key, status, body, Jsonb(headers) if headers is not None else None,
                                  done.id, secret, fence))
        else:
            row = self.short_txn(done, "SELECT idempotency.release(%s, %s, %s)", (principal, key, fence))
        if row is None:
            return
        done.outcome = row[0]
        if done.outcome:
            self.model.check_fenced_success(done)
        if self.fault("disconnect"):
            self.count_fault()
            done.note = "disconnect fault before COMMIT"
            done.commit = "no"
            self.drop_connection()
            return
        self.finish(done)
        if last == "complete" and done.outcome is True and done.commit == "yes" and self.rng.random() < 0.15:
            self.complete_again(acq, principal, key, fp, fence)

    def complete_again(self, acq, principal, key, fp, fence):
        """I1: a lease generation completes at most once; a second complete with
        the same fence must answer false and change nothing."""
        again = self.new_op("complete", principal, key, fp)
        again.holder, again.fence = acq, fence
        status, headers, body = self.response(again, [200, 201])
        again.response = (status, headers, body)
        again.note = "second complete of one generation"
        row = self.short_txn(again, "SELECT idempotency.complete(%s, %s, status => %s, body => %s,"
                                    " headers => %s, resource_id => %s, fence => %s)",
                             (principal, key, status, body, Jsonb(headers) if headers is not None else None,
                              again.id, fence))
        if row is None:
            return
        again.outcome = row[0]
        if again.outcome:
            self.model.violation("I1", again.key_id(), "%s: a second complete(fence %s) of %s answered true: "
                                 "a lease generation completed twice" % (again.id, fence, acq.id), [acq, again],
                                 "lease generation completed twice")
            with self.model.lock:
                acq.completed_by.append(again)
        self.finish(again)


class Faults(threading.Thread):
    """Server faults at random moments: SIGKILL of a client backend (crash
    recovery of the whole cluster) and an immediate restart."""

    def __init__(self, seed, cluster, admin_conninfo, dbname, kinds, mean_interval, stop, stats, log, model):
        super().__init__(name="model-faults", daemon=True)
        self.rng = random.Random("%s:faults" % seed)
        self.cluster = cluster
        self.admin_conninfo = admin_conninfo
        self.dbname = dbname
        self.kinds = [k for k in ("kill", "restart") if k in kinds]
        self.mean = mean_interval
        self.stop = stop
        self.stats = stats
        self.log = log
        self.model = model

    def note(self):
        """Records that a server fault starts now (it lets every key lock go)."""
        with self.model.lock:
            self.model.fault_times.append(time.time())

    def run(self):
        """Injects a fault at random moments until stopped."""
        if not self.kinds:
            return
        while not self.stop.wait(self.rng.uniform(0.3 * self.mean, 1.7 * self.mean)):
            kind = self.rng.choice(self.kinds * 3 if len(self.kinds) == 1 else ["kill", "kill", "kill", "restart"])
            try:
                if kind == "kill" and self.kill_backend():
                    self.count()
                elif kind == "restart":
                    self.note()
                    self.cluster.restart()
                    self.count()
                    self.log("fault: immediate restart")
            except Exception as error:  # keep injecting; the clients notice what happened
                self.log("fault %s failed: %s" % (kind, error))

    def count(self):
        """Counts one injected fault."""
        with self.stats["lock"]:
            self.stats["faults"] += 1

    def kill_backend(self):
        """SIGKILL of a random client backend of this run; false when there was none."""
        with psycopg.connect(self.admin_conninfo, autocommit=True, connect_timeout=5) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'model-c%%'",
                (self.dbname,)).fetchall()]
        if not pids:
            return False
        pid = self.rng.choice(sorted(pids))
        self.note()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.log("fault: SIGKILL backend %d" % pid)
        return True
