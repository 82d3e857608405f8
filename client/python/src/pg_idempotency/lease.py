"""The lease protocol: an effect outside the database (an upstream HTTP call, a
payment provider, a broker) at most once per key.

    runner = LeaseRunner("dbname=shop", LeaseOptions(policy=Policy.REMEMBER))
    result = runner.run(request, lambda: call_payment_provider(...))
    send(result.response)

The key is held by a lease that a background thread renews at a third of its
length while the body runs; every statement that settles the key is fenced.
Same semantics and problem bodies as ``idem::LeaseRunner`` (C++).
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence, Tuple

import psycopg

from ._common import (
    DEFAULT_KEPT_HEADERS,
    KEY_REFUSED,
    FinalStatuses,
    Request,
    interval,
    kept_headers_json,
    stored_response,
    valid_key,
)
from .http import (
    DEFAULT_DUPLICATE_MODE,
    DETAILS,
    DUPLICATE_MODES,
    EXPIRES_HEADER,
    Problem,
    Response,
    http_date,
    problem_for_outcome,
    problem_response,
)

ACQUIRE_SQL = (
    "SELECT outcome, fence, response_status, response_headers::text AS response_headers,"
    " response_body, resource_id,"
    " ceil(extract(epoch FROM lease_until - pg_catalog.clock_timestamp()))::integer AS lease_seconds,"
    " floor(extract(epoch FROM expires_at))::bigint AS expires_epoch"
    " FROM idempotency.acquire(%s, %s, %s, idempotency.fingerprint(%s, %s, %s::bytea, %s::text[]),"
    " %s::interval, %s::interval, %s::interval)"
)
RENEW_SQL = "SELECT idempotency.renew(%s, %s, %s::bigint, %s::interval)"
MARK_DONE_SQL = "SELECT idempotency.complete(%s, %s, fence => %s::bigint, status => %s::integer)"
REMEMBER_SQL = (
    "SELECT idempotency.complete(%s, %s, fence => %s::bigint, status => %s::integer,"
    " body => %s::bytea, headers => %s::jsonb, resource_id => %s::text,"
    " one_time_secret => %s::boolean)"
)
RELEASE_SQL = "SELECT idempotency.release(%s, %s, %s::bigint)"
# The settled row's expiry, read only when the key was completed after acquire's
# expires_at had passed (complete then keeps it one more ttl from its own now()).
STORED_EXPIRY_SQL = "SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup(%s, %s)"


class Policy(enum.Enum):
    """What happens to the key after the effect ran."""

    ONCE = "once"
    """At most once: the key is marked done whether the body succeeded, failed or raised."""
    COMMIT_ON_SUCCESS = "commit_on_success"
    """Done on success (status below 400); a failure or an exception releases the key."""
    REMEMBER = "remember"
    """The final response is stored and replayed; a non-final one or an exception releases."""


class LeaseOutcome(enum.Enum):
    """How a LeaseRunner.run call ended."""

    FRESH = "fresh"
    """The body ran under this call and the key was settled with its fence."""
    REPLAYED = "replayed"
    """Policy remember: the stored response of an earlier call."""
    IN_PROGRESS = "in_progress"
    """Another holder's lease is live (or a transaction holds the key): 409."""
    DUPLICATE = "duplicate"
    """Policies once / commit_on_success: an earlier call already did it: 409."""
    MISMATCH = "mismatch"
    """The key was used for another request: 422."""
    FRESH_UNFENCED = "fresh_unfenced"
    """The body ran, but the lease was lost meanwhile: nothing was stored."""
    REJECTED = "rejected"
    """Missing or malformed key: 400."""
    EXPIRED = "expired"
    """The key expired under an on_expiry 'refuse' policy (a tombstone): 410, the body did not run."""


@dataclass
class LeaseOptions:
    """Settings of a LeaseRunner."""

    policy: Policy = Policy.REMEMBER
    lease: timedelta = timedelta(seconds=30)
    """Lease length; renewed every third of it (at least every 50 ms)."""
    renew: bool = True
    """Renew from a background thread (own connection) while the body runs."""
    max_renew_failures: int = 3
    """Consecutive renewal errors after which renewing stops (an error is not a lost lease)."""
    ttl: Optional[timedelta] = None
    wait: Optional[timedelta] = None
    """How long acquire waits for a transaction holding the key (begin); None: idempotency.wait_timeout."""
    duplicates: str = DEFAULT_DUPLICATE_MODE
    """"wait" (acquire waits up to ``wait`` for a transaction holding the key) or "reject"
    (acquire with wait 0: 409 at once). A live lease is answered 409 at once in both modes.
    Request.duplicates overrides it per call."""
    kept_headers: Sequence[str] = DEFAULT_KEPT_HEADERS
    final_statuses: Optional[Sequence[int]] = None
    problem_type_base: str = "/problems/"
    max_key_length: int = 255


