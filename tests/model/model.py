"""What each (principal, key) may be, and the invariants I1-I7 of issue 11.

Every operation a client runs is recorded as an `Op`: when it was sent and
answered (the checker's wall clock, which is the server's clock too: the
cluster runs on the same machine), what the server said, the server's `now()`
and `clock_timestamp()` of the transaction, and whether its transaction
committed (`yes`, `no`, or `unknown` when the connection broke while COMMIT
was in flight).

An op that may write a key row (a transactional request that completed,
`acquire` that started, `save_final` or `claim` that returned true) is a
*generation* of its key. The checks only ever flag what is certain:

- the *certain current generation* of a key at some moment is the generation
  whose COMMIT was acknowledged last before that moment, provided no other
  writer or `forget` could have committed after it (anything uncertain, or
  concurrent with its commit, makes the key uncertain and the check is skipped);
- a generation is *certainly live* at a decision of the server when its
  `expires_at` is later than the end of the call (`clock_timestamp()` after it:
  a call that waited for the key lock may legitimately find a row that expired
  meanwhile deleted by a cleanup), or when it is a lease
  that is certainly still `in_progress` and whose lease certainly runs past the
  transaction's `clock_timestamp()` after the call (the 0.6.0 rule: a row is live
  while `expires_at > now()` or its lease is live). A margin of MARGIN seconds
  is kept on both, so a boundary race is never flagged.

Timestamps are compared only with timestamps of the same kind: server values
with server values, and the checker's send/answer times with each other.
"""

import threading
import time

import expiry
from answers import AnswerChecks

# Seconds kept on every timing comparison: a race at the boundary is not flagged.
MARGIN = 0.02

INVARIANTS = {
    "I1": "at most one effect per key generation",
    "I2": "a replay returns exactly what the one committed effect stored",
    "I3": "a superseded fence never succeeds again; fences never repeat",
    "I4": "what committed survives any crash, what did not commit never appears",
    "I5": "after in_progress the caller's transaction is still usable",
    "I6": "once every ttl and lease has passed, one cleanup leaves nothing expired or stuck",
    "I7": "any other fingerprint gets mismatch while the key lives, from every entry point",
    "EXP": "with the expiry policy refuse, no key runs again within ttl + grace, and only such a key answers "
           "expired (--refuse)",
    "BIND": "no call reads, writes, renews, releases or completes a row of a principal its role is not bound to "
            "(--roles)",
    "ROUTE": "every key row and effect lives only on the shard that owns its principal (function-call form)",
    "ERR": "an unexpected error (SQLSTATE outside what the operation may raise)",
}


