//! The lease protocol: an effect outside the database (an upstream HTTP call, a
//! payment provider, a broker) under one of three policies.
//!
//! The key is held by a lease that a tokio task renews at a third of its length
//! (at least every 50 ms) on a connection of its own while the body runs; every
//! statement that settles the key is fenced. Dropping the future of `run` (a
//! cancelled body) keeps the key: renewing stops and nothing is released, so
//! retries get 409 until the lease runs out (fail closed).

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::{Client as PgClient, Config, NoTls, Row};

use crate::common::{key_refused, millis, BoxError, Error, FinalStatuses, Request};
use crate::http::{
    kept_headers_json, outcome_problem, problem_response, stored_response, valid_key,
    DuplicateMode, Outcome, Problem, Response, DEFAULT_DUPLICATE_MODE, DEFAULT_KEPT_HEADERS,
    PROBLEM_TYPE_BASE,
};

mod renew;

use renew::Renewer;

const ACQUIRE_SQL: &str = "SELECT outcome, fence, response_status, \
     response_headers::text AS response_headers, response_body, resource_id, \
     ceil(extract(epoch FROM lease_until - pg_catalog.clock_timestamp()))::integer, \
     floor(extract(epoch FROM expires_at))::int8 \
     FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7), \
     $8::int8 * interval '1 millisecond', $9::int8 * interval '1 millisecond', \
     $10::int8 * interval '1 millisecond')";
const RENEW_SQL: &str = "SELECT idempotency.renew($1, $2, $3, $4::int8 * interval '1 millisecond')";
const MARK_DONE_SQL: &str =
    "SELECT idempotency.complete($1, $2, fence => $3::int8, status => $4::int4)";
const REMEMBER_SQL: &str = "SELECT idempotency.complete($1, $2, fence => $3::int8, \
     status => $4::int4, body => $5::bytea, headers => $6::text::jsonb, resource_id => $7::text, \
     one_time_secret => $8::boolean)";
const RELEASE_SQL: &str = "SELECT idempotency.release($1, $2, $3::int8)";
// The settled row's expiry, read only when the key was completed after acquire's
// expires_at had passed (complete then keeps it one more ttl from its own now()).
const STORED_EXPIRY_SQL: &str =
    "SELECT floor(extract(epoch FROM expires_at))::int8 FROM idempotency.lookup($1, $2)";

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
    /// The body ran, but the lease was lost meanwhile: nothing was stored.
    FreshUnfenced,
    /// Missing or malformed key: 400.
    Rejected,
    /// The key expired under an on_expiry 'refuse' policy (a tombstone): 410, the body
    /// did not run.
    Expired,
}

/// Settings of a `LeaseRunner`.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// What happens to the key after the body (default remember).
    pub policy: Policy,
    /// Lease length, 100 ms to 24 h; renewed every third of it, at least every 50 ms.
    pub lease: Duration,
    /// Renew from a tokio task on its own connection while the body runs.
    pub renew: bool,
    /// Consecutive renewal errors after which renewing stops (an error is not a lost lease).
    pub max_renew_failures: u32,
    /// Key lifetime; None: the server's idempotency.key_ttl.
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
    /// Longest key accepted before asking the server.
    pub max_key_length: usize,
    /// `application_name` of the runner's connections (renewal: this + `-renew`), so
    /// that an operator sees them in pg_stat_activity.
    pub application_name: String,
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
            duplicates: DEFAULT_DUPLICATE_MODE,
            kept_headers: DEFAULT_KEPT_HEADERS.iter().map(|h| h.to_string()).collect(),
            final_statuses: None,
            problem_type_base: PROBLEM_TYPE_BASE.to_string(),
            max_key_length: 255,
            application_name: RUNNER_APPLICATION_NAME.to_string(),
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
    config: Config,
    options: LeaseOptions,
    idle: Mutex<Vec<PgClient>>,
    final_statuses: FinalStatuses,
}

