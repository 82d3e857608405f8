"""The direct form's transport: SQL statements on one connection per client.

Autocommit is off on the server side: every transaction is opened with an
explicit BEGIN and closed with COMMIT or ROLLBACK, so the checker always knows
whether COMMIT was in flight when a connection broke. `send` leaves the
transaction open (the client checks the answer first), `settle` commits it.
With the role dimension the connection is made as the client's role, by the
path roles.py drew for it, and the protocol may be reached through SECURITY
DEFINER wrappers (schema model_definer) instead of the extension's schema.
"""

import time

import psycopg
from psycopg.types.json import Jsonb

import roles
from workload import CONNECTION_LOST, ConnectionLost, ServerError, fingerprint, seconds

KEY_ROW = ("SELECT k.action, k.fence, k.state, k.response_status, k.response_headers, k.response_body,"
           "       now(), clock_timestamp()"
           "  FROM (SELECT 1) AS one LEFT JOIN idempotency.keys AS k"
           "    ON k.principal = %s AND k.key = %s")


def jsonb(headers):
    """Headers as a jsonb parameter (None stays NULL)."""
    return Jsonb(headers) if headers is not None else None


def row_dict(action, fence, state, status, headers, body):
    """A key row as the model reads it (None when absent)."""
    if action is None:
        return None
    return {"action": action, "fence": fence, "state": state, "status": status, "headers": headers,
            "body": body and bytes(body)}


