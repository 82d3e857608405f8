//! The lease protocol: an effect outside the database (an upstream HTTP call, a
//! payment provider, a broker) under one of three policies.
//!
//! The key is held by a lease that a task renews at a third of its length (at least
//! every 50 ms) while the body runs; every statement that settles the key is fenced.
//! The renewal tasks run on a runtime of their own (one thread for the process) with a
//! small pool of their own, so a body that blocks its thread (even on a current-thread
//! runtime) cannot starve them. Dropping the future of `run` (a cancelled body) keeps
//! the key: renewing stops and nothing is released, so retries get 409 until the lease
//! runs out (fail closed). A settling statement that fails is logged (`tracing`, the
//! key's SHA-256, never the key) and never returned: the caller gets the body's result.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Config;

use crate::common::{key_refused, millis, FinalStatuses, Request};
use crate::connect::Tls;
use crate::db::Param;
use crate::error::{BoxError, Error};
use crate::http::{
    problem_response, valid_key, DuplicateMode, Outcome, Problem, Response, DEFAULT_KEPT_HEADERS,
    DEFAULT_RETRY_AFTER_SECONDS, PROBLEM_TYPE_BASE,
};

pub(crate) mod renew;
mod settle;
pub(crate) mod store;

use renew::Renewer;
pub(crate) use settle::Settle;
pub(crate) use store::{AcquireRow, Store};

/// The detail of a duplicate under a policy that keeps no result.
const ALREADY_PROCESSED_DETAIL: &str =
    "A request with this Idempotency-Key was already processed; its result is not kept.";

/// The default `application_name` of a runner's connections; its renewal
/// connections add `-renew`.
pub const RUNNER_APPLICATION_NAME: &str = "pg_idempotency";

/// What happens to the key after the effect ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// At most once: marked done whether the body succeeded, failed or returned an error;
    /// later calls are duplicates for the key's ttl.
    Once,
    /// Done on success (status below 400); a failure or an error releases the key.
    CommitOnSuccess,
    /// The final response is stored and replayed; a non-final one or an error releases.
    Remember,
}

/// How a `LeaseRunner::run` call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The body ran under this call and the key was settled with its fence.
    Fresh,
    /// Policy remember: the stored response of an earlier call.
    Replayed,
    /// Another holder's lease is live (or a transaction holds the key): 409.
    InProgress,
    /// Policies once / commit_on_success: an earlier call already did it: 409.
    Duplicate,
    /// The key was used for another request: 422.
    Mismatch,
    /// The body ran, but the key could not be settled with its fence: the lease was lost
    /// meanwhile, renewing gave up (`max_renew_failures`), or the completion failed
    /// (logged). Nothing was stored.
    FreshUnfenced,
    /// Missing or malformed key: 400.
    Rejected,
    /// The key expired under an on_expiry 'refuse' policy (a tombstone): 410, the body
    /// did not run.
    Expired,
}

