//! The framework-shaped API: `once`, `commit_on_success` and `remember` on a key, with
//! typed results, the policy and the ttl per call, over one bounded pool.
//!
//! ```no_run
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use pg_idempotency::{Done, Idempotency, Key, LeaseOptions};
//!
//! let config: tokio_postgres::Config = "host=localhost dbname=shop".parse()?;
//! let idempotency = Idempotency::new(config, Idempotency::default_options())?;
//! let key = Key::new("tenant-42", "charge:order-7");
//! let charged = idempotency
//!     .once(&key, Some(Duration::from_secs(86_400)), || async {
//!         Ok::<_, std::io::Error>("ch_123".to_string()) // the payment provider's call
//!     })
//!     .await?;
//! match charged {
//!     Done::Fresh(charge) => println!("charged: {}", charge),
//!     Done::FreshUnfenced(charge) => println!("charged, but the lease was lost: {}", charge),
//!     Done::Duplicate => println!("charged before (or being charged now)"),
//! }
//! # Ok(()) }
//! ```
//!
//! Keys are hashed by default (`LeaseOptions::hash_keys`): the database stores the
//! SHA-256 of the key material, never the material itself.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::Config;

use crate::common::Request;
use crate::error::Error;
use crate::http::{Outcome, Response};
use crate::lease::{Acquired, Held, LeaseOptions, LeaseRunner, Policy, Settle};

/// The action stored with the keys of these calls, for operators.
const ACTION: &str = "call";

/// A key: whom it belongs to (stored as given: binding and routing use it) and its
/// material (stored as its SHA-256 when keys are hashed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Whoever the key belongs to (user, API key, tenant).
    pub principal: String,
    /// The key material; any non-empty text when keys are hashed.
    pub material: String,
}

impl Key {
    /// A key of `principal` with this material.
    pub fn new(principal: impl Into<String>, material: impl Into<String>) -> Self {
        Key { principal: principal.into(), material: material.into() }
    }
}

/// How a `once` or `commit_on_success` call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done<T> {
    /// The body ran under this call and the key was settled with its fence.
    Fresh(T),
    /// The body ran, but the key could not be settled with its fence (the lease was
    /// lost, renewing gave up, or the completion failed): another call may run too.
    FreshUnfenced(T),
    /// The body did not run: an earlier call did it, or another one holds the key now.
    Duplicate,
}

/// How a `remember` call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remembered<T> {
    /// The body ran under this call and its value was stored with the key's fence.
    Fresh(T),
    /// The body ran, but its value could not be stored with the key's fence.
    FreshUnfenced(T),
    /// The value an earlier call stored.
    Replayed(T),
    /// Another call holds the key now: try again later.
    InProgress,
    /// The key expired under an on_expiry 'refuse' policy: the body did not run.
    Expired,
}

/// Why a call did not give a result.
#[derive(Debug)]
pub enum CallError<E> {
    /// The database failed before the body ran, or answered something unexpected.
    Db(Error),
    /// The body returned this error; the key was settled by the policy (once keeps it,
    /// the others release it). `lease_lost` is true when the key was not held with its
    /// fence to the end: another call may have run meanwhile.
    Body {
        /// The body's own error.
        error: E,
        /// The lease was lost (or renewing gave up) while the body ran.
        lease_lost: bool,
    },
}

