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

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::calls::Idempotency;
use crate::common::Request;
use crate::db::Db;
use crate::error::Error;
use crate::http::Response;
use crate::lease::store::Store;
use crate::lease::{renew, LeaseOptions, LeaseRunner};
use crate::transactional::{Begun, Client};

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
        Ok(self.begin_on(Db::Sqlx(tx), request).await?.0)
    }

    /// `Client::complete` on a sqlx transaction: stores the final response of a key that
    /// `begin_sqlx` started in `tx`; commit `tx` afterwards.
    pub async fn complete_sqlx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        request: &Request,
        response: &Response,
    ) -> Result<(), Error> {
        self.complete_on(Db::Sqlx(tx), request, response).await
    }

    /// `Client::save_final` on a sqlx pool: stores a final error response in a short
    /// transaction of its own, after the attempt was rolled back.
    pub async fn save_final_sqlx(
        &self,
        pool: &PgPool,
        request: &Request,
        response: &Response,
    ) -> Result<bool, Error> {
        self.save_final_on(Db::SqlxPool(pool), request, response).await
    }
}
