"""pg_idempotency: Stripe-style Idempotency-Key semantics kept in PostgreSQL.

A psycopg 3 client for the ``idempotency`` extension: the transactional
protocol (``Client``), the lease protocol for external effects
(``LeaseRunner``), their asyncio twins on ``psycopg.AsyncConnection``
(``AsyncClient``, ``AsyncLeaseRunner``), many keys in one call
(``begin_batch``, ``complete_batch``, ``claim_batch``, ``push_unique`` on
both clients), routing by principal under Citus (``Router``, ``AsyncRouter``),
the answers of every outcome from the extension (``idempotency.http_answer``,
in the same statement as ``begin``/``acquire``) and the client's own problem
bodies (``Response``, ``Problem``), a WSGI middleware
(``pg_idempotency.wsgi``), an ASGI one (``pg_idempotency.asgi``) and a Django one
(``pg_idempotency.django``, imported on its own: it needs Django).
"""

from ._batch import BatchFlag, BatchOutcome
from ._common import Request
from .fault import is_database_fault
from .http import (Headers, Problem, Response, database_fault_response, problem_body,
                   problem_response)
from .lease import Body, LeaseOptions, LeaseOutcome, LeaseResult, LeaseRunner, Policy
from .async_lease import AsyncBody, AsyncLeaseRunner
from .async_transactional import AsyncAttempt, AsyncClient, AsyncHandler, fingerprint_async
from .router import Route, Router, RouterCounters, is_stale_placement
from .async_router import AsyncRouter
from .transactional import Attempt, Client, Counters, Handler, Options, fingerprint

__version__ = "0.9.0"

__all__ = [
    "AsyncAttempt",
    "AsyncBody",
    "AsyncClient",
    "AsyncHandler",
    "AsyncLeaseRunner",
    "AsyncRouter",
    "Attempt",
    "BatchFlag",
    "BatchOutcome",
    "Body",
    "Client",
    "Counters",
    "database_fault_response",
    "Handler",
    "Headers",
    "LeaseOptions",
    "LeaseOutcome",
    "LeaseResult",
    "LeaseRunner",
    "Options",
    "Policy",
    "Problem",
    "Request",
    "Response",
    "Route",
    "Router",
    "RouterCounters",
    "fingerprint",
    "fingerprint_async",
    "is_database_fault",
    "is_stale_placement",
    "problem_body",
    "problem_response",
]