impl<E: fmt::Display> fmt::Display for CallError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Db(error) => write!(f, "{}", error),
            CallError::Body { error, lease_lost: false } => write!(f, "body failed: {}", error),
            CallError::Body { error, lease_lost: true } => {
                write!(f, "body failed (and its lease was lost): {}", error)
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for CallError<E> {}

impl<E> From<Error> for CallError<E> {
    fn from(error: Error) -> Self {
        CallError::Db(error)
    }
}

/// The framework-shaped calls over one bounded pool. `Sync`: one per process.
pub struct Idempotency {
    runner: LeaseRunner,
}

impl Idempotency {
    /// The options these calls default to: `LeaseOptions::default()` with hashed keys.
    pub fn default_options() -> LeaseOptions {
        LeaseOptions { hash_keys: true, ..LeaseOptions::default() }
    }

    /// Calls whose connections connect with `config` (pools and TLS as `options` say;
    /// `policy` and `ttl` are per call and ignored here).
    pub fn new(config: Config, options: LeaseOptions) -> Result<Self, Error> {
        Ok(Idempotency::with_runner(LeaseRunner::new(config, options)?))
    }

    pub(crate) fn with_runner(runner: LeaseRunner) -> Self {
        Idempotency { runner }
    }

    /// The tokio-postgres pool of these calls, for the application's own statements;
    /// None for calls over a sqlx pool.
    pub fn pool(&self) -> Option<&deadpool_postgres::Pool> {
        self.runner.pool()
    }

    /// At most once: the body runs unless the key was used within `ttl` (None: the
    /// server's idempotency.key_ttl); a body that fails still uses the key up.
    pub async fn once<T, E, F, Fut>(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        body: F,
    ) -> Result<Done<T>, CallError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.done(Policy::Once, key, ttl, body).await
    }

    /// Once on success: the body runs unless an earlier call succeeded within `ttl`; a
    /// body that fails releases the key, so a retry runs it again.
    pub async fn commit_on_success<T, E, F, Fut>(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        body: F,
    ) -> Result<Done<T>, CallError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.done(Policy::CommitOnSuccess, key, ttl, body).await
    }

    /// The body's value is stored (as JSON) and an equal call within `ttl` gets it back
    /// without running the body; a body that fails releases the key.
    pub async fn remember<T, E, F, Fut>(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        body: F,
    ) -> Result<Remembered<T>, CallError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let held = match self.acquire(Policy::Remember, key, ttl).await? {
            Acquired::Held(held, _) => held,
            Acquired::Answer(Outcome::Replay, row) => {
                let body = row.body().unwrap_or_default();
                let value = serde_json::from_slice(&body).map_err(|e| {
                    Error::Protocol(format!("the stored value does not deserialize: {}", e))
                })?;
                return Ok(Remembered::Replayed(value));
            }
            Acquired::Answer(Outcome::InProgress, _) => return Ok(Remembered::InProgress),
            Acquired::Answer(Outcome::Expired, _) => return Ok(Remembered::Expired),
            Acquired::Answer(other, _) => return Err(unexpected(other).into()),
        };
        let (value, fenced) = self
            .run_held(Policy::Remember, &held, body, |value: &T| {
                serde_json::to_vec(value).map(|json| {
                    let headers = vec![("Content-Type".into(), "application/json".into())];
                    Response::new(200, headers, json)
                })
            })
            .await?;
        Ok(if fenced { Remembered::Fresh(value) } else { Remembered::FreshUnfenced(value) })
    }

    async fn done<T, E, F, Fut>(
        &self,
        policy: Policy,
        key: &Key,
        ttl: Option<Duration>,
        body: F,
    ) -> Result<Done<T>, CallError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let held = match self.acquire(policy, key, ttl).await? {
            Acquired::Held(held, _) => held,
            Acquired::Answer(Outcome::Mismatch, _) => {
                return Err(unexpected(Outcome::Mismatch).into())
            }
            Acquired::Answer(_, _) => return Ok(Done::Duplicate),
        };
        let marker = |_: &T| Ok::<_, serde_json::Error>(Response::new(200, Vec::new(), ""));
        let (value, fenced) = self.run_held(policy, &held, body, marker).await?;
        Ok(if fenced { Done::Fresh(value) } else { Done::FreshUnfenced(value) })
    }

    async fn acquire(
        &self,
        policy: Policy,
        key: &Key,
        ttl: Option<Duration>,
    ) -> Result<Acquired, Error> {
        if key.material.is_empty() {
            return Err(Error::Protocol("a key's material must not be empty".into()));
        }
        let request = Request {
            principal: key.principal.clone(),
            key: Some(key.material.clone()),
            method: "CALL".into(),
            action: ACTION.into(),
            ..Request::default()
        };
        self.runner.acquire(&request, policy, ttl).await
    }

    /// Runs the body under the lease and settles the key by `policy`: a successful
    /// body's `stored` response is marked done (once, commit_on_success) or stored
    /// (remember). A value that does not serialize releases the key and is an error.
    /// The body's value and whether the fence held to the end, or its error.
    async fn run_held<T, E, F, Fut, S>(
        &self,
        policy: Policy,
        held: &Held,
        body: F,
        stored: S,
    ) -> Result<(T, bool), CallError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S: FnOnce(&T) -> Result<Response, serde_json::Error>,
    {
        let (result, lost, _) = self.runner.hold(held, body).await;
        let response = match &result {
            Ok(value) => match stored(value) {
                Ok(response) => Some(response),
                Err(error) => {
                    self.runner.settle(held, &Settle::Release).await;
                    let refused = format!("the value does not serialize: {}", error);
                    return Err(Error::Protocol(refused).into());
                }
            },
            Err(_) => None,
        };
        let settle = match (&response, policy) {
            (None, _) => Settle::failed(policy),
            (Some(_), Policy::Once | Policy::CommitOnSuccess) => Settle::MarkDone(200),
            (Some(response), Policy::Remember) => Settle::Store(response),
        };
        let settled = self.runner.settle(held, &settle).await;
        // A failed release keeps the key until its lease runs out: the body's result
        // stands. A failed completion leaves the key unsettled: not fenced.
        let release = matches!(settle, Settle::Release);
        let fenced = settled.unwrap_or(release) && !lost;
        match result {
            Ok(value) => Ok((value, fenced)),
            Err(error) => Err(CallError::Body { error, lease_lost: !fenced }),
        }
    }
}

/// An outcome these calls cannot meet unless the key was used by another kind of call
/// (a `LeaseRunner` or the transactional protocol, with another fingerprint).
fn unexpected(outcome: Outcome) -> Error {
    Error::Protocol(format!(
        "the key is used by another kind of call (acquire answered {:?})",
        outcome
    ))
}
