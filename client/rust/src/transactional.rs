//! The transactional protocol: the key row and the application's writes commit together.
//!
//! Two levels: `Client::begin` / `Client::complete` inside the caller's own
//! `tokio_postgres::Transaction`, and `Client::handle`, which owns the transaction on a
//! `Connection`, runs a handler in it and maps every outcome to HTTP. The fingerprint
//! is computed by the server (`idempotency.fingerprint`) inside the `begin` statement.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_postgres::{Client as PgClient, Statement, Transaction};

use crate::common::{answer_of, body_invalid, key_refused, millis, FinalStatuses, Request};
use crate::db::{Db, Param, Values};
use crate::error::{BoxError, Error};
use crate::http::{
    kept_headers_json, problem_response, valid_key, DuplicateMode, Outcome, Problem, Response,
    DEFAULT_KEPT_HEADERS, DEFAULT_RETRY_AFTER_SECONDS, PROBLEM_TYPE_BASE,
};
use crate::statements::{BEGIN_SQL, COMPLETE_SQL, FINGERPRINT_SQL, SAVE_FINAL_SQL};

/// Settings of a `Client`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Methods answered 400 when they come without an Idempotency-Key.
    pub methods_requiring_key: Vec<String>,
    /// Response headers stored with the key and replayed.
    pub kept_headers: Vec<String>,
    /// How long begin waits for a transaction that holds the key; None: server default.
    pub wait: Option<Duration>,
    /// What a duplicate of a running request does: `Wait` (the default) waits for it
    /// (up to `wait`), then replays; `Reject` answers 409 request-in-progress with
    /// Retry-After at once (begin with wait 0). `Request::duplicates` overrides it.
    pub duplicates: DuplicateMode,
    /// Key lifetime; None: idempotency.key_ttl.
    pub ttl: Option<Duration>,
    /// Attempts of `handle` on serialization failures and deadlocks.
    pub max_attempts: u32,
    /// Retry-After (seconds) of a 409 for a key held by a transaction.
    pub retry_after: u32,
    /// Statuses that are stored; None: ask the server once (idempotency.is_final).
    pub final_statuses: Option<Vec<u16>>,
    /// Prefix of problem `type` URIs.
    pub problem_type_base: String,
    /// Longest key accepted before asking the server.
    pub max_key_length: usize,
    /// Longest streamed body kept (bytes, `handle_stream`): a longer stream is still sent
    /// whole, stored without its body, and a retry gets 409 response-not-kept.
    pub max_stream_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            methods_requiring_key: vec!["POST".into(), "PATCH".into()],
            kept_headers: DEFAULT_KEPT_HEADERS.iter().map(|h| h.to_string()).collect(),
            wait: None,
            duplicates: DuplicateMode::default(),
            ttl: None,
            max_attempts: 3,
            retry_after: DEFAULT_RETRY_AFTER_SECONDS,
            final_statuses: None,
            problem_type_base: PROBLEM_TYPE_BASE.to_string(),
            max_key_length: 255,
            max_stream_bytes: crate::http::DEFAULT_MAX_STREAM_BYTES,
        }
    }
}

/// What `Client::begin` found.
#[derive(Debug)]
pub enum Begun {
    /// The key is held by the transaction: run the handler, then `complete`.
    Started,
    /// Do not run the handler; send this (replay, 409, 422). The transaction holds
    /// nothing: commit or roll it back.
    Answer(Outcome, Response),
    /// No, empty or malformed key, or a body that cannot be fingerprinted: send this 400.
    /// The transaction is aborted when the server refused the key: roll it back.
    Rejected(Response),
}

/// A boxed future borrowing the transaction, as handlers return it.
pub type HandlerFuture<'t> = Pin<Box<dyn Future<Output = Result<Response, BoxError>> + Send + 't>>;

/// A tokio-postgres connection with the protocol's statements prepared once
/// (and again after a reconnect: make a new `Connection`). One request at a time.
pub struct Connection {
    client: PgClient,
    /// The protocol's statements, each by its SQL, once prepared.
    prepared: Vec<(&'static str, Statement)>,
}

impl Connection {
    /// Wraps a connected client; the statements are prepared on the first keyed request.
    pub fn new(client: PgClient) -> Self {
        Connection { client, prepared: Vec::new() }
    }

