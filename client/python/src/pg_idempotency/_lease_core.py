"""The lease protocol without its I/O: the policies, options and results, the
statements, and every decision of a run (a rejected key, the answer of an acquire
that did not start, the fenced statement that settles the key, the settled expiry).
``async_lease`` (and ``lease``, generated from it) runs them on a connection.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Sequence, Tuple

import psycopg

from ._common import (
    KEY_REFUSED,
    Request,
    Storage,
    answer_response,
    duplicate_wait,
    interval,
    kept_headers_json,
    request_params,
    valid_key,
)
from .http import (
    DEFAULT_DUPLICATE_MODE,
    DEFAULT_KEPT_HEADERS,
    KEY_REFUSED_DETAIL,
    PROBLEM_TYPE_BASE,
    Problem,
    Response,
    http_date,
    problem_response,
    stamped,
)

# An acquire that did not start is answered by http_answer in the same statement, as
# _transactional_core.BEGIN_SQL is (the type base thrice first); Retry-After 1 second.
ACQUIRE_SQL = (
    "SELECT o.outcome, o.fence, o.resource_id,"
    " floor(extract(epoch FROM o.expires_at))::bigint AS expires_epoch,"
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, %s::text, 1)).status END AS status,"
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, %s::text, 1)).headers::text END AS headers,"
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, %s::text, 1)).body END AS body"
    " FROM idempotency.acquire(%s, %s, %s, idempotency.fingerprint(%s, %s, %s::bytea, %s::text[]),"
    " %s::interval, %s::interval, %s::interval) AS o"
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
    problem_type_base: str = PROBLEM_TYPE_BASE
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


ALREADY_PROCESSED_DETAIL = "A request with this Idempotency-Key was already processed; its result is not kept."
"""The detail of the 409 for a duplicate under the policies once and commit_on_success."""

# The LeaseOutcome of each outcome of acquire that does not start.
OUTCOMES = {
    "replay": LeaseOutcome.REPLAYED,
    "secret_replay": LeaseOutcome.REPLAYED,
    "mismatch": LeaseOutcome.MISMATCH,
    "in_progress": LeaseOutcome.IN_PROGRESS,
    "expired": LeaseOutcome.EXPIRED,
}


class LeaseRunnerBase:
    """What LeaseRunner and AsyncLeaseRunner share: everything but the I/O."""

    def __init__(self, conninfo: str, options: Optional[LeaseOptions] = None) -> None:
        self.conninfo = conninfo
        self.options = options or LeaseOptions()
        if self.options.lease <= timedelta(0):
            raise ValueError("lease must be positive")
        self._final = Storage(self.options.final_statuses)

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
        return LeaseResult(LeaseOutcome.REJECTED, self._problem(Problem.KEY_MALFORMED, KEY_REFUSED_DETAIL))

    def _acquire_params(self, request: Request) -> tuple:
        options = self.options
        return (options.problem_type_base,) * 3 + (
            *request_params(request),
            interval(options.lease),
            interval(options.ttl),
            interval(duplicate_wait(request, options.duplicates, options.wait)),
        )

    def _answer(self, row: Any) -> Optional[LeaseResult]:
        """The result of an acquire that did not start, None when it started: the
        answer idempotency.http_answer gave in acquire's row, or 409
        already-processed for a replay under a policy that keeps no response (every
        answer carrying the row's expiry)."""
        outcome, _, resource_id, expires, status, headers, body = row
        if outcome == "started":
            return None
        if status is None:
            raise psycopg.InterfaceError(f"idempotency.acquire returned an unknown outcome: {outcome}")
        replayed = outcome in ("replay", "secret_replay")
        if replayed and self.options.policy != Policy.REMEMBER:
            response = stamped(self._problem(Problem.ALREADY_PROCESSED, ALREADY_PROCESSED_DETAIL), expires)
            result = LeaseResult(LeaseOutcome.DUPLICATE, response)
        else:
            response = answer_response(status, headers, None if body is None else bytes(body), resource_id)
            result = LeaseResult(OUTCOMES.get(outcome, LeaseOutcome.REPLAYED), response)
        result.expires_epoch = None if expires is None else int(expires)
        return result

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
        return LeaseResult(outcome, stamped(response, expires), fence=row[1], renewals=renewals,
                           expires_epoch=expires)


__all__ = ["LeaseOptions", "LeaseOutcome", "LeaseResult", "LeaseRunnerBase", "Policy"]


