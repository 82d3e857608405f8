//! What the transactional and the lease protocol share: requests, errors, the
//! final-status table and small SQL helpers.

use std::fmt;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;

use crate::http::DuplicateMode;

/// Any error a body or handler may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
}

/// What went wrong in a call of this crate.
#[derive(Debug)]
pub enum Error {
    /// The database said no, or the connection failed.
    Db(tokio_postgres::Error),
    /// The body or handler failed; the key was settled by its policy before this returned.
    Body(BoxError),
    /// The server answered something this client does not understand, or a misuse.
    Protocol(String),
}

impl Error {
    /// The SQLSTATE of a database error, if any.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Db(error) => error.code(),
            _ => None,
        }
    }

    /// True for a serialization failure (40001) or a deadlock (40P01): rerun the attempt.
    pub fn is_retryable(&self) -> bool {
        matches!(self.sqlstate(), Some(s) if *s == SqlState::T_R_SERIALIZATION_FAILURE
            || *s == SqlState::T_R_DEADLOCK_DETECTED)
    }

    /// True when the database failed under the call (see `fault`): a connection lost or
    /// refused, a server shut down or restarting, a cancelled statement, a commit whose
    /// outcome is unknown. Also for a handler's error (`Body`) that is one. Answer it with
    /// `fault::database_fault_response`: a retry with the same key is safe.
    pub fn is_database_fault(&self) -> bool {
        match self {
            Error::Db(error) => crate::fault::is_fault(error),
            Error::Body(error) => {
                error.downcast_ref::<tokio_postgres::Error>().map_or(false, crate::fault::is_fault)
                    || error.downcast_ref::<Error>().map_or(false, Error::is_database_fault)
            }
            Error::Protocol(_) => false,
        }
    }

    /// True when the server refused a call because the principal's shard is not on the node
    /// it ran on (under Citus, after a shard move): SQLSTATE `STALE_PLACEMENT_SQLSTATE` and
    /// the primary message `STALE_PLACEMENT_MESSAGE` (another 0A000 is not). Also for a
    /// handler's error (`Body`) that is such a database error. The principal's placement is
    /// stale: report it with `Router::report_stale_placement`.
    pub fn is_stale_placement(&self) -> bool {
        match self {
            Error::Db(error) => stale_placement(error),
            Error::Body(error) => {
                error.downcast_ref::<tokio_postgres::Error>().map_or(false, stale_placement)
                    || error.downcast_ref::<Error>().map_or(false, Error::is_stale_placement)
            }
            Error::Protocol(_) => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Db(error) => write!(f, "database error: {}", error),
            Error::Body(error) => write!(f, "body failed: {}", error),
            Error::Protocol(message) => write!(f, "protocol error: {}", message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Db(error) => Some(error),
            Error::Body(error) => Some(error.as_ref()),
            Error::Protocol(_) => None,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        Error::Db(error)
    }
}

/// The server's refusal of a call whose principal's shard is not on its node.
fn stale_placement(error: &tokio_postgres::Error) -> bool {
    use crate::router::{STALE_PLACEMENT_MESSAGE, STALE_PLACEMENT_SQLSTATE};
    error.as_db_error().map_or(false, |db| {
        db.code().code() == STALE_PLACEMENT_SQLSTATE && db.message() == STALE_PLACEMENT_MESSAGE
    })
}

/// The key was refused by the server (empty, too long, bad characters, key_format): 400.
pub(crate) fn key_refused(error: &Error) -> bool {
    matches!(error.sqlstate(), Some(s) if *s == SqlState::INVALID_TEXT_REPRESENTATION)
}

/// The body cannot be fingerprinted (JSON nested deeper than max_json_depth): 400.
pub(crate) fn body_invalid(error: &Error) -> bool {
    matches!(error.sqlstate(), Some(s) if *s == SqlState::PROGRAM_LIMIT_EXCEEDED
        || *s == SqlState::STATEMENT_TOO_COMPLEX)
}

/// A duration as whole milliseconds for `$n::int8 * interval '1 millisecond'`.
pub(crate) fn millis(value: Option<Duration>) -> Option<i64> {
    value.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

const FINAL_STATUSES_SQL: &str =
    "SELECT s FROM pg_catalog.generate_series(100, 599) AS s WHERE idempotency.is_final(s)";

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

    /// Reads the server's table once (one round trip); later calls return at once.
    pub(crate) async fn load<C: tokio_postgres::GenericClient>(
        &self,
        client: &C,
    ) -> Result<(), Error> {
        self.table
            .get_or_try_init(|| async {
                let rows = client.query(FINAL_STATUSES_SQL, &[]).await?;
                let mut flags = vec![false; 500];
                for row in rows {
                    let status: i32 = row.get(0);
                    flags[(status - 100) as usize] = true;
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
