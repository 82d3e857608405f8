"""The function-call form's transport: every call is ONE function call on the
PL/Proxy cluster (tests/model/proxy_functions.sql), routed to the shard that
owns the principal, where it is one transaction, committed when it answers.

What a call does is decided by the client (workload.py); this file only turns
it into the proxy function's arguments and the answer back into the rows the
client reads. A call whose answer is lost (the proxy's link to the shard
broke, a cancel) is in doubt: RemoteLost, op.commit unknown.
"""

import datetime
import time

import psycopg
from psycopg.types.json import Jsonb

from workload import CONNECTION_LOST, ConnectionLost, RemoteLost, ServerError, fingerprint, seconds


def jsonb(headers):
    """Headers as a jsonb parameter (None stays NULL)."""
    return Jsonb(headers) if headers is not None else None


def timestamp(value):
    """Epoch seconds (text, from an error's DETAIL) as a timestamp."""
    return datetime.datetime.fromtimestamp(float(value), tz=datetime.timezone.utc)


class ProxyTransport:
    """Sends a client's calls as proxy function calls on its one connection."""

    isolation = False  # PL/Proxy runs each call in autocommit on the shard (READ COMMITTED)

    def __init__(self, client, conninfo):
        self.client = client
        self.conninfo = conninfo
        self.conn = None

    # -- connection ---------------------------------------------------------

    def connected(self):
        """Whether a connection is open."""
        return self.conn is not None

    def connect(self):
        """Opens the connection to the proxy, waiting (up to 90 s) while it restarts.
        In-doubt calls are settled at the end of the run only: a shard may still
        be running (and then commit) a call whose answer was lost."""
        give_up = time.time() + 90
        while not self.client.stop.is_set():
            try:
                self.conn = psycopg.connect(self.conninfo, autocommit=True, application_name=self.client.name,
                                            connect_timeout=5)
                self.conn.execute("SET idempotency.wait_timeout = '300ms'")
                self.conn.execute("SET statement_timeout = '20s'")
                return True
            except psycopg.Error:
                self.conn = None
                if time.time() > give_up:
                    raise
                time.sleep(0.2)
        return False

    def drop(self):
        """Closes the connection (if any) and forgets it; the loop reconnects."""
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None

    def q(self, sql, params=None):
        """Runs one statement on the proxy; raises ConnectionLost (proxy
        connection gone), RemoteLost (the shard's) or ServerError (with .detail,
        the remote DETAIL without PL/Proxy's prefix)."""
        if self.conn is None:
            raise ConnectionLost("no connection")
        try:
            cur = self.conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else None
        except psycopg.Error as error:
            state = getattr(error, "sqlstate", None)
            text = str(error)
            if self.conn is None or self.conn.broken or self.conn.closed or (
                    state is None and isinstance(error, psycopg.OperationalError)):
                self.drop()
                raise ConnectionLost(text) from None
            remote = "REMOTE ERROR" in text
            if ("PL/Proxy function" in text and not remote) or (remote and state in CONNECTION_LOST):
                raise RemoteLost(text) from None
            if state in CONNECTION_LOST:
                self.drop()
                raise ConnectionLost(text) from None
            failure = ServerError(state, text.strip())
            detail = error.diag.message_detail or ""
            failure.detail = detail[len("Remote detail: "):] if detail.startswith("Remote detail: ") else detail
            raise failure from None

    def call(self, op, sql, params, short=True, writes=None):
        """One function call = one transaction on a shard. Returns its rows, or
        raises: ServerError (op.commit no), RemoteLost or ConnectionLost
        (op.commit unknown). A cancel (57014) may come after the shard
        committed: unknown too, and RemoteLost for a `short` call (the
        transactional request's timeout fault asks for it: ServerError there).
        `writes(rows)` says whether the answer wrote a key row: op.writes is set
        from it together with the commit, under the model's lock, so that no
        check sees a committed writer that the answer says wrote nothing."""
        op.commit_sent = op.sent  # the shard may commit at any moment of the call
        try:
            rows = self.q(sql, params)
        except ServerError as error:
            op.acked = op.commit_acked = time.time()
            if error.sqlstate != "57014":
                op.commit, op.outcome = "no", "error " + error.sqlstate
                raise
            op.commit, op.outcome = "unknown", "cancelled"
            if short:
                raise RemoteLost(str(error)) from None
            raise
        except RemoteLost:
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "shard lost"
            raise
        except ConnectionLost:
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "lost"
            raise
        with self.client.model.lock:
            if writes is not None:
                op.writes = bool(writes(rows))
            op.acked = op.commit_acked = time.time()
            op.commit = "yes"
        return rows

    def one(self, op, sql, params, writes=None):
        """call() of a short operation: its one row."""
        return self.call(op, sql, params, writes=writes)[0]

    # -- the two steps: the call did both --------------------------------------

    def settle(self, op):
        """Nothing: the call committed when it answered."""
        return None

    def still_usable(self, op, row):
        """I5, checked on the shard: the SQLSTATE of SELECT 1 after in_progress, or None."""
        return row[-1]

    def abandon(self, op):
        """No disconnect between the answer and its commit: the call has committed."""
        return False

    # -- the transactional request --------------------------------------------

    def txn_begin(self, op, plan):
        """model.txn: begin -> effect -> complete in one call, or one of the ways
        to fail. Returns the answer row; for the rollback and stmt_error
        variants it comes from the raised error's DETAIL."""
        variant = plan.variant
        if variant in ("complete", "secret", "timeout", "disconnect"):
            op.writes = True  # until the answer says otherwise
        sql = ("SELECT outcome, status, headers, body, resource_id, expires_at, fence, now_at, clock_at, usable"
               "  FROM model.txn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
        params = (plan.principal, plan.key, "t:" + op.id, fingerprint(plan.fp), seconds(plan.ttl),
                  seconds(plan.wait), "slow" if plan.pause else variant, plan.status, plan.body, jsonb(plan.headers),
                  self.client.number, op.id, plan.pause)
        if variant == "disconnect":
            self.client.count_fault()
            op.note = "disconnect fault during the call"
            text = psycopg.ClientCursor(self.conn).mogrify(sql, params)
            op.commit_sent = op.sent
            self.conn.pgconn.send_query(text.encode())
            time.sleep(plan.cut * 2 * plan.pause)
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "disconnected"
            self.drop()
            return None
        if variant == "timeout":
            op.note = "statement_timeout %d ms fault" % plan.timeout_ms
            self.q("SET statement_timeout = %d" % plan.timeout_ms)
        try:
            return self.call(op, sql, params, short=False,
                             writes=lambda rows: op.writes and rows[0][0] == "started")[0]
        except ServerError as error:
            if error.sqlstate in ("MR001", "22012") and variant in ("rollback", "stmt_error"):
                fence, expires, now, clock = error.detail.split()
                op.note = "rolled back (%s)" % error.sqlstate
                return ("started", None, None, None, None, timestamp(expires), int(fence), timestamp(now),
                        timestamp(clock), None)
            if error.sqlstate == "55000" and variant == "no_complete":
                op.note = "started, no complete: the commit failed"
            elif error.sqlstate == "57014" and variant == "timeout":
                self.client.count_fault()  # cancelled: in doubt, settled at the end from the effect table
            raise
        finally:
            if plan.timeout_ms is not None and self.conn is not None:
                try:
                    self.q("SET statement_timeout = '20s'")
                except (ServerError, RemoteLost):
                    pass

    def txn_end(self, op, plan):
        """Nothing left: the call ran the whole request."""
        return None

    # -- the other calls ------------------------------------------------------

    def acquire(self, op, principal, key, fp, lease, ttl, wait, iso):
        """model.acquire."""
        return self.one(op, "SELECT outcome, status, headers, body, resource_id, expires_at, fence, lease_until,"
                            "       now_at, clock_at, usable"
                            "  FROM model.acquire(%s, %s, %s, %s, %s, %s, %s)",
                        (principal, key, "l:" + op.id, fingerprint(fp), seconds(lease), seconds(ttl),
                         seconds(wait)), writes=lambda rows: rows[0][0] == "started")

    def lease_effect(self, op, principal, key, fence, holder_id):
        """model.lease_effect: the external effect of a lease holder."""
        return self.one(op, "SELECT model.lease_effect(%s, %s, %s, %s, %s)",
                        (principal, key, fence, self.client.number, holder_id))

    def renew(self, op, principal, key, fence, lease, iso):
        """model.renew: (now, renewed, clock)."""
        return self.one(op, "SELECT now_at, renewed, clock_at FROM model.renew(%s, %s, %s, %s)",
                        (principal, key, fence, seconds(lease)))

    def complete_fenced(self, op, principal, key, fence, status, headers, body, secret, iso):
        """model.complete_fenced: (completed,)."""
        return self.one(op, "SELECT model.complete_fenced(%s, %s, %s, %s, %s, %s, %s, %s)",
                        (principal, key, fence, status, body, jsonb(headers), op.id, secret))

    def release(self, op, principal, key, fence, iso):
        """model.release: (released,)."""
        return self.one(op, "SELECT model.release(%s, %s, %s)", (principal, key, fence))

    def save_final(self, op, principal, key, fp, status, headers, body, ttl, iso):
        """model.save_final: (now, saved, clock)."""
        return self.one(op, "SELECT now_at, saved, clock_at FROM model.save_final(%s, %s, %s, %s, %s, %s, %s, %s)",
                        (principal, key, "s:" + op.id, fingerprint(fp), status, body, jsonb(headers),
                         seconds(ttl)), writes=lambda rows: rows[0][1])

    def claim(self, op, principal, key, ttl, iso):
        """model.claim: (now, claimed, clock)."""
        return self.one(op, "SELECT now_at, claimed, clock_at FROM model.claim(%s, %s, %s)",
                        (principal, key, seconds(ttl)), writes=lambda rows: rows[0][1])

    def forget(self, op, principal, key):
        """model.forget: (deleted,)."""
        return self.one(op, "SELECT model.forget(%s, %s)", (principal, key))

    def cleanup(self, op):
        """model.cleanup(): one cleanup batch on every shard (RUN ON ALL): (deleted,)."""
        return self.one(op, "SELECT sum(c)::int FROM model.cleanup() AS c", None)

    def inspect(self, op, principal, key):
        """model.inspect on every shard: [(shard, row, now, clock)]."""
        found = []
        for shard, action, fence, state, status, headers, body, now, clock in self.call(
                op, "SELECT shard, action, fence, state, status, headers, body, now_at, clock_at"
                    "  FROM model.inspect(%s, %s)", (principal, key)):
            row = None if action is None else {"action": action, "fence": fence, "state": state,
                                               "status": status, "headers": headers, "body": body and bytes(body)}
            found.append((shard, row, now, clock))
        return found
