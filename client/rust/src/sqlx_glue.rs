//! sqlx (feature `sqlx`): the transactional protocol on a `sqlx::Transaction<'_, Postgres>`
//! and the lease policies over a `PgPool`. The statements are the tokio-postgres path's.
//!
//! TLS is sqlx's own (rustls): set it on the `PgConnectOptions` of the pool
//! (`.ssl_mode(PgSslMode::VerifyFull).ssl_root_cert(path)`).
//!
//! ```no_run
//! # async fn doc(pool: sqlx::PgPool) -> Result<(), pg_idempotency::Error> {
//! use pg_idempotency::{Begun, Client, Request, Response};
//!
//! let client = Client::default();
//! let request = Request::new("tenant-42", Some("k-1".into()), "POST", "/orders", None);
//! let mut tx = pool.begin().await?;
//! match client.begin_sqlx(&mut tx, &request).await? {
//!     Begun::Started => {
//!         sqlx::query("INSERT INTO orders (item) VALUES ('book')").execute(&mut *tx).await?;
//!         let created = Response::new(201, vec![], "{\"id\":1}");
//!         client.complete_sqlx(&mut tx, &request, &created).await?;
//!         tx.commit().await?;
//!     }
//!     Begun::Answer(_, answer) | Begun::Rejected(answer) => {
//!         tx.rollback().await?; // answer: a replay, 409, 422, 410 or 400
//!         let _ = answer;
//!     }
//! }
//! # Ok(()) }
//! ```

use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};

use crate::calls::Idempotency;
use crate::common::{millis, Request};
use crate::error::Error;
use crate::http::{answer_response, kept_headers_json, Outcome, Problem, Response};
use crate::lease::store::Store;
use crate::lease::{renew, LeaseOptions, LeaseRunner};
use crate::transactional::{Begun, Client, BEGIN_SQL, COMPLETE_SQL, SAVE_FINAL_SQL};

/// The SQLSTATE of a sqlx database error.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error.as_database_error().and_then(|db| db.code()).map(|code| code.into_owned())
}

/// The renewal pool beside `pool`: the same connect options, `application_name` + `-renew`,
/// at most `renew_pool_size` connections, opened lazily by the renewal runtime.
fn store(pool: PgPool, options: &LeaseOptions) -> Result<Store, Error> {
    if options.lease.is_zero() {
        return Err(Error::Protocol("lease must be positive".into()));
    }
    renew::runtime()?;
    let name = format!("{}-renew", options.application_name);
    let connect = (*pool.connect_options()).clone().application_name(&name);
    let renew = PgPoolOptions::new()
        .max_connections(options.renew_pool_size.max(1) as u32)
        .acquire_timeout(renew::period(options.lease))
        .connect_lazy_with(connect);
    Ok(Store::Sqlx { pool, renew })
}

impl LeaseRunner {
    /// A runner over a sqlx pool (its size is the pool's own; `tls`, `pool_size` and
    /// `pool_wait` of `options` are not used) and a renewal pool beside it.
    pub fn from_sqlx(pool: PgPool, options: LeaseOptions) -> Result<Self, Error> {
        let store = store(pool, &options)?;
        Ok(LeaseRunner::with_store(store, options))
    }
}

impl Idempotency {
    /// The framework-shaped calls over a sqlx pool (see `LeaseRunner::from_sqlx`).
    pub fn from_sqlx(pool: PgPool, options: LeaseOptions) -> Result<Self, Error> {
        Ok(Idempotency::with_runner(LeaseRunner::from_sqlx(pool, options)?))
    }
}

impl Client {
    /// `Client::begin` on a sqlx transaction: claims the request's key in `tx`. On
    /// `Started` do the work in `tx`, then `complete_sqlx` before committing; otherwise
    /// send the answer (the transaction holds nothing; after a refused key it is
    /// aborted: roll it back).
    pub async fn begin_sqlx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        request: &Request,
    ) -> Result<Begun, Error> {
        if let Some(answer) = self.check_key(request) {
            return Ok(Begun::Rejected(answer));
        }
        let options = self.options();
        let row = sqlx::query(BEGIN_SQL)
            .bind(&request.principal)
            .bind(request.key.as_deref())
            .bind(request.action_name())
            .bind(&request.method)
            .bind(&request.path)
            .bind(request.body.as_deref())
            .bind(request.exclude_param())
            .bind(millis(options.ttl))
            .bind(self.wait_millis(request))
            .bind(&options.problem_type_base)
            .bind(options.retry_after.max(1) as i32)
            .fetch_one(&mut **tx)
            .await;
        let row = match row {
            Ok(row) => row,
            Err(error) => return self.refused(error).map(Begun::Rejected),
        };
        begun(&row)
    }

    /// A refused key (22P02) or a body that cannot be fingerprinted (54000, 54001) as the
    /// 400 to answer; any other error as it is.
    fn refused(&self, error: sqlx::Error) -> Result<Response, Error> {
        match sqlstate(&error).as_deref() {
            Some("22P02") => {
                let detail = "The Idempotency-Key was refused by the server.";
                Ok(self.problem(Problem::KEY_MALFORMED, detail))
            }
            Some("54000" | "54001") => {
                let detail =
                    error.as_database_error().map_or(String::new(), |d| d.message().into());
                Ok(self.problem(Problem::BODY_INVALID, &detail))
            }
            _ => Err(error.into()),
        }
    }

    /// `Client::complete` on a sqlx transaction: stores the final response of a key that
    /// `begin_sqlx` started in `tx`; commit `tx` afterwards.
    pub async fn complete_sqlx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        request: &Request,
        response: &Response,
    ) -> Result<(), Error> {
        sqlx::query(COMPLETE_SQL)
            .bind(&request.principal)
            .bind(request.key.as_deref())
            .bind(i32::from(response.status))
            .bind(&response.body)
            .bind(kept_headers_json(response, &self.options().kept_headers))
            .bind(&response.resource_id)
            .bind(response.one_time_secret)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// `Client::save_final` on a sqlx pool: stores a final error response in a short
    /// transaction of its own, after the attempt was rolled back.
    pub async fn save_final_sqlx(
        &self,
        pool: &PgPool,
        request: &Request,
        response: &Response,
    ) -> Result<bool, Error> {
        let secret = response.one_time_secret;
        let body: &[u8] = if secret { b"" } else { &response.body };
        let headers = (!secret).then(|| kept_headers_json(response, &self.options().kept_headers));
        let saved = sqlx::query_scalar(SAVE_FINAL_SQL)
            .bind(&request.principal)
            .bind(request.key.as_deref())
            .bind(request.action_name())
            .bind(&request.method)
            .bind(&request.path)
            .bind(request.body.as_deref())
            .bind(request.exclude_param())
            .bind(i32::from(response.status))
            .bind(body)
            .bind(headers)
            .bind(millis(self.options().ttl))
            .bind(secret)
            .fetch_one(pool)
            .await?;
        Ok(saved)
    }
}

/// A row of begin's statement as `Begun`.
fn begun(row: &PgRow) -> Result<Begun, Error> {
    let name: String = row.try_get(0)?;
    let outcome = Outcome::parse(&name)
        .ok_or_else(|| Error::Protocol(format!("begin returned an unknown outcome: {}", name)))?;
    if outcome == Outcome::Started {
        return Ok(Begun::Started);
    }
    let status: i32 = row.try_get(3)?;
    let response = answer_response(status, row.try_get(4)?, row.try_get(5)?, row.try_get(1)?);
    Ok(Begun::Answer(outcome, response))
}