/// Settings of a `LeaseRunner` (and of an `Idempotency`).
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// What happens to the key after the body (default remember; `LeaseRunner` only).
    pub policy: Policy,
    /// Lease length, 100 ms to 24 h; renewed every third of it, at least every 50 ms.
    pub lease: Duration,
    /// Renew while the body runs (on the renewal runtime, see the module).
    pub renew: bool,
    /// The give-up rule: after this many renewals in a row failed (an error or a
    /// timeout, not a lost fence) renewing stops and the run ends `FreshUnfenced`: the
    /// lease may have run out meanwhile. At least 1.
    pub max_renew_failures: u32,
    /// Key lifetime; None: the server's idempotency.key_ttl (`LeaseRunner` only; the
    /// calls of `Idempotency` take it per call).
    pub ttl: Option<Duration>,
    /// How long acquire waits for a transaction that holds the key; None: server default.
    pub wait: Option<Duration>,
    /// `Wait` (acquire waits up to `wait` for a transaction holding the key) or
    /// `Reject` (acquire with wait 0: 409 at once); a live lease is 409 at once in
    /// both. `Request::duplicates` overrides it per call.
    pub duplicates: DuplicateMode,
    /// Response headers stored and replayed (policy remember).
    pub kept_headers: Vec<String>,
    /// Statuses stored by remember; None: the server's idempotency.final_statuses.
    pub final_statuses: Option<Vec<u16>>,
    /// Prefix of problem `type` URIs.
    pub problem_type_base: String,
    /// Longest key accepted before asking the server (not checked with `hash_keys`).
    pub max_key_length: usize,
    /// Store the SHA-256 of the key (64 hex digits) instead of the key: no raw key
    /// reaches the database and any non-empty key of any length is taken. The principal
    /// is stored as given. Off by default here, on for `Idempotency`.
    pub hash_keys: bool,
    /// `application_name` of the runner's connections (renewal: this + `-renew`), so
    /// that an operator sees them in pg_stat_activity.
    pub application_name: String,
    /// How connections are secured.
    pub tls: Tls,
    /// The most connections of the runner's pool (acquire and settle).
    pub pool_size: usize,
    /// The most connections of the pool the renewals share.
    pub renew_pool_size: usize,
    /// How long a call waits for a pooled connection when all are busy.
    pub pool_wait: Option<Duration>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            policy: Policy::Remember,
            lease: Duration::from_secs(30),
            renew: true,
            max_renew_failures: 3,
            ttl: None,
            wait: None,
            duplicates: DuplicateMode::default(),
            kept_headers: DEFAULT_KEPT_HEADERS.iter().map(|h| h.to_string()).collect(),
            final_statuses: None,
            problem_type_base: PROBLEM_TYPE_BASE.to_string(),
            max_key_length: 255,
            hash_keys: false,
            application_name: RUNNER_APPLICATION_NAME.to_string(),
            tls: Tls::Disabled,
            pool_size: 16,
            renew_pool_size: 2,
            pool_wait: Some(Duration::from_secs(5)),
        }
    }
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct LeaseResult {
    /// How the call ended.
    pub outcome: LeaseOutcome,
    /// What to send: the body's, the stored one, or a problem response.
    pub response: Response,
    /// The fence this call held (0 when it held none).
    pub fence: i64,
    /// Successful renewals while the body ran.
    pub renewals: u32,
    /// When the key stops counting: its row's expires_at in seconds since the epoch (in
    /// the past for `Expired`); None when no row backs the answer (rejected, released).
    /// `response` already carries it as `Idempotency-Expires`.
    pub expires_epoch: Option<i64>,
}

impl LeaseResult {
    fn answer(outcome: LeaseOutcome, response: Response) -> Self {
        LeaseResult { outcome, response, fence: 0, renewals: 0, expires_epoch: None }
    }

    /// Stamps the answer with the key row's expiry.
    fn expiring(mut self, expires_epoch: Option<i64>) -> Self {
        self.response.set_expires(expires_epoch);
        self.expires_epoch = expires_epoch;
        self
    }
}

/// Runs external effects under leases. `Sync`: share one runner between tasks.
pub struct LeaseRunner {
    store: Store,
    options: LeaseOptions,
    final_statuses: FinalStatuses,
}

/// The key a run holds: as stored, its SHA-256 for logs, and the fence.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) principal: String,
    pub(crate) key: String,
    pub(crate) digest: String,
    pub(crate) fence: i64,
}

/// The SHA-256 of a key as 64 lower-case hex digits: what `hash_keys` stores and what
/// the logs name.
pub fn key_digest(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{:02x}", b)).collect()
}

/// What acquire found: the key held, or the outcome and row of an answer.
pub(crate) enum Acquired {
    Held(Held, Option<i64>),
    Answer(Outcome, AcquireRow),
}

