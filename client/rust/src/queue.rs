//! `push_unique`: enqueue a job at most once per window. The job row and the key row
//! (`idempotency.claim`) commit in one transaction, so a job is never enqueued without
//! its key nor its key kept without the job. `claim_batch`: many claims in one call.

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client as PgClient, GenericClient, Transaction};

use crate::common::millis;
use crate::error::Error;
use crate::statements::{CLAIM_BATCH_SQL, CLAIM_SQL};

/// Inside the caller's transaction: claims (principal, key) for `window` (None: the
/// server's idempotency.key_ttl) and, when this call claimed it, runs `enqueue` (the
/// statement that inserts the job row) with `params`. True when this call enqueued the
/// job; false when the key was claimed before within the window (nothing is run).
/// The claim and the job commit or roll back with `tx`: a rolled-back push can be
/// pushed again. Another transaction pushing the same key waits for this one (up to
/// idempotency.wait_timeout, then 55P03) and gets false if it commits, true if it rolls
/// back. An error of `enqueue` is returned; `tx` is then aborted: roll it back.
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

/// What `claim_batch` answered for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchClaim {
    /// 1-based position of the key in the batch.
    pub ord: usize,
    /// The key.
    pub key: String,
    /// True for the call that claimed the key, as `idempotency.claim` answers.
    pub claimed: bool,
}

/// Claims many keys in one round trip (`idempotency.claim_batch`, extension 0.8.0):
/// `claimed` is true for each key this call claimed within `window` (None: the
/// server's idempotency.key_ttl), in input order. On a transaction the claims commit
/// or roll back with it; on a client the call commits on its own. The server refuses
/// a duplicate key (22023) and more than 1000 keys (54000).
pub async fn claim_batch<C: GenericClient>(
    client: &C,
    principal: &str,
    keys: &[&str],
    window: Option<Duration>,
) -> Result<Vec<BatchClaim>, Error> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let rows = client.query(CLAIM_BATCH_SQL, &[&principal, &keys, &millis(window)]).await?;
    Ok(rows
        .iter()
        .map(|row| BatchClaim {
            ord: row.get::<_, i32>(0) as usize,
            key: row.get(1),
            claimed: row.get(2),
        })
        .collect())
}
