//! Settling a held key by its policy, with its fence. A statement that fails is
//! logged with the key's SHA-256 (never the key) and never returned: the caller gets
//! the body's own result, and the key stays held until its lease runs out (fail closed).

use super::{Held, LeaseRunner, Policy};
use crate::http::Response;

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

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Settle::MarkDone(_) => "mark done",
            Settle::Store(_) => "store",
            Settle::Release => "release",
        }
    }
}

impl LeaseRunner {
    /// Settles the key: Some(true) when its fence still held it, Some(false) when the
    /// fence was lost, None when the statement failed (logged; a lost connection was
    /// retried once on a fresh one).
    pub(crate) async fn settle(&self, held: &Held, settle: &Settle<'_>) -> Option<bool> {
        let settled = self.store.settle(held, settle, &self.options().kept_headers).await;
        match settled {
            Ok(fenced) => Some(fenced),
            Err(error) => {
                tracing::warn!(
                    key_sha256 = %held.digest,
                    fence = held.fence,
                    action = settle.name(),
                    error = %error,
                    "pg_idempotency: settling the key failed; it stays held until its \
                     lease runs out"
                );
                None
            }
        }
    }
}
