"""The workload of a run: clients that decide what to do and what to check.

A client is a thread that draws random operations over a small key space from
its own random stream, records every call in the model and checks every
answer against it. How a call reaches the server is its transport's business
(direct.py: SQL statements on one connection; proxy.py: one PL/Proxy function
call per operation): the transport only sends what the client decided and
stamps on the op when things were sent, answered and committed. Operations
follow the same two steps in both forms: `send` (the call; for the direct form
the open transaction) and `settle` (its COMMIT; nothing for a function call,
which committed when it answered), with the checks in between.

Clients ride out faults: a broken connection is reopened (waiting for the
server to come back); an in-doubt commit is recorded as `unknown` and settled
later, when it can be, from the effect table.
"""

import random
import threading
import time

from lease_ops import LeaseOps
from model import Op
import roles
from values import epoch, fingerprint, seconds  # noqa: F401 (the transports import them from here)

PRINCIPALS = ["alice", "bob", "carol", "dave"]
ISOLATION = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
# SQLSTATEs any operation may answer: serialization failure and deadlock.
RETRYABLE = {"40001", "40P01"}
# Connection-level failures after a backend was killed or the server restarted.
CONNECTION_LOST = {"57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004"}
TXN_VARIANTS = {"complete": 70, "rollback": 8, "no_complete": 6, "stmt_error": 6, "secret": 5}


class ConnectionLost(Exception):
    """The connection broke (server crash, restart, killed backend)."""


class RemoteLost(Exception):
    """The call's outcome is unknown but the client's connection is fine (the
    function-call form: PL/Proxy lost its shard, or a cancel came back)."""


class ServerError(Exception):
    """The server answered an error; `sqlstate` says which."""

    def __init__(self, sqlstate, message):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.detail = ""


class Settings:
    """What a run draws from: key space, timings, operation weights, faults, roles."""

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
        self.roles = getattr(args, "roles", False)  # the role dimension (roles.py)
        self.hostile = getattr(args, "hostile", 0.25)  # share of calls naming another role's principal
        # --refuse: the share of requests whose action refuses its expired key
        # (set_expiry_policy in the request's own transaction), and the grace
        # range in ms; claims (action 'claim') refuse for claim_grace_ms.
        self.refuse = getattr(args, "refuse", 0.0)
        self.grace_ms = (getattr(args, "grace_min", 300), getattr(args, "grace_max", 1500))
        self.claim_grace_ms = self.grace_ms[1]
        if self.roles:
            self.weights.setdefault("steal", roles.STEAL_WEIGHT)