impl LeaseRunner {
    /// A runner whose connections (a pool of `pool_size`, and `renew_pool_size` for the
    /// renewals) connect with `config` and `options.tls`. Refuses a lease of zero.
    pub fn new(config: Config, options: LeaseOptions) -> Result<Self, Error> {
        if options.lease.is_zero() {
            return Err(Error::Protocol("lease must be positive".into()));
        }
        renew::runtime()?; // refused here, at start, when the renewal thread cannot start
        let mut main = config.clone();
        main.application_name(&options.application_name);
        let pool = options.tls.pool(main, options.pool_size, options.pool_wait)?;
        let mut renewing = config;
        renewing.application_name(format!("{}-renew", options.application_name));
        let period = renew::period(options.lease);
        let renew = options.tls.pool(renewing, options.renew_pool_size, Some(period))?;
        Ok(LeaseRunner::with_store(Store::Pg { pool, renew }, options))
    }

    /// A runner on these pools (the lease was checked, the renewal runtime started).
    pub(crate) fn with_store(store: Store, options: LeaseOptions) -> Self {
        let final_statuses = FinalStatuses::new(options.final_statuses.as_deref());
        LeaseRunner { store, options, final_statuses }
    }

    /// The runner's options.
    pub fn options(&self) -> &LeaseOptions {
        &self.options
    }

    /// The runner's tokio-postgres pool (bounded by `pool_size`), for the application's
    /// own statements; None for a runner over a sqlx pool.
    pub fn pool(&self) -> Option<&deadpool_postgres::Pool> {
        match &self.store {
            Store::Pg { pool, .. } => Some(pool),
            #[cfg(feature = "sqlx")]
            Store::Sqlx { .. } => None,
        }
    }

    fn problem(&self, problem: Problem, detail: &str) -> Response {
        problem_response(problem, detail, &self.options.problem_type_base)
    }

    /// Acquires the key, runs `body` while the lease is renewed, and settles the key by
    /// the policy. The body's error comes back as `Error::Body` after the key was
    /// settled (once: marked done; the others: released); a settling statement that
    /// fails is logged, not returned. If this future is dropped while the body runs,
    /// the key stays held until its lease runs out.
    pub async fn run<F, Fut, E>(&self, request: &Request, body: F) -> Result<LeaseResult, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response, E>>,
        E: Into<BoxError>,
    {
        let options = &self.options;
        match request.key.as_deref() {
            Some(k) if options.hash_keys && !k.is_empty() => {}
            Some(k) if valid_key(k, options.max_key_length) => {}
            other => {
                let problem =
                    if other.is_some() { Problem::KEY_MALFORMED } else { Problem::KEY_MISSING };
                let detail = format!(
                    "An Idempotency-Key of 1 to {} visible ASCII characters is required.",
                    options.max_key_length
                );
                return Ok(LeaseResult::answer(
                    LeaseOutcome::Rejected,
                    self.problem(problem, &detail),
                ));
            }
        }
        let (held, acquired) = match self.acquire(request, options.policy, options.ttl).await {
            Ok(Acquired::Held(held, expires)) => (held, expires),
            Ok(Acquired::Answer(outcome, row)) => return Ok(self.answer(outcome, &row)),
            Err(error) if key_refused(&error) => {
                let detail = "The Idempotency-Key was refused by the server.";
                let response = self.problem(Problem::KEY_MALFORMED, detail);
                return Ok(LeaseResult::answer(LeaseOutcome::Rejected, response));
            }
            Err(error) => return Err(error),
        };
        let (result, lost, renewals) = self.hold(&held, body).await;
        let result = result.map_err(Into::into);
        let (settled, release) = {
            let settle = match &result {
                Ok(response) => self.settle_for(options.policy, response),
                Err(_) => Settle::failed(options.policy),
            };
            (self.settle(&held, &settle).await, matches!(settle, Settle::Release))
        };
        let response = result.map_err(Error::Body)?;
        // A failed release leaves the key held until its lease runs out: the body's
        // answer stands. A failed completion leaves it unsettled: not fenced.
        let fenced = settled.unwrap_or(release);
        let outcome =
            if fenced && !lost { LeaseOutcome::Fresh } else { LeaseOutcome::FreshUnfenced };
        let kept = settled == Some(true) && !release;
        let expires = if kept { self.settled_expiry(&held, acquired).await } else { None };
        let fence = held.fence;
        let result = LeaseResult { outcome, response, fence, renewals, expires_epoch: None };
        Ok(result.expiring(expires))
    }

