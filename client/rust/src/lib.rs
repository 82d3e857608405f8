//! Idempotency keys on PostgreSQL (the `idempotency` extension, 0.6.0 or later) for tokio-postgres.
//!
//! - [`LeaseRunner`]: an effect outside the database under one of three [`Policy`]s
//!   (`Once`, `CommitOnSuccess`, `Remember`), over the lease protocol with automatic
//!   renewal while the body runs and fencing on completion; a dropped (cancelled) run
//!   keeps the key until its lease runs out.
//! - [`Client`]: the transactional protocol, either `begin` / `complete` inside the
//!   caller's `tokio_postgres::Transaction`, or `handle`, which owns the transaction on
//!   a [`Connection`] and maps every outcome to HTTP.
//! - [`push_unique`] / [`push_unique_in`]: a job row and its key row in one transaction.
//! - Batches (extension 0.8.0): [`Client::begin_batch`], [`Client::complete_batch`],
//!   [`claim_batch`]: many keys in one round trip, one answer per key.
//! - [`Router`]: routing by principal under Citus, each request's transaction sent to the
//!   node that holds the principal's shard; [`Error::is_stale_placement`] and
//!   [`Router::report_stale_placement`] for a call that finds the shard moved.
//! - [`fault`]: which errors are database faults ([`Error::is_database_fault`]) and the
//!   one answer to them, 503 database-unavailable.
//! - [`http`]: the problem table and HTTP mapping every client shares
//!   (`client/protocol.json`), and the optional hyper 0.14 glue (feature `hyper`).
//!
//! Fingerprints are computed by the server (`idempotency.fingerprint`, RFC 8785 + SHA-256)
//! inside the statement that claims the key: no extra round trip, and no second
//! implementation of RFC 8785 to drift from the server's.

mod common;
pub mod fault;
pub mod http;
#[cfg(feature = "hyper")]
pub mod hyper_glue;
mod lease;
mod queue;
mod router;
pub mod stream;
mod transactional;

pub use common::{BoxError, Error, Request};
pub use http::{DuplicateMode, Outcome, Problem, Response};
pub use lease::{
    LeaseOptions, LeaseOutcome, LeaseResult, LeaseRunner, Policy, RUNNER_APPLICATION_NAME,
};
pub use queue::{claim_batch, push_unique, push_unique_in, BatchClaim};
pub use router::{
    Route, Routed, Router, RouterCounters, RouterOptions, DEFAULT_LOOKUP_TIMEOUT,
    DEFAULT_MAX_PRINCIPALS, DEFAULT_NODE_DOWN_SECONDS, DEFAULT_REFRESH_SECONDS, PLACEMENT_SQL,
    STALE_PLACEMENT_MESSAGE, STALE_PLACEMENT_SQLSTATE,
};
pub use stream::{StreamEvent, StreamWriter};
pub use transactional::{
    fingerprint, BatchCompletion, BatchOutcome, Begun, Client, Connection, HandlerFuture, Options,
};