class TxnPlan:
    """What a transactional request does: drawn by the client, sent by the transport."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Client(LeaseOps, threading.Thread):
    """One client: a transport, a random stream from (seed, number), a step budget."""

    def __init__(self, number, seed, settings, model, transport_class, conninfo, stop, steps, deadline, stats):
        super().__init__(name="model-c%d" % number, daemon=True)
        self.number = number
        self.rng = random.Random("%s:client:%d" % (seed, number))
        self.settings = settings
        self.model = model
        self.stop = stop
        self.steps_left = steps
        self.deadline = deadline
        self.stats = stats
        self.counter = 0
        self.steps = 0
        self.role = roles.role_of(settings, number)  # None without the role dimension
        self.path = None  # how the binding reached this connection (roles.py), drawn per connection
        self.transport = transport_class(self, conninfo)

    # -- the loop -----------------------------------------------------------

    def run(self):
        """The client loop: draw an operation, run it, ride out a lost connection."""
        try:
            while not self.stop.is_set():
                if self.steps_left is not None and self.steps >= self.steps_left:
                    break
                if self.deadline is not None and time.time() >= self.deadline:
                    break
                if not self.transport.connected() and not self.transport.connect():
                    break
                kind = self.pick(self.settings.weights)
                try:
                    getattr(self, "op_" + kind)()
                except ConnectionLost:
                    self.transport.drop()
        except Exception as error:  # a bug in the checker itself: report, do not hang the run
            self.model.violation("ERR", None, "client %d crashed: %r" % (self.number, error))
            self.stop.set()
        finally:
            self.transport.drop()

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
        op.role, op.path = self.role, self.path
        op.sent = time.time()
        self.model.add(op)
        return op

    def draw_key(self):
        """A (principal, key) from the small key space; with roles, mostly the
        client's own principal, sometimes another role's (a hostile call)."""
        if self.role is not None:
            others = [p for p in self.settings.principals if p != self.role]
            hostile = others and self.rng.random() < self.settings.hostile
            return (self.rng.choice(others) if hostile else self.role), self.rng.choice(self.settings.keys)
        return self.rng.choice(self.settings.principals), self.rng.choice(self.settings.keys)

    def draw_ttl_lease(self):
        """A ttl and a lease in seconds."""
        lease = self.rng.randint(*self.settings.lease_ms)
        ttl = self.rng.randint(*self.settings.ttl_ms)
        if self.settings.lease_within_ttl:
            ttl = max(ttl, 6 * lease + 100)  # longer than any lease with its renewals
        return ttl / 1000.0, lease / 1000.0

    def draw_refuse(self, op):
        """With --refuse: whether `op`'s action refuses its key after expiry, and
        for how long (op.refuse_grace, seconds). Draws nothing without it, so a
        seed runs as it did before."""
        if self.settings.refuse and self.rng.random() < self.settings.refuse:
            op.refuse_grace = self.rng.randint(*self.settings.grace_ms) / 1000.0
            op.params["grace"] = op.refuse_grace

    def draw_isolation(self):
        """An isolation level (the function-call form has none to choose: it ignores it)."""
        return self.rng.choice(ISOLATION)

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

    # -- what an answer may be ----------------------------------------------

    def unexpected(self, op, error):
        """Records an error the operation may not raise (ERR)."""
        op.outcome = "error " + str(error.sqlstate)
        self.model.violation("ERR", op.key_id(), "%s %s raised %s: %s" % (op.kind, op.id, error.sqlstate, error),
                             [op])

    def expect(self, op, error, allowed=()):
        """An error answered to `op`: fine when retryable, in `allowed`, or the
        refusal the role dimension asks for; an ERR violation otherwise."""
        if error.sqlstate in RETRYABLE or error.sqlstate in allowed:
            return
        if roles.refusal_is_right(op, error.sqlstate):
            roles.count_refusal(self.stats, op)
            return
        self.unexpected(op, error)

    def answered(self, op):
        """An answer (no error) came back to `op`: with roles, a call for another
        role's principal must never get one."""
        if roles.is_foreign(op):
            roles.foreign_answered(self.model, op)

    def send(self, op, method, *args, allowed=()):
        """One call through the transport: its row, or None when it failed (an
        unexpected SQLSTATE is recorded; a lost answer stays in doubt)."""
        try:
            row = getattr(self.transport, method)(op, *args)
        except ServerError as error:
            if op.commit != "unknown":  # a cancel may come after the commit: then it may have written
                op.writes = False
            if op.outcome is None:
                op.outcome = "error " + str(error.sqlstate)
            self.expect(op, error, allowed)
            return None
        except RemoteLost:
            return None
        if row is not None:
            self.answered(op)
        return row

    def settle(self, op):
        """The COMMIT of a call's transaction (nothing in the function-call form);
        raises ConnectionLost (then op.commit is unknown)."""
        error = self.transport.settle(op)
        if error is not None:
            self.expect(op, error)

    def check_usable(self, op, row):
        """I5: after in_progress the caller's transaction is still usable; false
        (the transaction was rolled back) when it was not."""
        usable = self.transport.still_usable(op, row)
        if usable is None:
            return True
        self.model.violation("I5", op.key_id(), "%s: after %s answered in_progress, SELECT 1 raised %s"
                             % (op.id, op.kind, usable), [op])
        return False

    # -- operations ---------------------------------------------------------

    def op_txn(self):
        """begin -> effect -> complete -> COMMIT, or one of the ways to fail."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1, 0.3])
        iso = self.draw_isolation()
        variant = self.pick(dict(TXN_VARIANTS, timeout=3 if "timeout" in self.settings.faults else 0,
                                 disconnect=3 if "disconnect" in self.settings.faults else 0))
        op = self.new_op("txn", principal, key, fp)
        op.params = {"ttl": ttl, "wait": wait, "variant": variant}
        if self.transport.isolation:
            op.params = dict(iso=iso.split()[0], **op.params)
        self.draw_refuse(op)
        status, headers, body = self.response(op, [200, 201, 202, 204])
        plan = TxnPlan(principal=principal, key=key, fp=fp, ttl=ttl, wait=wait, iso=iso, variant=variant,
                       status=status, headers=headers, body=body,
                       pause=self.rng.uniform(0.05, 0.2) if variant in ("timeout", "disconnect") else 0.0,
                       timeout_ms=self.rng.choice([20, 60, 150]) if variant == "timeout" else None,
                       cut=self.rng.random())
        if variant in ("complete", "secret", "timeout", "disconnect"):
            # What a call that completes stores (the transport marks op.writes when it sends that).
            op.secret = variant == "secret"
            op.response = (status, None, None) if op.secret else (status, headers, body)
        # 55000: COMMIT without complete must fail; 57014: the cancel the timeout fault asks for.
        allowed = {"no_complete": {"55000"}, "timeout": {"57014"}}.get(variant, ())
        row = self.send(op, "txn_begin", plan, allowed=allowed)
        if row is None:
            return
        outcome, r_status, r_headers, r_body, resource_id, expires, fence, now, clock = row[:9]
        op.outcome = outcome
        op.now, op.clock = epoch(now), epoch(clock)
        if outcome != "started":
            op.writes = False
            if outcome == "in_progress" and not self.check_usable(op, row):
                return
            if outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(op, outcome, r_status, r_headers, r_body and bytes(r_body),
                                        resource_id, fence)
            if outcome == "expired":
                self.model.check_expired(op)
            self.transport.settle(op)
            return
        op.fence, op.expires = fence, epoch(expires)
        self.model.check_start(op)
        error = self.transport.txn_end(op, plan)
        if error is not None:
            self.expect(op, error, allowed)
        elif variant == "no_complete" and op.commit == "yes":
            self.model.violation("I1", op.key_id(), "%s: COMMIT without complete() succeeded: an effect "
                                 "committed without its key" % op.id, [op])

    def op_save_final(self):
        """save_final of a final 4xx (or a non-final 500, which must answer false)."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("save_final", principal, key, fp)
        status, headers, body = self.response(op, [404, 409, 422, 422, 500])
        op.params = {"ttl": ttl, "status": status}
        self.draw_refuse(op)
        op.response = (status, headers, body)  # what a call whose answer is lost may have stored
        row = self.send(op, "save_final", principal, key, fp, status, headers, body, ttl, self.draw_isolation())
        if row is None:
            return
        now, saved, clock = row
        op.outcome = saved
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(saved)
        if saved:
            op.expires = op.now + ttl
            self.model.check_start(op)
        self.settle(op)

    def op_claim(self):
        """claim with a short ttl."""
        principal, key = self.draw_key()
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("claim", principal, key, "claim")
        op.params = {"ttl": ttl}
        if self.settings.refuse:  # the run's policy of the action 'claim'
            op.refuse_grace = self.settings.claim_grace_ms / 1000.0
        row = self.send(op, "claim", principal, key, ttl, self.draw_isolation())
        if row is None:
            return
        now, claimed, clock = row
        op.outcome = claimed
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(claimed)
        if claimed:
            op.expires = op.now + ttl
            self.model.check_start(op)
        self.settle(op)

    def op_forget(self):
        """forget (the operator tool)."""
        principal, key = self.draw_key()
        op = self.new_op("forget", principal, key)
        row = self.send(op, "forget", principal, key)
        if row is None:
            return
        op.outcome = row[0]
        self.settle(op)

    def op_cleanup(self):
        """cleanup: CALL idempotency.cleanup() (one batch on every shard through PL/Proxy)."""
        op = self.new_op("cleanup")
        row = self.send(op, "cleanup")
        if row is not None:
            op.outcome = row[0]

    def op_inspect(self):
        """Reads the key's row directly (on every shard through PL/Proxy) and
        checks it against the model; a row on a shard that does not own the
        principal is a ROUTE violation."""
        principal, key = self.draw_key()
        op = self.new_op("inspect", principal, key)
        rows = self.send(op, "inspect", principal, key)
        if rows is None:
            return
        owner = self.settings.owners.get(principal)
        for shard, row, now, clock in rows:
            if owner is not None and shard != owner:
                if row is not None:
                    self.model.violation("ROUTE", op.key_id(), "%s: shard %d holds a row of the key (%s/%s/fence "
                                         "%s), but the key belongs to shard %d" % (
                                             op.id, shard, row["action"], row["state"], row["fence"], owner),
                                         [op], "key on a foreign shard")
                continue
            op.now, op.clock = epoch(now), epoch(clock)
            op.outcome = "absent" if row is None else "%s/%s/fence %s" % (row["action"], row["state"], row["fence"])
            self.model.check_row(op, row)

    def op_wait(self):
        """A pause of 10-200 ms."""
        time.sleep(self.rng.uniform(0.01, 0.2))

    def op_steal(self):
        """The role dimension: a call for another role's principal with a fence
        taken from the model (as if leaked): renew, complete, release or lookup."""
        roles.steal(self)
