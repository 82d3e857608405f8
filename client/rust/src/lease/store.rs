//! Where the lease statements run: a deadpool of tokio-postgres connections, or (feature
//! `sqlx`) a sqlx `PgPool`; each beside a small pool of its own for the renewals, whose
//! connections the renewal runtime opens and drives.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{Call, Held, Settle};
use crate::common::FinalStatuses;
use crate::connect::pooled;
use crate::error::Error;
use crate::http::{kept_headers_json, Response};

// The answer of an outcome that does not run the body comes in the same statement
// (idempotency.http_answer; CASE: no call for started), in the form Citus delegates.
pub(crate) const ACQUIRE_SQL: &str = "SELECT o.outcome, o.fence, \
     floor(extract(epoch FROM o.expires_at))::int8, CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).status END, \
     CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).headers::text END, \
     CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).body END, o.resource_id \
     FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7), \
     $8::int8 * interval '1 millisecond', $9::int8 * interval '1 millisecond', \
     $10::int8 * interval '1 millisecond') AS o";
pub(crate) const RENEW_SQL: &str =
    "SELECT idempotency.renew($1, $2, $3, $4::int8 * interval '1 millisecond')";
pub(crate) const MARK_DONE_SQL: &str =
    "SELECT idempotency.complete($1, $2, fence => $3::int8, status => $4::int4)";
pub(crate) const REMEMBER_SQL: &str = "SELECT idempotency.complete($1, $2, fence => $3::int8, \
     status => $4::int4, body => $5::bytea, headers => $6::text::jsonb, resource_id => $7::text, \
     one_time_secret => $8::boolean)";
pub(crate) const RELEASE_SQL: &str = "SELECT idempotency.release($1, $2, $3::int8)";
// The settled row's expiry, read only when the key was completed after acquire's
// expires_at had passed (complete then keeps it one more ttl from its own now()).
pub(crate) const STORED_EXPIRY_SQL: &str =
    "SELECT floor(extract(epoch FROM expires_at))::int8 FROM idempotency.lookup($1, $2)";

/// The pools of a runner.
#[derive(Clone)]
pub(crate) enum Store {
    /// tokio-postgres connections (deadpool-postgres).
    Pg { pool: Pool, renew: Pool },
    /// sqlx connections.
    #[cfg(feature = "sqlx")]
    Sqlx { pool: sqlx::PgPool, renew: sqlx::PgPool },
}

/// One acquire's parameters beyond the call: the key as stored, the lease, the answer's
/// problem type base and Retry-After.
pub(crate) struct Acquire<'a> {
    pub(crate) call: &'a Call<'a>,
    pub(crate) stored: &'a str,
    pub(crate) lease_ms: Option<i64>,
    pub(crate) ttl_ms: Option<i64>,
    pub(crate) type_base: &'a str,
    pub(crate) retry_after: i32,
}

/// What acquire returned: the outcome, the fence, the key row's expiry and the server's
/// answer of an outcome that does not run the body.
pub(crate) struct AcquireRow {
    pub(crate) outcome: String,
    pub(crate) fence: Option<i64>,
    pub(crate) expires: Option<i64>,
    pub(crate) status: Option<i32>,
    pub(crate) headers: Option<String>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) resource_id: Option<String>,
}

impl AcquireRow {
    /// The server's answer as a `Response` (an outcome other than started).
    pub(crate) fn response(&self) -> Response {
        let status = self.status.unwrap_or(500);
        let (headers, body) = (self.headers.as_deref(), self.body.clone());
        crate::http::answer_response(status, headers, body, self.resource_id.clone())
    }
}

