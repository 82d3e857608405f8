//! `push_unique`: enqueue a job at most once per window. The job row and the key row
//! (`idempotency.claim`) commit in one transaction, so a job is never enqueued without
//! its key nor its key kept without the job.

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client as PgClient, Transaction};

use crate::common::{millis, Error};

const CLAIM_SQL: &str = "SELECT idempotency.claim($1, $2, $3::int8 * interval '1 millisecond')";

/// Inside the caller's transaction: claims (principal, key) for `window` (None: the
/// server's idempotency.key_ttl) and, when this call claimed it, runs `enqueue` (the
/// statement that inserts the job row) with `params`. True when this call enqueued the
/// job; false when the key was claimed before within the window (nothing is run).
/// The claim and the job commit or roll back with `tx`: a rolled-back push can be
/// pushed again. Another transaction pushing the same key waits for this one.
pub async fn push_unique_in(
    tx: &Transaction<'_>,
    principal: &str,
    key: &str,
    window: Option<Duration>,
    enqueue: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<bool, Error> {
    let claimed: bool = tx.query_one(CLAIM_SQL, &[&principal, &key, &millis(window)]).await?.get(0);
    if claimed {
        tx.execute(enqueue, params).await?;
    }
    Ok(claimed)
}

/// `push_unique_in` in a transaction of its own on `client`, committed before it returns.
pub async fn push_unique(
    client: &mut PgClient,
    principal: &str,
    key: &str,
    window: Option<Duration>,
    enqueue: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<bool, Error> {
    let tx = client.transaction().await?;
    let pushed = push_unique_in(&tx, principal, key, window, enqueue, params).await?;
    tx.commit().await?;
    Ok(pushed)
}
