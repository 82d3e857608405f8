//! Idempotency keys on PostgreSQL (the `idempotency` extension, 0.9.0 or later) for tokio-postgres.
//!
//! - [`Idempotency`]: the framework-shaped calls `once`, `commit_on_success` and
//!   `remember` on a [`Key`], with typed results ([`Done`], [`Remembered`]), the policy
//!   and the ttl per call, hashed keys by default.
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
//! - [`http`]: responses and problem bodies; the answers of the outcomes come whole from
//!   the server (`idempotency.http_answer`), the names from [`generated`] (made from
//!   `client/protocol.json`); the optional axum 0.8 glue and tower layer (feature `axum`).
//! - sqlx (feature `sqlx`): [`Client::begin_sqlx`] / [`Client::complete_sqlx`] on a
//!   `sqlx::Transaction<'_, Postgres>`, and [`Idempotency::from_sqlx`] /
//!   [`LeaseRunner::from_sqlx`] over a `PgPool`.
//! - [`connect`]: TLS (rustls) or none ([`Tls`]), and bounded pools (deadpool-postgres).
//!
//! Fingerprints are computed by the server (`idempotency.fingerprint`, RFC 8785 + SHA-256)
//! inside the statement that claims the key: no extra round trip, and no second
//! implementation of RFC 8785 to drift from the server's.

#[cfg(feature = "axum")]
pub mod axum_glue;
mod calls;
mod common;
pub mod connect;
mod db;
mod error;
pub mod fault;
#[rustfmt::skip]
pub mod generated;
pub mod http;
mod lease;
mod queue;
mod router;
#[cfg(feature = "sqlx")]
mod sqlx_glue;
mod statements;
pub mod stream;
mod transactional;

pub use calls::{CallError, Done, Idempotency, Key, Remembered};
pub use common::Request;
pub use connect::Tls;
pub use error::{BoxError, Error};
pub use http::{DuplicateMode, Outcome, Problem, Response};
pub use lease::{
    key_digest, LeaseOptions, LeaseOutcome, LeaseResult, LeaseRunner, Policy,
    RUNNER_APPLICATION_NAME,
};
pub use queue::{claim_batch, push_unique, push_unique_in, BatchClaim};
pub use router::{Route, Routed, Router, RouterCounters, RouterOptions, DEFAULT_LOOKUP_TIMEOUT};
pub use stream::{StreamEvent, StreamWriter};
pub use transactional::{
    fingerprint, BatchCompletion, BatchOutcome, Begun, Client, Connection, HandlerFuture, Options,
};
