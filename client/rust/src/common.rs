//! What the transactional and the lease protocol share: requests, the final-status
//! table and small SQL helpers.

use std::time::Duration;

use tokio::sync::OnceCell;

use crate::db::{Db, Param, Values};
use crate::error::Error;
use crate::http::{answer_response, DuplicateMode, Response};
use crate::statements::FINAL_STATUSES_SQL;

/// One HTTP request as the protocol sees it.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Whoever the key belongs to (user, API key, tenant), from authentication.
    pub principal: String,
    /// The Idempotency-Key header, or None when the request had none.
    pub key: Option<String>,
    /// HTTP method; compared in upper case.
    pub method: String,
    /// Request path (without the query string unless the API wants it fingerprinted).
    pub path: String,
    /// Request body; fingerprinted as RFC 8785 JSON when it is JSON, as raw bytes otherwise.
    pub body: Option<Vec<u8>>,
    /// RFC 6901 pointers of members left out of the fingerprint (timestamps, nonces).
    pub exclude: Vec<String>,
    /// Operation name stored with the key; empty: "METHOD path".
    pub action: String,
    /// What a duplicate of this request does while the first runs; None: the client's
    /// `Options::duplicates` (or the lease runner's `LeaseOptions::duplicates`). A route or middleware sets
    /// it from the request (a fixed value per route, or a function of the request).
    pub duplicates: Option<DuplicateMode>,
}

impl Request {
    /// A request with a principal, a key, a method, a path and a body.
    pub fn new(
        principal: impl Into<String>,
        key: Option<String>,
        method: impl Into<String>,
        path: impl Into<String>,
        body: Option<Vec<u8>>,
    ) -> Self {
        Request {
            principal: principal.into(),
            key,
            method: method.into(),
            path: path.into(),
            body,
            ..Request::default()
        }
    }

    /// The action stored with the key.
    pub fn action_name(&self) -> String {
        if self.action.is_empty() {
            format!("{} {}", self.method.to_ascii_uppercase(), self.path)
        } else {
            self.action.clone()
        }
    }

    /// The exclude pointers as a text[] parameter (None when there are none).
    pub(crate) fn exclude_param(&self) -> Option<Vec<String>> {
        if self.exclude.is_empty() {
            None
        } else {
            Some(self.exclude.clone())
        }
    }

    /// begin's or acquire's wait in milliseconds: 0 in reject mode (409 at once), else
    /// `wait`; the mode is the request's `duplicates`, else `mode`.
    pub(crate) fn wait_millis(&self, mode: DuplicateMode, wait: Option<Duration>) -> Option<i64> {
        match self.duplicates.unwrap_or(mode) {
            DuplicateMode::Reject => Some(0),
            DuplicateMode::Wait => millis(wait),
        }
    }

    /// The key as sent (empty when there is none: the server refuses it).
    pub(crate) fn key_text(&self) -> &str {
        self.key.as_deref().unwrap_or_default()
    }

    /// The first seven parameters of begin, save_final and acquire: the principal, `key`
    /// (as stored), `action` and the fingerprint's parts (method, path, body, exclude).
    pub(crate) fn claim_params<'a>(&'a self, key: &'a str, action: &'a str) -> Vec<Param<'a>> {
        let exclude = (!self.exclude.is_empty()).then_some(self.exclude.as_slice());
        vec![
            Param::Text(Some(&self.principal)),
            Param::Text(Some(key)),
            Param::Text(Some(action)),
            Param::Text(Some(&self.method)),
            Param::Text(Some(&self.path)),
            Param::Bytes(self.body.as_deref()),
            Param::Texts(exclude),
        ]
    }
}

/// The server's answer in a row of begin or acquire (`idempotency.http_answer`'s status,
/// headers and body in columns 3 to 5) with the resource id of column `resource_id`.
pub(crate) fn answer_of(row: &Values, resource_id: usize) -> Response {
    let status = row.int(3).and_then(|s| i32::try_from(s).ok()).unwrap_or(500);
    answer_response(status, row.text(4).as_deref(), row.bytes(5), row.text(resource_id))
}

/// The key was refused by the server (empty, too long, bad characters, key_format): 400.
pub(crate) fn key_refused(error: &Error) -> bool {
    error.code().as_deref() == Some("22P02")
}

/// The body cannot be fingerprinted (JSON nested deeper than max_json_depth): 400.
pub(crate) fn body_invalid(error: &Error) -> bool {
    matches!(error.code().as_deref(), Some("54000" | "54001"))
}

/// A duration as whole milliseconds for `$n::int8 * interval '1 millisecond'`.
pub(crate) fn millis(value: Option<Duration>) -> Option<i64> {
    value.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Which statuses are stored: the server's idempotency.is_final, read once, or a fixed list.
#[derive(Debug, Default)]
pub(crate) struct FinalStatuses {
    table: OnceCell<Vec<bool>>,
}

impl FinalStatuses {
    /// A fixed list, or None to ask the server on first use.
    pub(crate) fn new(statuses: Option<&[u16]>) -> Self {
        let table = OnceCell::new();
        if let Some(list) = statuses {
            let mut flags = vec![false; 500];
            for &s in list.iter().filter(|s| (100..=599).contains(*s)) {
                flags[usize::from(s - 100)] = true;
            }
            table.set(flags).expect("a fresh cell");
        }
        FinalStatuses { table }
    }

    /// Reads the server's table once on `db` (one round trip); later calls return at once.
    pub(crate) async fn load(&self, db: Db<'_>) -> Result<(), Error> {
        self.table
            .get_or_try_init(|| async {
                let mut flags = vec![false; 500];
                for row in db.query(FINAL_STATUSES_SQL, &[]).await? {
                    if let Some(status) = row.int(0).filter(|s| (100..=599).contains(s)) {
                        flags[(status - 100) as usize] = true;
                    }
                }
                Ok::<_, Error>(flags)
            })
            .await?;
        Ok(())
    }

    /// Whether a status is stored; false before `load` for a server-side table.
    pub(crate) fn is_final(&self, status: u16) -> bool {
        match self.table.get() {
            Some(flags) if (100..=599).contains(&status) => flags[usize::from(status - 100)],
            _ => false,
        }
    }
}