@dataclass
class LeaseResult:
    """The result of one run."""

    outcome: LeaseOutcome
    response: Response
    """What to send: the body's, the stored one, or a problem response."""
    fence: int = 0
    """The fence this call held (0 when it held none)."""
    renewals: int = 0
    """Successful renewals while the body ran."""
    expires_epoch: Optional[int] = None
    """When the key stops counting (its row's expires_at, epoch seconds; in the past for
    EXPIRED), None when no row backs the answer (rejected, released). The response
    already carries it as Idempotency-Expires; ``expires_header()`` gives the value."""

    def expires_header(self) -> Optional[str]:
        """The Idempotency-Expires value (IMF-fixdate) of this result, or None."""
        return None if self.expires_epoch is None else http_date(self.expires_epoch)


class _Renewer:
    """Renews a lease from its own thread and connection until stopped.

    renew() returning false means the fence lost the key: renewing stops and the
    lease counts as lost. An error (network, restart) is retried at the next
    tick; after max_failures in a row renewing stops without declaring it lost.
    """

    def __init__(self, conninfo: str, principal: str, key: str, fence: int, options: LeaseOptions):
        self._args = (principal, key, fence, interval(options.lease))
        self._conninfo = conninfo
        self._period = max(0.05, options.lease.total_seconds() / 3)
        self._max_failures = options.max_renew_failures
        self._stop = threading.Event()
        self.lost = False
        self.renewals = 0
        self._thread = threading.Thread(target=self._loop, name="pg_idempotency-renew", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        conn: Optional[psycopg.Connection[Any]] = None
        failures = 0
        try:
            while not self._stop.wait(self._period):
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self._conninfo, autocommit=True)
                    row = conn.execute(RENEW_SQL, self._args).fetchone()
                    failures = 0
                    if row is not None and row[0]:
                        self.renewals += 1
                    else:
                        self.lost = True
                        return
                except psycopg.Error:
                    if conn is not None:
                        conn.close()
                    conn = None
                    failures += 1
                    if failures >= self._max_failures:
                        return
        finally:
            if conn is not None:
                conn.close()


Body = Callable[[], Response]
"""The effect: runs outside any database transaction and is never cancelled."""


class LeaseRunnerBase:
    """What LeaseRunner and AsyncLeaseRunner share: everything but the I/O."""

    def __init__(self, conninfo: str, options: Optional[LeaseOptions] = None) -> None:
        self.conninfo = conninfo
        self.options = options or LeaseOptions()
        if self.options.lease <= timedelta(0):
            raise ValueError("lease must be positive")
        self._final = FinalStatuses(self.options.final_statuses)

    def _problem(self, problem: Problem, detail: str) -> Response:
        return problem_response(problem, detail, self.options.problem_type_base)

    def _rejected(self, request: Request) -> Optional[LeaseResult]:
        options = self.options
        if request.key is not None and valid_key(request.key, options.max_key_length):
            return None
        problem = Problem.KEY_MALFORMED if request.key is not None else Problem.KEY_MISSING
        detail = f"An Idempotency-Key of 1 to {options.max_key_length} visible ASCII characters is required."
        return LeaseResult(LeaseOutcome.REJECTED, self._problem(problem, detail))

    def _refused(self, error: psycopg.Error) -> LeaseResult:
        if getattr(error, "sqlstate", None) not in KEY_REFUSED:
            raise error
        return LeaseResult(LeaseOutcome.REJECTED, self._problem(Problem.KEY_MALFORMED, DETAILS["key_refused"]))

    def _acquire_params(self, request: Request) -> tuple:
        options = self.options
        return (
            request.principal,
            request.key,
            request.action_name(),
            request.method,
            request.path,
            request.body,
            list(request.exclude) or None,
            interval(options.lease),
            interval(options.ttl),
            interval(self._wait(request)),
        )

    def _wait(self, request: Request) -> Optional[timedelta]:
        """acquire's wait: 0 in reject mode (409 at once), else the configured wait."""
        mode = request.duplicates or self.options.duplicates
        if mode not in DUPLICATE_MODES:
            raise ValueError(f"duplicates must be one of {DUPLICATE_MODES}, not {mode!r}")
        return timedelta(0) if mode == "reject" else self.options.wait

    def _answer(self, row: Any) -> Optional[LeaseResult]:
        """The result of an acquire that did not start (its response carrying the
        row's expiry), None when it started."""
        result = self._unstarted(row)
        if result is not None:
            result.expires_epoch = None if row[7] is None else int(row[7])
            if result.expires_epoch is not None:
                result.response.set_header(EXPIRES_HEADER, http_date(result.expires_epoch))
        return result

    def _unstarted(self, row: Any) -> Optional[LeaseResult]:
        outcome, fence, status, headers, stored_body, resource_id, lease_seconds, _ = row
        if outcome == "started":
            return None
        if outcome in ("replay", "secret_replay") and self.options.policy != Policy.REMEMBER:
            response = self._problem(Problem.ALREADY_PROCESSED, DETAILS["already_processed"])
            return LeaseResult(LeaseOutcome.DUPLICATE, response)
        if outcome == "replay":
            body = bytes(stored_body) if stored_body is not None else None
            return LeaseResult(LeaseOutcome.REPLAYED, stored_response(status, headers, body, resource_id))
        response = problem_for_outcome(outcome, lease_seconds, 1, self.options.problem_type_base)
        if response is None:
            raise psycopg.InterfaceError(f"idempotency.acquire returned an unknown outcome: {outcome}")
        kind = {
            "mismatch": LeaseOutcome.MISMATCH,
            "in_progress": LeaseOutcome.IN_PROGRESS,
            "expired": LeaseOutcome.EXPIRED,
        }
        return LeaseResult(kind.get(outcome, LeaseOutcome.REPLAYED), response)

    def _settlement(self, request: Request, fence: int, failed: bool, response: Response) -> Tuple[str, tuple]:
        """The fenced statement that settles the key by the policy, with its parameters."""
        principal, key, policy = request.principal, request.key, self.options.policy
        done = (MARK_DONE_SQL, (principal, key, fence, 500 if failed else response.status))
        release = (RELEASE_SQL, (principal, key, fence))
        if policy == Policy.ONCE:
            return done
        if failed:
            return release
        if policy == Policy.COMMIT_ON_SUCCESS:
            return done if response.status < 400 else release
        if not self._final(response.status):
            return release
        headers = kept_headers_json(response, self.options.kept_headers)
        params = (principal, key, fence, response.status, response.body, headers, response.resource_id,
                  response.one_time_secret)
        return REMEMBER_SQL, params

    @staticmethod
    def _settled_expiry(sql: str, settled: bool, acquired: Optional[int]) -> Tuple[Optional[int], bool]:
        """The settled key's expiry: (acquire's, False) while that is still ahead, (None,
        True) when it must be read (completed after it passed), (None, False) when no
        row stays (released, or the settlement lost the key)."""
        if not settled or sql == RELEASE_SQL or acquired is None:
            return None, False
        if acquired > time.time():
            return acquired, False
        return None, True

    def _fresh(self, row: Any, settled: bool, lost: bool, renewals: int,
               response: Response, expires: Optional[int]) -> LeaseResult:
        """The result of a run whose body ran, stamped with the settled row's expiry."""
        outcome = LeaseOutcome.FRESH if settled and not lost else LeaseOutcome.FRESH_UNFENCED
        if expires is not None:
            response.set_header(EXPIRES_HEADER, http_date(expires))
        return LeaseResult(outcome, response, fence=row[1], renewals=renewals, expires_epoch=expires)


