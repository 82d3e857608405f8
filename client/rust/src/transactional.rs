//! The transactional protocol: the key row and the application's writes commit together.
//!
//! Two levels: `Client::begin` / `Client::complete` inside the caller's own
//! `tokio_postgres::Transaction`, and `Client::handle`, which owns the transaction on a
//! `Connection`, runs a handler in it and maps every outcome to HTTP. The fingerprint
//! is computed by the server (`idempotency.fingerprint`) inside the `begin` statement.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client as PgClient, Row, Statement, Transaction};

use crate::common::{body_invalid, key_refused, millis, FinalStatuses, Request};
use crate::error::{BoxError, Error};
use crate::http::{
    answer_response, kept_headers_json, problem_response, valid_key, DuplicateMode, Outcome,
    Problem, Response, DEFAULT_KEPT_HEADERS, DEFAULT_RETRY_AFTER_SECONDS, PROBLEM_TYPE_BASE,
};

// http_answer answers every outcome but "started" (CASE: no call then), in the one
// form Citus delegates: SELECT ... FROM f(...), nothing else in FROM or WHERE.
pub(crate) const BEGIN_SQL: &str = "SELECT o.outcome, o.resource_id, \
     floor(extract(epoch FROM o.expires_at))::bigint, \
     CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).status END, \
     CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).headers::text END, \
     CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).body END \
     FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7), \
     $8::int8 * interval '1 millisecond', $9::int8 * interval '1 millisecond') AS o";
pub(crate) const COMPLETE_SQL: &str = "SELECT idempotency.complete($1, $2, status => $3::int4, \
     body => $4::bytea, headers => $5::text::jsonb, resource_id => $6::text, \
     one_time_secret => $7::boolean)";
pub(crate) const SAVE_FINAL_SQL: &str = "SELECT idempotency.save_final($1, $2, $3, \
     idempotency.fingerprint($4, $5, $6, $7), status => $8::int4, body => $9::bytea, \
     headers => $10::text::jsonb, ttl => $11::int8 * interval '1 millisecond', \
     one_time_secret => $12::boolean)";
/// The stored row's expiry after save_final (which starts the ttl at its own now()).
const STORED_EXPIRY_SQL: &str = "SELECT floor(extract(epoch FROM expires_at))::bigint \
     FROM idempotency.lookup($1, $2)";
const FINGERPRINT_SQL: &str = "SELECT idempotency.fingerprint($1, $2, $3, $4)";

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
    statements: Option<Statements>,
}

struct Statements {
    begin: Statement,
    complete: Statement,
    save_final: Statement,
    stored_expiry: Statement,
}

impl Connection {
    /// Wraps a connected client; the statements are prepared on the first keyed request.
    pub fn new(client: PgClient) -> Self {
        Connection { client, statements: None }
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

/// The parameters of begin that are not the request's.
struct BeginParams {
    key: String,
    action: String,
    exclude: Option<Vec<String>>,
    ttl: Option<i64>,
    wait: Option<i64>,
    retry_after: i32,
}

fn begin_params<'a>(
    request: &'a Request,
    params: &'a BeginParams,
    type_base: &'a String,
) -> [&'a (dyn ToSql + Sync); 11] {
    [
        &request.principal,
        &params.key,
        &params.action,
        &request.method,
        &request.path,
        &request.body,
        &params.exclude,
        &params.ttl,
        &params.wait,
        type_base,
        &params.retry_after,
    ]
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
        self.final_statuses.load(client).await?;
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
        Ok(self.begin_with(tx, BEGIN_SQL, request).await?.0)
    }

    /// Like `begin`, with the key row's expiry (seconds since the epoch) when begin
    /// returned one (`Started`: the new row's; see `http::http_date`).
    pub async fn begin_expiring(
        &self,
        tx: &Transaction<'_>,
        request: &Request,
    ) -> Result<(Begun, Option<i64>), Error> {
        self.begin_with(tx, BEGIN_SQL, request).await
    }

    /// begin's wait in milliseconds: 0 in reject mode (409 at once), else `wait`.
    pub(crate) fn wait_millis(&self, request: &Request) -> Option<i64> {
        match request.duplicates.unwrap_or(self.options.duplicates) {
            DuplicateMode::Reject => Some(0),
            DuplicateMode::Wait => millis(self.options.wait),
        }
    }

