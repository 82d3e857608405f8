//! Where the lease statements run: a deadpool of tokio-postgres connections, or (feature
//! `sqlx`) a sqlx `PgPool`; each beside a small pool of its own for the renewals, whose
//! connections the renewal runtime opens and drives.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};

use super::{Held, Settle};
use crate::common::{answer_of, FinalStatuses};
use crate::connect::pooled;
use crate::db::{Db, Param, Values};
use crate::error::Error;
use crate::http::{kept_headers_json, Response};
use crate::statements::{
    ACQUIRE_SQL, MARK_DONE_SQL, RELEASE_SQL, REMEMBER_SQL, RENEW_SQL, STORED_EXPIRY_SQL,
};

/// The pools of a runner.
#[derive(Clone)]
pub(crate) enum Store {
    /// tokio-postgres connections (deadpool-postgres).
    Pg { pool: Pool, renew: Pool },
    /// sqlx connections.
    #[cfg(feature = "sqlx")]
    Sqlx { pool: sqlx::PgPool, renew: sqlx::PgPool },
}

/// What acquire returned: the outcome, the fence, the key row's expiry and the server's
/// answer of an outcome that does not run the body.
pub(crate) struct AcquireRow {
    pub(crate) outcome: String,
    pub(crate) fence: Option<i64>,
    pub(crate) expires: Option<i64>,
    row: Values,
}

impl AcquireRow {
    /// The server's answer as a `Response` (an outcome other than started).
    pub(crate) fn response(&self) -> Response {
        answer_of(&self.row, 6)
    }

    /// The body of the server's answer (a stored response's).
    pub(crate) fn body(&self) -> Option<Vec<u8>> {
        self.row.bytes(5)
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

impl Store {
    /// Runs one statement on a connection of the runner's pool; a tokio-postgres
    /// connection that turns out to be gone is dropped (its connection task may not have
    /// noticed yet) and replaced once.
    async fn query(&self, sql: &'static str, params: &[Param<'_>]) -> Result<Vec<Values>, Error> {
        let pool = match self {
            Store::Pg { pool, .. } => pool,
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => return Db::SqlxPool(pool).query(sql, params).await,
        };
        let mut attempt = 0;
        loop {
            let client = pooled(pool).await?;
            let result = Db::Pg(&client, &[]).query(sql, params).await;
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

    /// Reads the server's final statuses once.
    pub(crate) async fn load(&self, final_statuses: &FinalStatuses) -> Result<(), Error> {
        match self {
            Store::Pg { pool, .. } => {
                let client = pooled(pool).await?;
                final_statuses.load(Db::Pg(&client, &[])).await
            }
            #[cfg(feature = "sqlx")]
            Store::Sqlx { pool, .. } => final_statuses.load(Db::SqlxPool(pool)).await,
        }
    }

    /// Acquires the key with `params` (those of `ACQUIRE_SQL`).
    pub(crate) async fn acquire(&self, params: &[Param<'_>]) -> Result<AcquireRow, Error> {
        let row = first(self.query(ACQUIRE_SQL, params).await?)?;
        let (outcome, fence, expires) = (row.text(0).unwrap_or_default(), row.int(1), row.int(2));
        Ok(AcquireRow { outcome, fence, expires, row })
    }

    /// Renews `held` within `limit`: Some(fence held), None after an error or timeout
    /// (the connection is then dropped, not given back).
    pub(crate) async fn renew(&self, held: &Held, lease_ms: i64, limit: Duration) -> Option<bool> {
        let params = [
            Param::Text(Some(&held.principal)),
            Param::Text(Some(&held.key)),
            Param::Int8(Some(held.fence)),
            Param::Int8(Some(lease_ms)),
        ];
        match self {
            Store::Pg { renew, .. } => {
                let client = tokio::time::timeout(limit, pooled(renew)).await.ok()?.ok()?;
                let fenced = renewed(Db::Pg(&client, &[]), &params, limit).await;
                if fenced.is_none() {
                    drop(Object::take(client));
                }
                fenced
            }
            #[cfg(feature = "sqlx")]
            Store::Sqlx { renew, .. } => {
                let mut conn = tokio::time::timeout(limit, renew.acquire()).await.ok()?.ok()?;
                let fenced = renewed(Db::Sqlx(&mut conn), &params, limit).await;
                if fenced.is_none() {
                    drop(conn.detach()); // never given back: it may be stuck or gone
                }
                fenced
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
        let headers;
        let mut params = vec![
            Param::Text(Some(&held.principal)),
            Param::Text(Some(&held.key)),
            Param::Int8(Some(held.fence)),
        ];
        let sql = match settle {
            Settle::Release => RELEASE_SQL,
            Settle::MarkDone(status) => {
                params.push(Param::Int4(i32::from(*status)));
                MARK_DONE_SQL
            }
            Settle::Store(response) => {
                headers = kept_headers_json(response, kept);
                params.extend([
                    Param::Int4(i32::from(response.status)),
                    Param::Bytes(Some(&response.body)),
                    Param::Text(Some(&headers)),
                    Param::Text(response.resource_id.as_deref()),
                    Param::Bool(response.one_time_secret),
                ]);
                REMEMBER_SQL
            }
        };
        let row = first(self.query(sql, &params).await?)?;
        Ok(row.flag(0).unwrap_or(false))
    }

    /// The stored row's expiry, read again; None when it cannot be read.
    pub(crate) async fn stored_expiry(&self, held: &Held) -> Option<i64> {
        let params = [Param::Text(Some(&held.principal)), Param::Text(Some(&held.key))];
        let rows = self.query(STORED_EXPIRY_SQL, &params).await;
        rows.ok()?.first().and_then(|row| row.int(0))
    }
}

/// renew on `db` within `limit`: Some(fence held), None after an error or a timeout.
async fn renewed(db: Db<'_>, params: &[Param<'_>], limit: Duration) -> Option<bool> {
    let row = tokio::time::timeout(limit, db.query_one(RENEW_SQL, params)).await;
    row.ok()?.ok()?.flag(0)
}

/// The first row of a statement's answer.
fn first(rows: Vec<Values>) -> Result<Values, Error> {
    rows.into_iter().next().ok_or_else(|| Error::Protocol("a statement returned no row".into()))
}