    /// The tokio-postgres client (for work outside `handle`).
    pub fn client(&mut self) -> &mut PgClient {
        &mut self.client
    }

    /// True when the connection is gone (make a new one).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// Runs handlers through the transactional protocol and maps outcomes to HTTP.
/// `Sync`: one per process; connections are per task.
pub struct Client {
    options: Options,
    final_statuses: FinalStatuses,
}

impl Default for Client {
    fn default() -> Self {
        Client::new(Options::default())
    }
}

impl Client {
    /// A client with these options.
    pub fn new(options: Options) -> Self {
        let final_statuses = FinalStatuses::new(options.final_statuses.as_deref());
        Client { options, final_statuses }
    }

    /// The client's options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The answer to a database fault ([`Error::is_database_fault`]): 503
    /// database-unavailable with this client's Retry-After and problem type base.
    pub fn fault_response(&self) -> Response {
        let options = &self.options;
        crate::fault::database_fault_response(options.retry_after, &options.problem_type_base)
    }

    pub(crate) fn problem(&self, problem: Problem, detail: &str) -> Response {
        problem_response(problem, detail, &self.options.problem_type_base)
    }

    /// Whether a response with this status is stored (reads the server's table once).
    pub async fn is_final(&self, client: &PgClient, status: u16) -> Result<bool, Error> {
        self.final_statuses.load(Db::Pg(client, &[])).await?;
        Ok(self.final_statuses.is_final(status))
    }

    /// Checks the key before the database: None when it may go to the server,
    /// or the 400 to answer.
    pub(crate) fn check_key(&self, request: &Request) -> Option<Response> {
        match request.key.as_deref() {
            None => {
                let method = request.method.to_ascii_uppercase();
                let detail = format!("{} requests need an Idempotency-Key header.", method);
                Some(self.problem(Problem::KEY_MISSING, &detail))
            }
            Some(key) if !valid_key(key, self.options.max_key_length) => {
                let detail = format!(
                    "The Idempotency-Key must be 1 to {} visible ASCII characters.",
                    self.options.max_key_length
                );
                Some(self.problem(Problem::KEY_MALFORMED, &detail))
            }
            Some(_) => None,
        }
    }

    /// Claims the request's key inside the caller's transaction (`idempotency.begin`,
    /// the fingerprint computed by the server in the same statement). On `Started`
    /// run the work in `tx`, then call `complete` before committing. Answers carry
    /// `Idempotency-Expires` when there is a key row; in reject mode (`duplicates`)
    /// begin does not wait for a transaction that holds the key.
    pub async fn begin(&self, tx: &Transaction<'_>, request: &Request) -> Result<Begun, Error> {
        Ok(self.begin_on(Db::Pg(tx.client(), &[]), request).await?.0)
    }

    /// Like `begin`, with the key row's expiry (seconds since the epoch) when begin
    /// returned one (`Started`: the new row's; see `http::http_date`).
    pub async fn begin_expiring(
        &self,
        tx: &Transaction<'_>,
        request: &Request,
    ) -> Result<(Begun, Option<i64>), Error> {
        self.begin_on(Db::Pg(tx.client(), &[]), request).await
    }

    /// begin on `db` (the caller's transaction): Rejected for a key or a body the
    /// server refused, else the outcome and the key row's expiry.
    pub(crate) async fn begin_on(
        &self,
        db: Db<'_>,
        request: &Request,
    ) -> Result<(Begun, Option<i64>), Error> {
        if let Some(answer) = self.check_key(request) {
            return Ok((Begun::Rejected(answer), None));
        }
        let (options, action) = (&self.options, request.action_name());
        let mut params = request.claim_params(request.key_text(), &action);
        params.extend([
            Param::Int8(millis(options.ttl)),
            Param::Int8(request.wait_millis(options.duplicates, options.wait)),
            Param::Text(Some(&options.problem_type_base)),
            Param::Int4(options.retry_after.max(1) as i32),
        ]);
        match db.query_one(BEGIN_SQL, &params).await {
            Ok(row) => outcome_of(&row),
            Err(error) if key_refused(&error) => {
                let detail = "The Idempotency-Key was refused by the server.";
                Ok((Begun::Rejected(self.problem(Problem::KEY_MALFORMED, detail)), None))
            }
            Err(error) if body_invalid(&error) => {
                let detail = error.message();
                Ok((Begun::Rejected(self.problem(Problem::BODY_INVALID, &detail)), None))
            }
            Err(error) => Err(error),
        }
    }