/// The connection was lost before the statement could run: closed, an I/O error, or
/// the server ended the session (class 57P: terminated, shutting down; class 08).
pub(crate) fn connection_error(error: &Error) -> bool {
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

/// Runs `statement` on a connection of `pool`; a connection that turns out to be gone is
/// dropped (its connection task may not have noticed yet) and replaced once.
async fn on_pool<T, F, Fut>(pool: &Pool, statement: F) -> Result<T, Error>
where
    F: Fn(Object) -> Fut,
    Fut: std::future::Future<Output = (Object, Result<T, Error>)>,
{
    let mut attempt = 0;
    loop {
        let (client, result) = statement(pooled(pool).await?).await;
        let lost = matches!(&result, Err(e) if connection_error(e));
        if lost {
            drop(Object::take(client));
        }
        match result {
            Err(_) if lost && attempt == 0 => attempt += 1,
            other => return other,
        }
    }
}

impl Store {
    /// Reads the server's final statuses once.
    pub(crate) async fn load(&self, final_statuses: &FinalStatuses) -> Result<(), Error> {
        match self {
            Store::Pg { pool, .. } => {
                let client = pooled(pool).await?;
                final_statuses.load(&**client).await
            }
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => {
                let fetch = || async {
                    let query = sqlx::query_scalar::<_, i32>(crate::common::FINAL_STATUSES_SQL);
                    Ok(query.fetch_all(pool).await?)
                };
                final_statuses.load_with(fetch).await
            }
        }
    }

    /// Acquires the key.
    pub(crate) async fn acquire(&self, a: &Acquire<'_>) -> Result<AcquireRow, Error> {
        let pool = match self {
            Store::Pg { pool, .. } => pool,
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => return super::store_sqlx::acquire(pool, a).await,
        };
        let c = a.call;
        let wait = c.wait;
        let params: [&(dyn ToSql + Sync); 12] = [
            &c.principal,
            &a.stored,
            &c.action,
            &c.method,
            &c.path,
            &c.body,
            &c.exclude,
            &a.lease_ms,
            &a.ttl_ms,
            &wait,
            &a.type_base,
            &a.retry_after,
        ];
        let row = on_pool(pool, |client| async {
            let row = client.query_one(ACQUIRE_SQL, &params).await.map_err(Error::from);
            (client, row)
        })
        .await?;
        Ok(acquire_row(&row))
    }

    /// Renews `held` within `limit`: Some(fence held), None after an error or timeout
    /// (the connection is then dropped, not given back).
    pub(crate) async fn renew(&self, held: &Held, lease_ms: i64, limit: Duration) -> Option<bool> {
        let renew = match self {
            Store::Pg { renew, .. } => renew,
            #[cfg(feature = "sqlx")]
            Store::Sqlx { renew, .. } => {
                return super::store_sqlx::renew(renew, held, lease_ms, limit).await
            }
        };
        let client = tokio::time::timeout(limit, pooled(renew)).await.ok()?.ok()?;
        let params: [&(dyn ToSql + Sync); 4] = [&held.principal, &held.key, &held.fence, &lease_ms];
        let renewed = tokio::time::timeout(limit, client.query_one(RENEW_SQL, &params)).await;
        match renewed {
            Ok(Ok(row)) => Some(row.get(0)),
            _ => {
                drop(Object::take(client));
                None
            }
        }
    }

    /// Settles `held`: true when its fence still held the key.
    pub(crate) async fn settle(
        &self,
        held: &Held,
        settle: &Settle<'_>,
        kept: &[String],
    ) -> Result<bool, Error> {
        let pool = match self {
            Store::Pg { pool, .. } => pool,
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => {
                return super::store_sqlx::settle(pool, held, settle, kept).await
            }
        };
        let (principal, key, fence) = (&held.principal, &held.key, &held.fence);
        on_pool(pool, |client| async move {
            let row = match settle {
                Settle::Release => client.query_one(RELEASE_SQL, &[principal, key, fence]).await,
                Settle::MarkDone(status) => {
                    let status = i32::from(*status);
                    client.query_one(MARK_DONE_SQL, &[principal, key, fence, &status]).await
                }
                Settle::Store(response) => {
                    let headers = kept_headers_json(response, kept);
                    let status = i32::from(response.status);
                    let params: [&(dyn ToSql + Sync); 8] = [
                        principal,
                        key,
                        fence,
                        &status,
                        &response.body,
                        &headers,
                        &response.resource_id,
                        &response.one_time_secret,
                    ];
                    client.query_one(REMEMBER_SQL, &params).await
                }
            };
            (client, row.map(|row| row.get(0)).map_err(Error::from))
        })
        .await
    }

    /// The stored row's expiry, read again; None when it cannot be read.
    pub(crate) async fn stored_expiry(&self, held: &Held) -> Option<i64> {
        match self {
            Store::Pg { pool, .. } => {
                let client = pooled(pool).await.ok()?;
                let rows = client.query(STORED_EXPIRY_SQL, &[&held.principal, &held.key]).await;
                rows.ok()?.first().and_then(|row| row.get(0))
            }
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => {
                let query = sqlx::query_scalar::<_, Option<i64>>(STORED_EXPIRY_SQL);
                let query = query.bind(&held.principal).bind(&held.key);
                query.fetch_optional(pool).await.ok()?.flatten()
            }
        }
    }
}

fn acquire_row(row: &Row) -> AcquireRow {
    AcquireRow {
        outcome: row.get(0),
        fence: row.get(1),
        expires: row.get(2),
        status: row.get(3),
        headers: row.get(4),
        body: row.get(5),
        resource_id: row.get(6),
    }
}