pub(crate) async fn connect(config: &Config, application_name: &str) -> Result<PgClient, Error> {
    let mut config = config.clone();
    config.application_name(application_name);
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The connection was lost before the statement could run: closed, an I/O error, or
/// the server ended the session (class 57P: terminated, shutting down; class 08).
fn connection_error(error: &Error) -> bool {
    match error {
        Error::Db(e) => {
            e.is_closed()
                || e.code().map_or(e.as_db_error().is_none(), |c| {
                    c.code().starts_with("57P") || c.code().starts_with("08")
                })
        }
        _ => false,
    }
}

impl LeaseRunner {
    /// A runner that connects with `config` (its own autocommit connections, and one
    /// per run for renewal). Refuses a lease of zero.
    pub fn new(config: Config, options: LeaseOptions) -> Result<Self, Error> {
        if options.lease.is_zero() {
            return Err(Error::Protocol("lease must be positive".into()));
        }
        let final_statuses = FinalStatuses::new(options.final_statuses.as_deref());
        Ok(LeaseRunner { config, options, idle: Mutex::new(Vec::new()), final_statuses })
    }

    /// The runner's options.
    pub fn options(&self) -> &LeaseOptions {
        &self.options
    }

    fn problem(&self, problem: Problem, detail: &str) -> Response {
        problem_response(problem, detail, &self.options.problem_type_base)
    }

    async fn take(&self) -> Result<PgClient, Error> {
        let idle = self.idle.lock().expect("pool lock").pop();
        match idle {
            Some(client) if !client.is_closed() => Ok(client),
            _ => connect(&self.config, &self.options.application_name).await,
        }
    }

    /// Returns a connection to the pool unless it is closed or `failed` says the
    /// session is gone (its connection task may not have noticed yet).
    fn give_back(&self, client: PgClient, failed: bool) {
        if !failed && !client.is_closed() {
            self.idle.lock().expect("pool lock").push(client);
        }
    }

    /// Acquires the key, runs `body` while a task renews the lease, and settles the key
    /// by the policy. The body's error comes back as `Error::Body` after the key was
    /// settled (once: marked done; the others: released). If this future is dropped
    /// while the body runs, the key stays held until its lease runs out.
    pub async fn run<F, Fut, E>(&self, request: &Request, body: F) -> Result<LeaseResult, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response, E>>,
        E: Into<BoxError>,
    {
        let key = match request.key.as_deref() {
            Some(k) if valid_key(k, self.options.max_key_length) => k,
            other => {
                let problem =
                    if other.is_some() { Problem::KeyMalformed } else { Problem::KeyMissing };
                let detail = format!(
                    "An Idempotency-Key of 1 to {} visible ASCII characters is required.",
                    self.options.max_key_length
                );
                return Ok(LeaseResult::answer(
                    LeaseOutcome::Rejected,
                    self.problem(problem, &detail),
                ));
            }
        };
        let row = self.acquire(request, key).await;
        let row = match row {
            Ok(row) => row,
            Err(error) if key_refused(&error) => {
                let detail = "The Idempotency-Key was refused by the server.";
                let response = self.problem(Problem::KeyMalformed, detail);
                return Ok(LeaseResult::answer(LeaseOutcome::Rejected, response));
            }
            Err(error) => return Err(error),
        };
        let name: String = row.get(0);
        let outcome = Outcome::parse(&name).ok_or_else(|| {
            Error::Protocol(format!("acquire returned an unknown outcome: {}", name))
        })?;
        let acquired: Option<i64> = row.get(7);
        if outcome != Outcome::Started {
            return Ok(self.answer(outcome, &row).expiring(acquired));
        }
        let fence: i64 = row.get(1);
        let held = Held { principal: request.principal.clone(), key: key.to_string(), fence };

        // Run the body (never cancelled by this crate) while a task renews the lease.
        let renewer =
            self.options.renew.then(|| Renewer::start(&self.config, &held, &self.options));
        let result = body().await.map_err(Into::into);
        let (lost, renewals) = match renewer {
            Some(renewer) => renewer.stop().await,
            None => (false, 0),
        };
        let settled = self.settle(&held, &result).await?;
        match result {
            Err(error) => Err(Error::Body(error)),
            Ok(response) => {
                let outcome = if settled && !lost {
                    LeaseOutcome::Fresh
                } else {
                    LeaseOutcome::FreshUnfenced
                };
                let kept = settled && self.keeps_row(response.status);
                let expires = if kept { self.settled_expiry(&held, acquired).await? } else { None };
                let result =
                    LeaseResult { outcome, response, fence, renewals, expires_epoch: None };
                Ok(result.expiring(expires))
            }
        }
    }

    /// True when settling a successful body of this status leaves a key row (marked
    /// done or stored), false when it releases the key.
    fn keeps_row(&self, status: u16) -> bool {
        match self.options.policy {
            Policy::Once => true,
            Policy::CommitOnSuccess => status < 400,
            Policy::Remember => self.final_statuses.is_final(status),
        }
    }

    /// The settled row's expiry: acquire's while it is still ahead, read again after a
    /// completion past it (complete keeps the key one more ttl from its own now()).
    async fn settled_expiry(
        &self,
        held: &Held,
        acquired: Option<i64>,
    ) -> Result<Option<i64>, Error> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        match acquired {
            Some(epoch) if epoch > now => Ok(Some(epoch)),
            None => Ok(None),
            Some(_) => {
                let client = self.take().await?;
                let rows = client.query(STORED_EXPIRY_SQL, &[&held.principal, &held.key]).await;
                self.give_back(client, rows.is_err());
                Ok(rows?.first().and_then(|row| row.get(0)))
            }
        }
    }

    /// Acquires the key on a pooled connection; a connection that turns out to be gone
    /// before the statement ran is replaced once.
    async fn acquire(&self, request: &Request, key: &str) -> Result<Row, Error> {
        let mut attempt = 0;
        loop {
            let client = self.take().await?;
            let row = self.acquire_once(&client, request, key).await;
            self.give_back(client, matches!(&row, Err(e) if connection_error(e)));
            match row {
                Err(error) if connection_error(&error) && attempt == 0 => attempt += 1,
                other => return other,
            }
        }
    }

    async fn acquire_once(
        &self,
        client: &PgClient,
        request: &Request,
        key: &str,
    ) -> Result<Row, Error> {
        if self.options.policy == Policy::Remember {
            self.final_statuses.load(client).await?; // known before holding anything
        }
        let options = &self.options;
        let row = client
            .query_one(
                ACQUIRE_SQL,
                &[
                    &request.principal,
                    &key,
                    &request.action_name(),
                    &request.method,
                    &request.path,
                    &request.body,
                    &request.exclude_param(),
                    &millis(Some(options.lease)),
                    &millis(options.ttl),
                    &self.wait_millis(request),
                ],
            )
            .await?;
        Ok(row)
    }

    /// acquire's wait in milliseconds: 0 in reject mode (409 at once), else `wait`.
    pub(crate) fn wait_millis(&self, request: &Request) -> Option<i64> {
        match request.duplicates.unwrap_or(self.options.duplicates) {
            DuplicateMode::Reject => Some(0),
            DuplicateMode::Wait => millis(self.options.wait),
        }
    }

    /// The answer for an outcome other than started.
    fn answer(&self, outcome: Outcome, row: &Row) -> LeaseResult {
        let base = &self.options.problem_type_base;
        let done_before = matches!(outcome, Outcome::Replay | Outcome::SecretReplay);
        if done_before && self.options.policy != Policy::Remember {
            let detail = "A request with this Idempotency-Key was already processed; \
                          its result is not kept.";
            let response = self.problem(Problem::AlreadyProcessed, detail);
            return LeaseResult::answer(LeaseOutcome::Duplicate, response);
        }
        if outcome == Outcome::Replay {
            let status: i32 = row.get(2);
            let headers: Option<String> = row.get(3);
            let response =
                stored_response(status as u16, headers.as_deref(), row.get(4), row.get(5));
            return LeaseResult::answer(LeaseOutcome::Replayed, response);
        }
        let lease_seconds: Option<i32> = row.get(6);
        let retry_after = lease_seconds.map_or(1, |s| s.max(1) as u32);
        let response = outcome_problem(outcome, base, retry_after).expect("a problem outcome");
        let kind = match outcome {
            Outcome::Mismatch => LeaseOutcome::Mismatch,
            Outcome::InProgress => LeaseOutcome::InProgress,
            Outcome::Expired => LeaseOutcome::Expired,
            _ => LeaseOutcome::Replayed,
        };
        LeaseResult::answer(kind, response)
    }

    /// Settles the key by the policy with its fence: true when the fence still held
    /// it. A lost connection is retried once on a fresh one; if that fails too, the
    /// error propagates and the key stays held until its lease runs out.
    async fn settle(
        &self,
        held: &Held,
        result: &Result<Response, BoxError>,
    ) -> Result<bool, Error> {
        let mut attempt = 0;
        loop {
            let client = self.take().await?;
            let settled = self.settle_once(&client, held, result).await;
            self.give_back(client, matches!(&settled, Err(e) if connection_error(e)));
            match settled {
                Err(error) if connection_error(&error) && attempt == 0 => attempt += 1,
                other => return other,
            }
        }
    }

    async fn settle_once(
        &self,
        client: &PgClient,
        held: &Held,
        result: &Result<Response, BoxError>,
    ) -> Result<bool, Error> {
        let (principal, key, fence) = (&held.principal, &held.key, &held.fence);
        let release = || async {
            let row = client.query_one(RELEASE_SQL, &[principal, key, fence]).await?;
            Ok::<bool, Error>(row.get(0))
        };
        let mark_done = |status: i32| async move {
            let row = client.query_one(MARK_DONE_SQL, &[principal, key, fence, &status]).await?;
            Ok::<bool, Error>(row.get(0))
        };
        let response = match (result, self.options.policy) {
            (Err(_), Policy::Once) => return mark_done(500).await,
            (Err(_), _) => return release().await,
            (Ok(response), _) => response,
        };
        let status = i32::from(response.status);
        match self.options.policy {
            Policy::Once => mark_done(status).await,
            Policy::CommitOnSuccess if status < 400 => mark_done(status).await,
            Policy::CommitOnSuccess => release().await,
            Policy::Remember if self.final_statuses.is_final(response.status) => {
                let headers = kept_headers_json(response, &self.options.kept_headers);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
                    principal,
                    key,
                    fence,
                    &status,
                    &response.body,
                    &headers,
                    &response.resource_id,
                    &response.one_time_secret,
                ];
                Ok(client.query_one(REMEMBER_SQL, &params).await?.get(0))
            }
            Policy::Remember => release().await,
        }
    }
}

/// The key a run holds.
pub(crate) struct Held {
    pub(crate) principal: String,
    pub(crate) key: String,
    pub(crate) fence: i64,
}