class LeaseRunner(LeaseRunnerBase):
    """Runs external effects under leases. Not thread-safe: one runner per thread."""

    def __init__(self, conninfo: str, options: Optional[LeaseOptions] = None) -> None:
        """``conninfo`` opens the runner's own connection (acquire, complete,
        release, autocommit) and one per run for the renewal thread."""
        super().__init__(conninfo, options)
        self._conn: Optional[psycopg.Connection[Any]] = None

    def connection(self) -> psycopg.Connection[Any]:
        """The runner's own autocommit connection, reopened when it was lost."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.conninfo, autocommit=True)
        return self._conn

    def close(self) -> None:
        """Closes the runner's connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def run(self, request: Request, body: Body) -> LeaseResult:
        """Acquires the key, runs ``body`` while renewing the lease, and settles
        the key by the policy. The body's exception propagates after the key was
        settled (once: marked done; the other policies: released)."""
        rejected = self._rejected(request)
        if rejected is not None:
            return rejected
        conn = self.connection()
        if self.options.policy == Policy.REMEMBER:
            self._final.load(conn)  # known before holding anything
        try:
            row = conn.execute(ACQUIRE_SQL, self._acquire_params(request)).fetchone()
        except psycopg.Error as error:
            return self._refused(error)
        assert row is not None
        answered = self._answer(row)
        if answered is not None:
            return answered
        fence = row[1]
        # Run the body, never cancelled, while a background thread renews the lease.
        renewer = None
        if self.options.renew:
            renewer = _Renewer(self.conninfo, request.principal, request.key or "", fence, self.options)
        failure: Optional[BaseException] = None
        response = Response()
        try:
            response = body()
        except BaseException as error:  # settled by the policy, then re-raised
            failure = error
        if renewer is not None:
            renewer.stop()
        # Settle the key by the policy; every statement is fenced.
        sql, params = self._settlement(request, fence, failure is not None, response)
        settled = bool(self.connection().execute(sql, params).fetchone()[0])  # type: ignore[index]
        if failure is not None:
            raise failure
        expires, read = self._settled_expiry(sql, settled, row[7])
        if read:
            stored = self.connection().execute(STORED_EXPIRY_SQL, (request.principal, request.key)).fetchone()
            expires = None if stored is None or stored[0] is None else int(stored[0])
        lost, renewals = (renewer.lost, renewer.renewals) if renewer is not None else (False, 0)
        return self._fresh(row, settled, lost, renewals, response, expires)