class Op:
    """One operation of one client, as the checker saw it."""

    def __init__(self, op_id, client, kind, principal=None, key=None, fp=None):
        self.id = op_id
        self.client = client
        self.kind = kind  # txn, acquire, renew, complete, release, effect, save_final, claim, forget, cleanup, inspect
        self.principal = principal
        self.key = key
        self.fp = fp  # fingerprint number (0..n-1; "claim" for claims)
        self.params = {}
        self.sent = None  # checker clock when the first statement was sent
        self.acked = None  # checker clock when the last answer arrived
        self.commit_sent = None
        self.commit_acked = None
        self.commit = None  # yes / no / unknown; None while running or for read-only ops
        self.outcome = None  # what the server answered (outcome, true/false, error SQLSTATE)
        self.now = None  # server now() of the transaction that decided (epoch seconds)
        self.clock = None  # server clock_timestamp() right after the decision
        self.fence = None  # fence handed out (begin/acquire started) or used (renew/complete/release)
        self.expires = None  # expires_at of the row this op writes
        self.lease_min = None  # lower bound of the lease this op holds (acquire)
        self.response = None  # (status, headers, body) this op stores
        self.secret = False
        self.refuse_grace = None  # seconds: the op's action refuses its key for this long after it expired
        self.writes = False  # may have written a key row (a generation)
        self.holds_lock = False  # begin/acquire answered started: the key lock is held until the transaction ends
        self.last_sent = None  # when the latest statement of a started transaction was sent
        self.lock_until = None  # from when the key lock may have been let go (None: still held)
        self.holder = None  # for renew/complete/release/effect: the acquire op
        self.completed_by = []  # for acquire: complete ops of this holder
        self.released_by = []  # for acquire: release ops of this holder
        self.renewed_by = []  # for acquire: renew ops of this holder
        self.role = None  # the role the call ran as (--roles), None: the superuser
        self.path = None  # how the binding reached that session (roles.py)
        self.note = ""

    def key_id(self):
        """(principal, key), or None for ops on no key."""
        return (self.principal, self.key) if self.key is not None else None

    def committed_by(self, moment):
        """Whether this op's commit was acknowledged before `moment` (checker clock)."""
        return self.commit == "yes" and self.commit_acked is not None and self.commit_acked < moment

    def may_have_committed(self):
        """Whether this op's writes may be in the database."""
        return self.commit in ("yes", "unknown") or (self.commit is None and self.writes)

    def describe(self, origin):
        """One line for a history: times relative to `origin`."""

        def rel(t):
            """Checker time `t` relative to the start, or a dash."""
            return "    -  " if t is None else "%7.3f" % (t - origin)

        parts = ["%s %s c%-2s %-10s %-5s" % (rel(self.sent), rel(self.acked), self.client, self.kind, self.id)]
        if self.fp is not None:
            parts.append("fp=%s" % self.fp)
        for name, value in self.params.items():
            parts.append("%s=%s" % (name, value))
        parts.append("-> %s" % (self.outcome,))
        if self.fence is not None:
            parts.append("fence=%s" % self.fence)
        if self.expires is not None and self.now is not None:
            parts.append("expires=now+%.3f" % (self.expires - self.now))
        if self.lease_min is not None and self.now is not None:
            parts.append("lease>=now+%.3f" % (self.lease_min - self.now))
        if self.now is not None:
            parts.append("now=%s" % rel(self.now).strip())
        if self.commit is not None:
            parts.append("commit=%s" % self.commit)
            if self.commit_acked is not None:
                parts.append("@%s" % rel(self.commit_acked).strip())
        if self.role is not None:
            parts.append("as %s via %s" % (self.role, self.path))
        if self.note:
            parts.append("(%s)" % self.note)
        return " ".join(parts)


class Violation:
    """A broken invariant: which one, on which key, why, and the ops involved."""

    def __init__(self, invariant, key, message, ops, signature):
        self.invariant = invariant
        self.signature = signature
        self.key = key
        self.message = message
        self.ops = ops