    /// Stores the final response of a key that `begin` started in `tx`
    /// (`idempotency.complete`); commit `tx` afterwards. The status must be final
    /// (see `handle` for what to do with error and non-final statuses).
    pub async fn complete(
        &self,
        tx: &Transaction<'_>,
        request: &Request,
        response: &Response,
    ) -> Result<(), Error> {
        self.complete_on(Db::Pg(tx.client(), &[]), request, response).await
    }

    /// complete on `db` (the transaction that began the key).
    pub(crate) async fn complete_on(
        &self,
        db: Db<'_>,
        request: &Request,
        response: &Response,
    ) -> Result<(), Error> {
        let headers = kept_headers_json(response, &self.options.kept_headers);
        let params = [
            Param::Text(Some(&request.principal)),
            Param::Text(Some(request.key_text())),
            Param::Int4(i32::from(response.status)),
            Param::Bytes(Some(&response.body)),
            Param::Text(Some(&headers)),
            Param::Text(response.resource_id.as_deref()),
            Param::Bool(response.one_time_secret),
        ];
        db.query_one(COMPLETE_SQL, &params).await?;
        Ok(())
    }

    /// Stores a final error response in a short transaction of its own (autocommit),
    /// after the attempt was rolled back: a final error has no effect to keep.
    pub async fn save_final(
        &self,
        client: &PgClient,
        request: &Request,
        response: &Response,
    ) -> Result<bool, Error> {
        self.save_final_on(Db::Pg(client, &[]), request, response).await
    }

    /// save_final on `db` (outside any transaction): true when the response was saved.
    pub(crate) async fn save_final_on(
        &self,
        db: Db<'_>,
        request: &Request,
        response: &Response,
    ) -> Result<bool, Error> {
        let action = request.action_name();
        let secret = response.one_time_secret;
        // A one-time secret is sent without its body and headers.
        let body: &[u8] = if secret { b"" } else { &response.body };
        let headers = (!secret).then(|| kept_headers_json(response, &self.options.kept_headers));
        let mut params = request.claim_params(request.key_text(), &action);
        params.extend([
            Param::Int4(i32::from(response.status)),
            Param::Bytes(Some(body)),
            Param::Text(headers.as_deref()),
            Param::Int8(millis(self.options.ttl)),
            Param::Bool(secret),
        ]);
        let row = db.query_one(SAVE_FINAL_SQL, &params).await?;
        Ok(row.flag(0).unwrap_or(false))
    }
}

/// The outcome of a row of begin (or begin_batch, same first six columns): Started, or
/// the server's answer (replay, 409, 422, 410), with the key row's expiry.
pub(crate) fn outcome_of(row: &Values) -> Result<(Begun, Option<i64>), Error> {
    let name = row.text(0).unwrap_or_default();
    let outcome = Outcome::parse(&name)
        .ok_or_else(|| Error::Protocol(format!("begin returned an unknown outcome: {}", name)))?;
    let expires = row.int(2);
    if outcome == Outcome::Started {
        return Ok((Begun::Started, expires));
    }
    Ok((Begun::Answer(outcome, answer_of(row, 1)), expires))
}

/// The 32-byte request fingerprint, computed by the server's `idempotency.fingerprint`
/// exactly as `begin` computes it (one round trip; the protocol never needs this call).
pub async fn fingerprint(
    client: &PgClient,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    exclude: &[String],
) -> Result<Vec<u8>, Error> {
    let exclude = if exclude.is_empty() { None } else { Some(exclude.to_vec()) };
    let row = client.query_one(FINGERPRINT_SQL, &[&method, &path, &body, &exclude]).await?;
    Ok(row.get(0))
}

mod batch;
mod handle;
pub use batch::{BatchCompletion, BatchOutcome};