    /// What a successful body's response does to the key under `policy`.
    fn settle_for<'r>(&self, policy: Policy, response: &'r Response) -> Settle<'r> {
        match policy {
            Policy::Once => Settle::MarkDone(response.status),
            Policy::CommitOnSuccess if response.status < 400 => Settle::MarkDone(response.status),
            Policy::Remember if self.final_statuses.is_final(response.status) => {
                Settle::Store(response)
            }
            _ => Settle::Release,
        }
    }

    /// Runs `body` while the lease is renewed: (its result, lease lost, renewals).
    pub(crate) async fn hold<F, Fut, R>(&self, held: &Held, body: F) -> (R, bool, u32)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = R>,
    {
        // The body is never cancelled by this crate.
        let renewer = self.options.renew.then(|| Renewer::start(&self.store, held, &self.options));
        let result = body().await;
        let (lost, renewals) = match renewer {
            Some(renewer) => renewer.stop().await,
            None => (false, 0),
        };
        (result, lost, renewals)
    }

    /// The settled row's expiry: acquire's while it is still ahead, read again after a
    /// completion past it (complete keeps the key one more ttl from its own now()).
    async fn settled_expiry(&self, held: &Held, acquired: Option<i64>) -> Option<i64> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        match acquired {
            Some(epoch) if epoch > now => Some(epoch),
            None => None,
            Some(_) => self.store.stored_expiry(held).await,
        }
    }

    /// Acquires the key (a connection found gone before the statement ran is replaced
    /// once); with policy remember the final statuses are known before anything is held.
    pub(crate) async fn acquire(
        &self,
        request: &Request,
        policy: Policy,
        ttl: Option<Duration>,
    ) -> Result<Acquired, Error> {
        if policy == Policy::Remember {
            self.store.load(&self.final_statuses).await?;
        }
        let (options, key, action) = (&self.options, request.key_text(), request.action_name());
        let stored = if options.hash_keys { key_digest(key) } else { key.into() };
        let mut params = request.claim_params(&stored, &action);
        params.extend([
            Param::Int8(millis(Some(options.lease))),
            Param::Int8(millis(ttl)),
            Param::Int8(request.wait_millis(options.duplicates, options.wait)),
            Param::Text(Some(&options.problem_type_base)),
            Param::Int4(DEFAULT_RETRY_AFTER_SECONDS as i32),
        ]);
        let row = self.store.acquire(&params).await?;
        let outcome = Outcome::parse(&row.outcome).ok_or_else(|| {
            Error::Protocol(format!("acquire returned an unknown outcome: {}", row.outcome))
        })?;
        if outcome != Outcome::Started {
            return Ok(Acquired::Answer(outcome, row));
        }
        let fence = row.fence.ok_or_else(|| Error::Protocol("started without a fence".into()))?;
        let digest = if options.hash_keys { stored.clone() } else { key_digest(key) };
        let principal = request.principal.clone();
        let held = Held { principal, key: stored, digest, fence };
        Ok(Acquired::Held(held, row.expires))
    }

    /// The answer for an outcome other than started: the server's, but for a duplicate
    /// under a policy that keeps no result.
    fn answer(&self, outcome: Outcome, row: &AcquireRow) -> LeaseResult {
        let expires = row.expires;
        let done_before = matches!(outcome, Outcome::Replay | Outcome::SecretReplay);
        if done_before && self.options.policy != Policy::Remember {
            let response = self.problem(Problem::ALREADY_PROCESSED, ALREADY_PROCESSED_DETAIL);
            return LeaseResult::answer(LeaseOutcome::Duplicate, response).expiring(expires);
        }
        let response = row.response();
        let kind = match outcome {
            Outcome::Mismatch => LeaseOutcome::Mismatch,
            Outcome::InProgress => LeaseOutcome::InProgress,
            Outcome::Expired => LeaseOutcome::Expired,
            _ => LeaseOutcome::Replayed,
        };
        let mut result = LeaseResult::answer(kind, response);
        result.expires_epoch = expires;
        result
    }
}