class Model(AnswerChecks):
    """Every op of a run, by key, and the checks run as ops finish."""

    margin = MARGIN  # for the checks of other files (expiry.py)

    def __init__(self):
        self.lock = threading.RLock()
        self.ops = {}  # id -> Op
        self.by_key = {}  # (principal, key) -> [Op] in order of sending
        self.cleanups = []  # CALL cleanup() ops: they touch every key, so every history shows them
        self.fault_times = []  # when a server fault (kill, restart) was injected: every lock was let go
        self.pending_lock_checks = []  # ops that started, to check against open transactions (check_lock)
        self.violations = []
        self.origin = None

    # -- recording ---------------------------------------------------------

    def add(self, op):
        """Registers an op when it is about to be sent."""
        with self.lock:
            if self.origin is None:
                self.origin = op.sent
            self.ops[op.id] = op
            if op.key is not None:
                self.by_key.setdefault(op.key_id(), []).append(op)
            elif op.kind == "cleanup":
                self.cleanups.append(op)

    def violation(self, invariant, key, message, ops=(), signature=None):
        """Records a violation (the run stops soon after the first). `signature`
        names the kind of failure in a few words, for the summary."""
        with self.lock:
            found = Violation(invariant, key, message, [o for o in ops if o is not None], signature or invariant)
            found.at = time.time() - (self.origin or time.time())
            self.violations.append(found)

    def history(self, key, limit=60, until=None):
        """The ops on `key` sent up to checker time `until` (default: all),
        oldest first, as printable lines (the last `limit`)."""
        with self.lock:
            ops = sorted((o for o in self.by_key.get(key, []) + self.cleanups if until is None or o.sent <= until),
                         key=lambda o: o.sent)
            origin = self.origin or 0
            lines = [o.describe(origin) for o in ops]
            if len(lines) > limit:
                lines = ["... %d earlier ops" % (len(lines) - limit)] + lines[-limit:]
            return lines

    # -- what the key is -----------------------------------------------------

    def certain_current(self, key, op):
        """The generation that certainly holds `key` for the whole of `op` (from
        when it was sent to when it was answered), or None.

        It is the writer whose commit was acknowledged last before `op` was sent;
        None when any other writer or forget sent before `op` was answered may
        have committed after it.
        """
        moment = op.sent
        until = op.acked if op.acked is not None else float("inf")
        ops = self.by_key.get(key, [])
        done = [o for o in ops if o.writes and o is not op and o.committed_by(moment)]
        if not done:
            return None
        current = max(done, key=lambda o: o.commit_acked)
        for other in ops:
            if other is current or other is op or other.sent >= until:
                continue
            if other.kind == "forget":
                if other.outcome is False and other.commit in ("yes", "no"):
                    continue  # it deleted nothing
                if other.acked is not None and other.acked < current.commit_sent:
                    continue
                return None
            if not other.writes or other.commit == "no":
                continue
            if other.commit == "yes" and other.commit_acked < current.commit_sent:
                continue  # committed before the current one started committing
            return None
        return current

    def completed(self, gen, moment):
        """Whether generation `gen`'s row was completed before checker time
        `moment`: "yes", "no" or "maybe"."""
        if gen.kind != "acquire":
            return "yes"
        states = set()
        for c in gen.completed_by:
            if c.outcome is True and c.committed_by(moment):
                return "yes"
            states.add("no" if c.commit == "no" or c.outcome is False else "maybe")
        return "maybe" if "maybe" in states else "no"

    def lease_certainly_live(self, gen, clock, moment):
        """Whether lease generation `gen` was certainly in_progress, not released and
        leased beyond server clock `clock`, for an op sent at `moment`."""
        if gen.kind != "acquire" or gen.lease_min is None or clock is None:
            return False
        for done in gen.completed_by + gen.released_by:
            if done.commit != "no" and done.outcome is not False:
                return False
        lease = gen.lease_min
        for renewal in gen.renewed_by:
            if renewal.outcome is True and renewal.committed_by(moment) and renewal.now is not None:
                lease = max(lease, renewal.now + renewal.params["lease_s"])
        return lease > clock + MARGIN

    def unexpired(self, gen, now, clock):
        """Whether generation `gen`'s ttl certainly still ran when the call ended.
        The server judges expiry by the transaction's now(), which is its start:
        a call that waited for the key lock may find the row deleted by a cleanup
        whose now() came later, so the end of the call (clock) is what counts."""
        at = clock if clock is not None else now
        return gen.expires is not None and at is not None and gen.expires > at + MARGIN

    def certainly_live(self, gen, now, clock, moment):
        """Whether generation `gen` was certainly live for a decision with server
        now() `now` and clock_timestamp() at most `clock`; `moment` is when the
        deciding op was sent (checker clock). Live: not expired, or leased."""
        if self.unexpired(gen, now, clock):
            return True
        return self.lease_certainly_live(gen, clock, moment)

    def blocks_same_request(self, gen, now, clock, moment):
        """Whether `gen` certainly forbids a start by a request with its own
        fingerprint: a completed live row (replay) or a live lease (in_progress).
        An in_progress row whose lease ran out or was released may be taken over."""
        if self.lease_certainly_live(gen, clock, moment):
            return "leased"
        if self.completed(gen, moment) == "yes" and self.unexpired(gen, now, clock):
            return "completed"
        return None

    # -- checks while the run goes --------------------------------------------

    def check_start(self, op):
        """I1/I7/I3: an op that started a new generation (begin/acquire `started`,
        save_final/claim true) must not replace a certainly live row, and its
        fence must be above every fence committed before it."""
        with self.lock:
            key = op.key_id()
            current = self.certain_current(key, op)
            what = "answered %s" % (op.outcome,)
            if current is not None and current.fp != op.fp and self.certainly_live(
                    current, op.now, op.clock, op.sent):
                by = "ttl" if self.unexpired(current, op.now, op.clock) else "lease"
                self.violation(
                    "I7", key,
                    "%s %s with fingerprint %s while the row of %s (fingerprint %s) was live by its %s "
                    "(mismatch expected)" % (op.kind, what, op.fp, current.id, current.fp, by),
                    [current, op], "%s took a key live by its %s, other fingerprint" % (op.kind, by))
            elif current is not None and current.fp == op.fp:
                state = self.blocks_same_request(current, op.now, op.clock, op.sent)
                if state is not None:
                    self.violation(
                        "I1", key,
                        "%s %s while the key's generation %s (%s, same fingerprint) was live: "
                        "a second effect for one generation" % (op.kind, what, current.id, state),
                        [current, op], "%s started on a live %s row" % (op.kind, state))
            self.check_refused(op, current)
            self.check_lock(op)
            if op.fence is None:
                return
            for other in self.by_key.get(key, []):
                if other is op or other.fence is None or not other.writes:
                    continue
                if other.kind in ("renew", "complete", "release", "effect"):
                    continue
                if other.committed_by(op.sent) and op.fence <= other.fence:
                    self.violation(
                        "I3", key,
                        "%s handed out fence %s although %s had committed fence %s before it was called"
                        % (op.id, op.fence, other.id, other.fence),
                        [other, op], "fence handed out again")
                    return

    def check_refused(self, op, current):
        """EXP (expiry.py): a start within ttl + grace of a refusing generation."""
        expiry.check_refused(self, op, current)

    def check_late_complete(self, op):
        """EXP/I3 (expiry.py): no fenced completion of a certainly dead key."""
        with self.lock:
            expiry.check_late_complete(self, op)

    def check_expired(self, op):
        """EXP (expiry.py): an `expired` answer only for a key that is refused."""
        with self.lock:
            expiry.check_expired(self, op)

    def check_lock(self, op):
        """I1: nothing starts on a key while another transaction that got
        `started` for it still holds the key lock (its COMMIT or ROLLBACK not yet
        sent, no error yet, no server fault since). Decided by settle_lock_checks
        once the holders' transactions have ended."""
        self.pending_lock_checks.append(op)

    def settle_lock_checks(self, final=False):
        """Runs the deferred lock checks whose holders have ended (all when `final`)."""
        with self.lock:
            waiting = []
            for op in self.pending_lock_checks:
                if not self._lock_check(op, final):
                    waiting.append(op)
            self.pending_lock_checks = waiting

    def _lock_check(self, op, final):
        """One deferred lock check; false while a holder's end is not known yet."""
        key = op.key_id()
        for holder in self.by_key.get(key, []):
            if holder is op or not holder.holds_lock or holder.acked is None or holder.acked >= op.sent:
                continue
            until = holder.lock_until if holder.kind == "txn" else holder.commit_sent
            if until is None and not final:
                return False
            if until is None or until <= op.acked:
                continue
            if any(holder.acked <= t <= op.acked for t in self.fault_times):
                continue
            self.violation("I1", key, "%s answered %s while %s, which had answered started, still held the key "
                           "(its transaction was open from %.3f s to %.3f s)"
                           % (op.id, op.outcome, holder.id, holder.acked - (self.origin or 0),
                              until - (self.origin or 0)),
                           [holder, op], "started while another transaction held the key")
            return True
        return True

    def check_fenced_success(self, op):
        """I3: renew/complete/release that succeeded with the fence of holder
        `op.holder` although another generation (or a forget) had certainly
        replaced that holder's row before the call was sent."""
        with self.lock:
            holder = op.holder
            if holder is None or holder.commit != "yes":
                return
            key = op.key_id()
            for other in self.by_key.get(key, []):
                if other is holder or other.sent <= holder.commit_acked:
                    continue
                if other.kind == "forget" and other.outcome is True and other.committed_by(op.sent):
                    self.violation(
                        "I3", key,
                        "%s(fence %s) returned true although %s had deleted the holder's row"
                        % (op.kind, op.fence, other.id),
                        [holder, other, op], "stale fence succeeded after forget")
                    return
                if other.writes and other.committed_by(op.sent) and other.kind not in (
                        "renew", "complete", "release", "effect"):
                    self.violation(
                        "I3", key,
                        "%s(fence %s) returned true although %s (fence %s) had taken the key over "
                        "after this holder's acquire committed" % (op.kind, op.fence, other.id, other.fence),
                        [holder, other, op], "stale fence succeeded after takeover")
                    return
