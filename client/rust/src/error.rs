//! Errors of this crate, and which of them are database faults or stale placements.

use std::fmt;

use tokio_postgres::error::SqlState;

use crate::generated::{STALE_PLACEMENT_MESSAGE, STALE_PLACEMENT_SQLSTATE};

/// Any error a body or handler may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a call of this crate.
#[derive(Debug)]
pub enum Error {
    /// The database said no, or the connection failed.
    Db(tokio_postgres::Error),
    /// The body or handler failed; the key was settled by its policy before this returned.
    Body(BoxError),
    /// The server answered something this client does not understand, or a misuse.
    Protocol(String),
    /// No pooled connection within the pool's wait timeout (every one busy), or the pool
    /// was closed: a database fault (503, retry with the same key).
    Pool(String),
    /// sqlx said no (feature `sqlx`).
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
}

impl Error {
    /// The SQLSTATE of a database error, if any.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Db(error) => error.code(),
            _ => None,
        }
    }

    /// The SQLSTATE of a database error of either backend, if any.
    pub(crate) fn code(&self) -> Option<String> {
        match self {
            Error::Db(error) => error.code().map(|code| code.code().to_string()),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(error) => {
                error.as_database_error().and_then(|db| db.code()).map(|code| code.into_owned())
            }
            _ => None,
        }
    }

    /// The primary message of a database error of either backend, or the error as text.
    pub(crate) fn message(&self) -> String {
        match self {
            Error::Db(error) => {
                error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().into())
            }
            #[cfg(feature = "sqlx")]
            Error::Sqlx(error) => error
                .as_database_error()
                .map_or_else(|| error.to_string(), |db| db.message().into()),
            other => other.to_string(),
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
                error.downcast_ref::<tokio_postgres::Error>().is_some_and(crate::fault::is_fault)
                    || error.downcast_ref::<Error>().is_some_and(Error::is_database_fault)
            }
            Error::Pool(_) => true,
            Error::Protocol(_) => false,
            #[cfg(feature = "sqlx")]
            Error::Sqlx(error) => crate::fault::is_sqlx_fault(error),
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
                error.downcast_ref::<tokio_postgres::Error>().is_some_and(stale_placement)
                    || error.downcast_ref::<Error>().is_some_and(Error::is_stale_placement)
            }
            Error::Protocol(_) | Error::Pool(_) => false,
            #[cfg(feature = "sqlx")]
            Error::Sqlx(_) => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Db(error) => write!(f, "database error: {}", error),
            Error::Body(error) => write!(f, "body failed: {}", error),
            Error::Protocol(message) => write!(f, "protocol error: {}", message),
            Error::Pool(message) => write!(f, "no pooled connection: {}", message),
            #[cfg(feature = "sqlx")]
            Error::Sqlx(error) => write!(f, "database error: {}", error),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Db(error) => Some(error),
            Error::Body(error) => Some(error.as_ref()),
            Error::Protocol(_) | Error::Pool(_) => None,
            #[cfg(feature = "sqlx")]
            Error::Sqlx(error) => Some(error),
        }
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::Sqlx(error)
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        Error::Db(error)
    }
}

/// The server's refusal of a call whose principal's shard is not on its node.
fn stale_placement(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        db.code().code() == STALE_PLACEMENT_SQLSTATE && db.message() == STALE_PLACEMENT_MESSAGE
    })
}
