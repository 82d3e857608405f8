//! The lease statements on a sqlx `PgPool` (feature `sqlx`): the same SQL as the
//! tokio-postgres path's (`store.rs`).

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::store::{
    Acquire, AcquireRow, ACQUIRE_SQL, MARK_DONE_SQL, RELEASE_SQL, REMEMBER_SQL, RENEW_SQL,
};
use super::{Held, Settle};
use crate::error::Error;
use crate::http::kept_headers_json;

pub(crate) async fn acquire(pool: &PgPool, a: &Acquire<'_>) -> Result<AcquireRow, Error> {
    let c = a.call;
    let row = sqlx::query(ACQUIRE_SQL)
        .bind(c.principal)
        .bind(a.stored)
        .bind(&c.action)
        .bind(c.method)
        .bind(c.path)
        .bind(c.body)
        .bind(&c.exclude)
        .bind(a.lease_ms)
        .bind(a.ttl_ms)
        .bind(c.wait)
        .bind(a.type_base)
        .bind(a.retry_after)
        .fetch_one(pool)
        .await?;
    Ok(AcquireRow {
        outcome: row.try_get(0)?,
        fence: row.try_get(1)?,
        expires: row.try_get(2)?,
        status: row.try_get(3)?,
        headers: row.try_get(4)?,
        body: row.try_get(5)?,
        resource_id: row.try_get(6)?,
    })
}

pub(crate) async fn renew(
    pool: &PgPool,
    held: &Held,
    lease_ms: i64,
    limit: Duration,
) -> Option<bool> {
    let mut conn = tokio::time::timeout(limit, pool.acquire()).await.ok()?.ok()?;
    let query = sqlx::query_scalar::<_, bool>(RENEW_SQL)
        .bind(&held.principal)
        .bind(&held.key)
        .bind(held.fence)
        .bind(lease_ms);
    match tokio::time::timeout(limit, query.fetch_one(&mut *conn)).await {
        Ok(Ok(fenced)) => Some(fenced),
        _ => {
            drop(conn.detach()); // never given back: it may be stuck or gone
            None
        }
    }
}

pub(crate) async fn settle(
    pool: &PgPool,
    held: &Held,
    settle: &Settle<'_>,
    kept: &[String],
) -> Result<bool, Error> {
    let (principal, key, fence) = (&held.principal, &held.key, held.fence);
    let query = match settle {
        Settle::Release => sqlx::query_scalar(RELEASE_SQL).bind(principal).bind(key).bind(fence),
        Settle::MarkDone(status) => sqlx::query_scalar(MARK_DONE_SQL)
            .bind(principal)
            .bind(key)
            .bind(fence)
            .bind(i32::from(*status)),
        Settle::Store(response) => sqlx::query_scalar(REMEMBER_SQL)
            .bind(principal)
            .bind(key)
            .bind(fence)
            .bind(i32::from(response.status))
            .bind(&response.body)
            .bind(kept_headers_json(response, kept))
            .bind(&response.resource_id)
            .bind(response.one_time_secret),
    };
    Ok(query.fetch_one(pool).await?)
}