    async fn begin_with<T>(
        &self,
        tx: &Transaction<'_>,
        sql: &T,
        request: &Request,
    ) -> Result<(Begun, Option<i64>), Error>
    where
        T: ?Sized + tokio_postgres::ToStatement,
    {
        if let Some(answer) = self.check_key(request) {
            return Ok((Begun::Rejected(answer), None));
        }
        let params = BeginParams {
            key: request.key.clone().unwrap_or_default(),
            action: request.action_name(),
            exclude: request.exclude_param(),
            ttl: millis(self.options.ttl),
            wait: self.wait_millis(request),
            retry_after: self.options.retry_after.max(1) as i32,
        };
        let params = begin_params(request, &params, &self.options.problem_type_base);
        let row = tx.query_one(sql, &params).await.map_err(Error::from);
        let row = match row {
            Ok(row) => row,
            Err(error) if key_refused(&error) => {
                let detail = "The Idempotency-Key was refused by the server.";
                return Ok((Begun::Rejected(self.problem(Problem::KEY_MALFORMED, detail)), None));
            }
            Err(error) if body_invalid(&error) => {
                let detail = match &error {
                    Error::Db(e) => {
                        e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().into())
                    }
                    other => other.to_string(),
                };
                return Ok((Begun::Rejected(self.problem(Problem::BODY_INVALID, &detail)), None));
            }
            Err(error) => return Err(error),
        };
        self.outcome_of(&row)
    }

    /// The outcome of a row of begin (or begin_batch, same first six columns): Started,
    /// or the server's answer (replay, 409, 422, 410, with `Idempotency-Expires`).
    fn outcome_of(&self, row: &Row) -> Result<(Begun, Option<i64>), Error> {
        let name: String = row.get(0);
        let outcome = Outcome::parse(&name).ok_or_else(|| {
            Error::Protocol(format!("begin returned an unknown outcome: {}", name))
        })?;
        let expires: Option<i64> = row.get(2);
        if outcome == Outcome::Started {
            return Ok((Begun::Started, expires));
        }
        let response = answer_response(row.get(3), row.get(4), row.get(5), row.get(1));
        Ok((Begun::Answer(outcome, response), expires))
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
        self.complete_with(tx, COMPLETE_SQL, request, response).await
    }

    async fn complete_with<T>(
        &self,
        tx: &Transaction<'_>,
        sql: &T,
        request: &Request,
        response: &Response,
    ) -> Result<(), Error>
    where
        T: ?Sized + tokio_postgres::ToStatement,
    {
        let key = request.key.clone().unwrap_or_default();
        let headers = kept_headers_json(response, &self.options.kept_headers);
        let status = i32::from(response.status);
        let params: [&(dyn ToSql + Sync); 7] = [
            &request.principal,
            &key,
            &status,
            &response.body,
            &headers,
            &response.resource_id,
            &response.one_time_secret,
        ];
        tx.query_one(sql, &params).await?;
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
        let none: Option<&str> = None;
        Ok(self.save_final_with(client, SAVE_FINAL_SQL, none, request, response).await?.0)
    }

    /// save_final with `save`; with `expiry` (STORED_EXPIRY_SQL, prepared) the stored
    /// row's expiry is read in the same round trip: (saved, expires_epoch).
    async fn save_final_with<T>(
        &self,
        client: &PgClient,
        save: &T,
        expiry: Option<&T>,
        request: &Request,
        response: &Response,
    ) -> Result<(bool, Option<i64>), Error>
    where
        T: ?Sized + tokio_postgres::ToStatement,
    {
        let key = request.key.clone().unwrap_or_default();
        let (action, exclude) = (request.action_name(), request.exclude_param());
        let secret = response.one_time_secret;
        // A one-time secret is sent without its body and headers.
        let body: &[u8] = if secret { b"" } else { &response.body };
        let headers = (!secret).then(|| kept_headers_json(response, &self.options.kept_headers));
        let (status, ttl) = (i32::from(response.status), millis(self.options.ttl));
        let params: [&(dyn ToSql + Sync); 12] = [
            &request.principal,
            &key,
            &action,
            &request.method,
            &request.path,
            &request.body,
            &exclude,
            &status,
            &body,
            &headers,
            &ttl,
            &secret,
        ];
        let saved = client.query_one(save, &params);
        let expiry = match expiry {
            None => return Ok((saved.await?.get(0), None)),
            Some(expiry) => expiry,
        };
        // Sent together, in this order: join! polls its futures in order the first
        // time, and a prepared statement goes out on its future's first poll.
        let key_params: [&(dyn ToSql + Sync); 2] = [&request.principal, &key];
        let (saved, stored) = tokio::join!(saved, client.query_opt(expiry, &key_params));
        let saved: bool = saved?.get(0);
        Ok((saved, stored?.and_then(|row| row.get::<_, Option<i64>>(0))))
    }
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
