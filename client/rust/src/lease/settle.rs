//! Settling a held key by its policy, with its fence. A statement that fails is
//! logged with the key's SHA-256 (never the key) and never returned: the caller gets
//! the body's own result, and the key stays held until its lease runs out (fail closed).

use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use super::{connection_error, give_back, Held, LeaseRunner, Policy};
use crate::connect::pooled;
use crate::error::Error;
use crate::http::{kept_headers_json, Response};

const MARK_DONE_SQL: &str =
    "SELECT idempotency.complete($1, $2, fence => $3::int8, status => $4::int4)";
const REMEMBER_SQL: &str = "SELECT idempotency.complete($1, $2, fence => $3::int8, \
     status => $4::int4, body => $5::bytea, headers => $6::text::jsonb, resource_id => $7::text, \
     one_time_secret => $8::boolean)";
const RELEASE_SQL: &str = "SELECT idempotency.release($1, $2, $3::int8)";

/// What settling does to a held key.
pub(crate) enum Settle<'r> {
    /// Marked done with this status: later calls are duplicates for the key's ttl.
    MarkDone(u16),
    /// The response is stored and replayed.
    Store(&'r Response),
    /// The key is dropped: a retry runs again.
    Release,
}

impl Settle<'_> {
    /// What a body that failed does under `policy`: once keeps the key (as a 500), the
    /// others release it.
    pub(crate) fn failed(policy: Policy) -> Settle<'static> {
        match policy {
            Policy::Once => Settle::MarkDone(500),
            _ => Settle::Release,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Settle::MarkDone(_) => "mark done",
            Settle::Store(_) => "store",
            Settle::Release => "release",
        }
    }
}

impl LeaseRunner {
    /// Settles the key: Some(true) when its fence still held it, Some(false) when the
    /// fence was lost, None when the statement failed (logged). A lost connection is
    /// retried once on a fresh one.
    pub(crate) async fn settle(&self, held: &Held, settle: &Settle<'_>) -> Option<bool> {
        let mut attempt = 0;
        loop {
            let settled = match pooled(self.pool()).await {
                Ok(client) => {
                    let settled = self.settle_once(&client, held, settle).await;
                    give_back(client, matches!(&settled, Err(e) if connection_error(e)));
                    settled
                }
                Err(error) => Err(error),
            };
            match settled {
                Err(error) if connection_error(&error) && attempt == 0 => attempt += 1,
                Err(error) => {
                    tracing::warn!(
                        key_sha256 = %held.digest,
                        fence = held.fence,
                        action = settle.name(),
                        error = %error,
                        "pg_idempotency: settling the key failed; it stays held until its \
                         lease runs out"
                    );
                    return None;
                }
                Ok(fenced) => return Some(fenced),
            }
        }
    }

    async fn settle_once(
        &self,
        client: &Object,
        held: &Held,
        settle: &Settle<'_>,
    ) -> Result<bool, Error> {
        let (principal, key, fence) = (&held.principal, &held.key, &held.fence);
        let row = match settle {
            Settle::Release => client.query_one(RELEASE_SQL, &[principal, key, fence]).await?,
            Settle::MarkDone(status) => {
                let status = i32::from(*status);
                client.query_one(MARK_DONE_SQL, &[principal, key, fence, &status]).await?
            }
            Settle::Store(response) => {
                let headers = kept_headers_json(response, &self.options().kept_headers);
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
                client.query_one(REMEMBER_SQL, &params).await?
            }
        };
        Ok(row.get(0))
    }
}
