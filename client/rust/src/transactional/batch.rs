//! Many keys in one call: `idempotency.begin_batch` and `complete_batch` (extension
//! 0.8.0), one round trip each, one answer per key in input order. Each key behaves as
//! the single-key call (its answer is made by the same code as `Client::begin`'s); the
//! server takes the key locks in sorted key order, so two batches never deadlock.

use std::time::SystemTime;

use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::{outcome_of, Begun, Client};
use crate::common::{millis, Request};
use crate::db::Values;
use crate::error::Error;
use crate::http::{kept_headers_json, Outcome, Response};
use crate::statements::{BEGIN_BATCH_SQL, COMPLETE_BATCH_SQL};

/// What `begin_batch` answered for one key (the columns of `idempotency.batch_outcome`).
#[derive(Debug)]
pub struct BatchOutcome {
    /// 1-based position of the key in the batch.
    pub ord: usize,
    /// The key.
    pub key: String,
    /// As `Client::begin`: `Started` (the key is held by the transaction: do the work,
    /// then `complete_batch`), or the answer to send (replay, 409, 422, with
    /// `Idempotency-Expires`).
    pub begun: Begun,
    /// Status of the stored response, when there is one.
    pub response_status: Option<u16>,
    /// Resource id of the stored response, when there is one.
    pub resource_id: Option<String>,
    /// The key row's creation time, when there is a row.
    pub created_at: Option<SystemTime>,
    /// The key row's expiry, when there is a row.
    pub expires_at: Option<SystemTime>,
    /// The key row's fence, when it has one.
    pub fence: Option<i64>,
    /// The end of the key row's lease, when it has one.
    pub lease_until: Option<SystemTime>,
}

impl BatchOutcome {
    /// The outcome as the server named it.
    pub fn outcome(&self) -> Outcome {
        match &self.begun {
            Begun::Answer(outcome, _) => *outcome,
            _ => Outcome::Started,
        }
    }
}

/// What `complete_batch` answered for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchCompletion {
    /// 1-based position of the key in the batch.
    pub ord: usize,
    /// The key.
    pub key: String,
    /// True when the response was stored, as `idempotency.complete` answers.
    pub completed: bool,
}

/// The keys of a batch; every request must have one and share the principal, and with
/// `shape` also the action, the exclude list and the duplicate mode (one of each per call).
fn batch_keys(requests: &[&Request], shape: bool) -> Result<Vec<String>, Error> {
    let first = requests[0];
    let mut keys = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let same_shape = r.action_name() == first.action_name()
            && r.exclude == first.exclude
            && r.duplicates == first.duplicates;
        let refused = if r.principal != first.principal {
            "a batch has one principal".to_string()
        } else if shape && !same_shape {
            "a batch has one action, one exclude list and one duplicate mode".to_string()
        } else if let Some(key) = &r.key {
            keys.push(key.clone());
            continue;
        } else {
            format!("batch request {} has no key", i + 1)
        };
        return Err(Error::Protocol(refused));
    }
    Ok(keys)
}

impl Client {
    /// Claims the keys of `requests` inside the caller's transaction, in one round trip
    /// (`idempotency.begin_batch`), and returns one outcome per request in their
    /// order. Do the work of the started keys in `tx`, then `complete_batch` them
    /// before committing. The requests share one principal, action, exclude list and
    /// duplicate mode; the client's `ttl` and `wait` apply. The server refuses a
    /// duplicate key (22023) and more than 1000 keys (54000).
    pub async fn begin_batch(
        &self,
        tx: &Transaction<'_>,
        requests: &[Request],
    ) -> Result<Vec<BatchOutcome>, Error> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let keys = batch_keys(&requests.iter().collect::<Vec<_>>(), true)?;
        let first = &requests[0];
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
        let bodies: Vec<Option<&[u8]>> = requests.iter().map(|r| r.body.as_deref()).collect();
        let (action, exclude) = (first.action_name(), first.exclude_param());
        let options = self.options();
        let times = [millis(options.ttl), first.wait_millis(options.duplicates, options.wait)];
        let base = &self.options().problem_type_base;
        let retry_after = self.options().retry_after.max(1) as i32;
        let params: [&(dyn ToSql + Sync); 11] = [
            &first.principal,
            &keys,
            &action,
            &methods,
            &paths,
            &bodies,
            &exclude,
            &times[0],
            &times[1],
            base,
            &retry_after,
        ];
        let rows = tx.query(BEGIN_BATCH_SQL, &params).await?;
        rows.iter().map(|row| batch_outcome(&Values::of_pg(row)?)).collect()
    }

    /// Stores the final responses of keys that `begin_batch` started in `tx`
    /// (`idempotency.complete_batch`), one round trip; commit `tx` afterwards.
    /// `items` pairs each request with its response; the client's kept headers are
    /// stored. Every status must be final (else 22023, nothing stored); a one-time
    /// secret cannot be completed in a batch (use `complete`).
    pub async fn complete_batch(
        &self,
        tx: &Transaction<'_>,
        items: &[(&Request, &Response)],
    ) -> Result<Vec<BatchCompletion>, Error> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let requests: Vec<&Request> = items.iter().map(|(r, _)| *r).collect();
        let keys = batch_keys(&requests, false)?;
        if items.iter().any(|(_, response)| response.one_time_secret) {
            return Err(Error::Protocol("a one-time secret cannot be completed in a batch".into()));
        }
        let kept = &self.options().kept_headers;
        let statuses: Vec<i32> = items.iter().map(|(_, r)| i32::from(r.status)).collect();
        let bodies: Vec<&[u8]> = items.iter().map(|(_, r)| r.body.as_slice()).collect();
        let headers: Vec<String> = items.iter().map(|(_, r)| kept_headers_json(r, kept)).collect();
        let resources: Vec<Option<&str>> =
            items.iter().map(|(_, r)| r.resource_id.as_deref()).collect();
        let params: [&(dyn ToSql + Sync); 6] =
            [&requests[0].principal, &keys, &statuses, &bodies, &headers, &resources];
        let rows = tx.query(COMPLETE_BATCH_SQL, &params).await?;
        Ok(rows
            .iter()
            .map(|row| BatchCompletion {
                ord: row.get::<_, i32>(0) as usize,
                key: row.get(1),
                completed: row.get(2),
            })
            .collect())
    }
}

/// One row of begin_batch: its first six columns as begin's, then the key's row.
fn batch_outcome(row: &Values) -> Result<BatchOutcome, Error> {
    let (begun, _) = outcome_of(row)?;
    let status = row.int(12).and_then(|s| u16::try_from(s).ok());
    Ok(BatchOutcome {
        ord: row.int(6).unwrap_or_default() as usize,
        key: row.text(7).unwrap_or_default(),
        begun,
        response_status: status,
        resource_id: row.text(1),
        created_at: row.time(8),
        expires_at: row.time(9),
        fence: row.int(10),
        lease_until: row.time(11),
    })
}