class DirectTransport:
    """Sends a client's calls as SQL statements on its one connection."""

    isolation = True  # each transaction runs at the isolation level the client drew

    def __init__(self, client, conninfo):
        self.client = client
        self.conninfo = conninfo
        self.conn = None
        self.unresolved = []  # txn ops whose commit is unknown
        self.schema = "idempotency"  # where the protocol functions are called (model_definer: roles.py)
        self.first_statements = []  # run after the BEGIN of the connection's first transaction (roles.py)

    # -- connection ---------------------------------------------------------

    def connected(self):
        """Whether a connection is open."""
        return self.conn is not None

    def connect(self):
        """Opens the connection (as the client's role, by its path, with roles),
        waiting (up to 90 s) while the server restarts."""
        give_up = time.time() + 90
        while not self.client.stop.is_set():
            try:
                self.conn = roles.connect(self, self.client)
                self.conn.execute("SET idempotency.wait_timeout = '300ms'")
                self.conn.execute("SET statement_timeout = '20s'")
                self.resolve_unknown()
                return True
            except roles.Refused:
                self.drop()  # a refusal the role dimension allows: draw another path
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
        """Runs one statement; returns its rows (or None). Raises ConnectionLost or ServerError."""
        if self.conn is None:
            raise ConnectionLost("no connection")
        try:
            cur = self.conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else None
        except psycopg.Error as error:
            state = getattr(error, "sqlstate", None)
            if self.conn is None or self.conn.broken or self.conn.closed or state in CONNECTION_LOST or (
                    state is None and isinstance(error, psycopg.OperationalError)):
                self.drop()
                raise ConnectionLost(str(error)) from None
            raise ServerError(state, str(error).strip()) from None

    def fn(self, name):
        """A protocol function's qualified name (the SECURITY DEFINER wrappers on that path)."""
        return "%s.%s" % (self.schema, name)

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
        for op in self.unresolved:
            rows = self.conn.execute("SELECT 1 FROM model_effects WHERE op_id = %s", (op.id,)).fetchall()
            with self.client.model.lock:
                op.commit = "yes" if rows else "no"
                op.commit_acked = time.time()
                op.note = (op.note + " in-doubt commit resolved").strip()
        self.unresolved = []

    def begin_transaction(self, iso):
        """BEGIN, then what the path runs first in the connection's first transaction."""
        self.q("BEGIN ISOLATION LEVEL " + iso)
        statements, self.first_statements = self.first_statements, []
        for sql in statements:
            roles.guarded(self, sql)

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

    # -- the two steps of every call ----------------------------------------

    def refuse_policy(self, op, action):
        """With --refuse: the op's action refuses its expired key (in the op's own
        transaction, so the policy commits with the key row)."""
        if op.refuse_grace is not None:
            self.q("SELECT idempotency.set_expiry_policy(%s, 'refuse', %s)", (action, seconds(op.refuse_grace)))

    def short(self, op, sql, params, iso, action=None):
        """One call in a transaction of its own, left open; its first row. With
        `action`, the op's expiry policy is set first (refuse_policy)."""
        try:
            self.begin_transaction(iso)
            if action is not None:
                self.refuse_policy(op, action)
            rows = self.q(sql, params)
        except ServerError as error:
            op.acked = time.time()
            op.outcome = "error " + error.sqlstate
            op.commit = "no"
            self.rollback_quietly()
            raise
        except ConnectionLost:
            op.acked = time.time()
            op.outcome = "lost"
            op.commit = "no"
            raise
        op.acked = time.time()
        return rows[0]

    def settle(self, op):
        """COMMIT of the open transaction; its error, or None. Raises ConnectionLost."""
        return self.commit(op)

    def still_usable(self, op, row):
        """I5: SELECT 1 after in_progress; None, or its SQLSTATE (then rolled back)."""
        try:
            self.q("SELECT 1")
            return None
        except ServerError as error:
            self.rollback_quietly()
            op.commit = "no"
            return error.sqlstate

    def abandon(self, op):
        """The client goes away before COMMIT (a disconnect fault): the server rolls back."""
        op.commit = "no"
        self.drop()
        return True

    # -- the transactional request --------------------------------------------

    def txn_begin(self, op, plan):
        """BEGIN and begin(); the transaction stays open. Its answer row."""
        try:
            self.begin_transaction(plan.iso)
            self.refuse_policy(op, "t:" + op.id)
            rows = self.q(
                "SELECT o.outcome, o.response_status, o.response_headers, o.response_body, o.resource_id,"
                "       o.expires_at, o.fence, now(), clock_timestamp()"
                "  FROM %s(%%s, %%s, %%s, %%s, ttl => %%s, wait => %%s) AS o" % self.fn("begin"),
                (plan.principal, plan.key, "t:" + op.id, fingerprint(plan.fp), seconds(plan.ttl),
                 seconds(plan.wait)))
        except ServerError as error:
            op.acked = time.time()
            op.commit = "no"
            op.outcome = "error " + error.sqlstate
            self.rollback_quietly()
            raise
        except ConnectionLost:
            op.acked = time.time()
            op.commit = "no"
            op.outcome = "lost"
            raise
        op.acked = time.time()
        return rows[0]

    def txn_end(self, op, plan):
        """After begin answered started: the effect row, then the variant's end
        (complete and COMMIT, ROLLBACK, COMMIT without complete, a statement
        error, a statement_timeout cancel, a disconnect). Returns the error the
        client must judge, or None; raises ConnectionLost."""
        op.holds_lock = True
        error = None
        try:
            op.last_sent = time.time()
            self.q("INSERT INTO model_effects (principal, key, fence, client, op_id, kind)"
                   " VALUES (%s, %s, %s, %s, %s, 'txn')", (plan.principal, plan.key, op.fence, self.client.number,
                                                           op.id))
            error = self.txn_variant(op, plan)
        except ServerError as failure:
            if op.commit is None:
                op.commit = "no"
            self.rollback_quietly()
            error = failure
        except ConnectionLost:
            if op.commit is None:
                op.commit = "no"  # COMMIT was never sent: the server rolls it back
            elif op.commit == "unknown":
                self.unresolved.append(op)
            raise
        finally:
            # The lock goes with the transaction: at COMMIT/ROLLBACK, or at the first error.
            op.lock_until = op.commit_sent if op.commit_sent is not None else op.last_sent
        return error

    def txn_variant(self, op, plan):
        """The end of a started transactional request, by variant."""
        variant = plan.variant
        if variant in ("complete", "secret"):
            op.writes = True
            op.last_sent = time.time()
            self.q("SELECT %s(%%s, %%s, status => %%s, body => %%s, headers => %%s, resource_id => %%s,"
                   " one_time_secret => %%s)" % self.fn("complete"),
                   (plan.principal, plan.key, plan.status, plan.body, jsonb(plan.headers), op.id,
                    variant == "secret"))
            return self.commit(op)
        if variant == "no_complete":
            return self.commit(op)
        if variant in ("stmt_error", "timeout"):
            if variant == "timeout":
                self.client.count_fault()
                op.note = "statement_timeout fault"
            try:
                if variant == "timeout":
                    self.q("SET LOCAL statement_timeout = '5ms'")
                op.last_sent = time.time()
                self.q("SELECT pg_sleep(0.2)" if variant == "timeout" else "SELECT 1 / 0")
            except ServerError:
                pass
        if variant == "disconnect":
            self.client.count_fault()
            op.note = "disconnect fault"
            op.commit = "no"
            op.last_sent = time.time()
            self.drop()
            return None
        if variant == "rollback":
            op.last_sent = time.time()
        self.q("ROLLBACK")
        op.commit = "no"
        return None

    # -- the other calls ------------------------------------------------------

    def acquire(self, op, principal, key, fp, lease, ttl, wait, iso):
        """acquire(); the transaction stays open."""
        return self.short(op, "SELECT o.outcome, o.response_status, o.response_headers, o.response_body,"
                              "       o.resource_id, o.expires_at, o.fence,"
                              "       extract(epoch FROM o.lease_until)::float8, now(), clock_timestamp()"
                              "  FROM %s(%%s, %%s, %%s, %%s, lease => %%s, ttl => %%s, wait => %%s) AS o"
                          % self.fn("acquire"),
                          (principal, key, "l:" + op.id, fingerprint(fp), seconds(lease), seconds(ttl),
                           seconds(wait)), iso, action="l:" + op.id)

    def lease_effect(self, op, principal, key, fence, holder_id):
        """The external effect of a lease holder: a row in model_effects."""
        return self.short(op, "INSERT INTO model_effects (principal, key, fence, client, op_id, kind)"
                              " VALUES (%s, %s, %s, %s, %s, 'lease') RETURNING 1",
                          (principal, key, fence, self.client.number, holder_id), "READ COMMITTED")

    def renew(self, op, principal, key, fence, lease, iso):
        """renew(): (now, renewed, clock)."""
        return self.short(op, "SELECT now(), %s(%%s, %%s, %%s, %%s), clock_timestamp()" % self.fn("renew"),
                          (principal, key, fence, seconds(lease)), iso)

    def complete_fenced(self, op, principal, key, fence, status, headers, body, secret, iso):
        """complete(fence => ...): (completed,)."""
        return self.short(op, "SELECT %s(%%s, %%s, status => %%s, body => %%s, headers => %%s,"
                              " resource_id => %%s, one_time_secret => %%s, fence => %%s)" % self.fn("complete"),
                          (principal, key, status, body, jsonb(headers), op.id, secret, fence), iso)

    def release(self, op, principal, key, fence, iso):
        """release(): (released,)."""
        return self.short(op, "SELECT %s(%%s, %%s, %%s)" % self.fn("release"), (principal, key, fence), iso)

    def save_final(self, op, principal, key, fp, status, headers, body, ttl, iso):
        """save_final(): (now, saved, clock)."""
        return self.short(op, "SELECT now(), %s(%%s, %%s, %%s, %%s, %%s, %%s, %%s, %%s), clock_timestamp()"
                          % self.fn("save_final"),
                          (principal, key, "s:" + op.id, fingerprint(fp), status, body, jsonb(headers),
                           seconds(ttl)), iso, action="s:" + op.id)

    def claim(self, op, principal, key, ttl, iso):
        """claim(): (now, claimed, clock)."""
        return self.short(op, "SELECT now(), %s(%%s, %%s, %%s), clock_timestamp()" % self.fn("claim"),
                          (principal, key, seconds(ttl)), iso)

    def forget(self, op, principal, key):
        """forget(): (deleted,)."""
        return self.short(op, "SELECT %s(%%s, %%s)" % self.fn("forget"), (principal, key), "READ COMMITTED")

    def lookup(self, op, principal, key, iso):
        """lookup(): (state, fence) of the key, or (None, None)."""
        return self.short(op, "SELECT l.state, l.fence FROM (SELECT 1) AS one LEFT JOIN %s(%%s, %%s) AS l ON true"
                          % self.fn("lookup"), (principal, key), iso)

    def cleanup(self, op):
        """CALL idempotency.cleanup() (outside a transaction block): (deleted,)."""
        try:
            rows = self.q("CALL idempotency.cleanup()")
        finally:
            op.acked = time.time()
        return (rows[0][0] if rows else None,)

    def inspect(self, op, principal, key):
        """The key's row, read directly (with roles: through a SECURITY DEFINER
        reader, the roles may not read the table): [(None, row, now, clock)]."""
        sql = roles.key_row_sql(self) or KEY_ROW
        rows = self.q(sql, (principal, key))
        op.acked = time.time()
        action, fence, state, status, headers, body, now, clock = rows[0]
        return [(None, row_dict(action, fence, state, status, headers, body), now, clock)]
