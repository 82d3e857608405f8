//! Database faults: the errors that mean the database failed under a request (its
//! connection died, the server shut down, crashed or refused connections, the statement
//! was cancelled, the commit's outcome is unknown), not the request's own, and the one
//! answer to them (`database_fault` in client/protocol.json): 503 database-unavailable
//! with Retry-After. A retry with the same key runs the request once or replays it.

pub use crate::generated::{DATABASE_FAULT_DETAIL, FAULT_SQLSTATES, FAULT_SQLSTATE_CLASSES};
use crate::http::{problem_response, Problem, Response};

/// The one answer to a database fault: 503 database-unavailable with Retry-After (at
/// least 1 second), its type under `type_base`.
pub fn database_fault_response(retry_after: u32, type_base: &str) -> Response {
    let mut response =
        problem_response(Problem::DATABASE_UNAVAILABLE, DATABASE_FAULT_DETAIL, type_base);
    response.set_header("Retry-After", &retry_after.max(1).to_string());
    response
}

/// True when a tokio-postgres error says the database failed or could not be reached:
/// a fault SQLSTATE, a closed connection, or an error connecting or talking to the server
/// (tokio-postgres has no public kind for those; its messages name them).
pub(crate) fn is_fault(error: &tokio_postgres::Error) -> bool {
    if let Some(state) = error.code() {
        let code = state.code();
        return FAULT_SQLSTATE_CLASSES.iter().any(|class| code.starts_with(class))
            || FAULT_SQLSTATES.contains(&code);
    }
    if error.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        if inner.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        source = inner.source();
    }
    let text = error.to_string();
    ["error connecting to server", "error communicating with the server", "timeout waiting"]
        .iter()
        .any(|lost| text.starts_with(lost))
}

#[cfg(feature = "sqlx")]
/// True when a sqlx error says the database failed or could not be reached: a fault
/// SQLSTATE, an I/O or TLS error, a closed or exhausted pool.
pub(crate) fn is_sqlx_fault(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            FAULT_SQLSTATE_CLASSES.iter().any(|class| code.starts_with(class))
                || FAULT_SQLSTATES.contains(&code.as_ref())
        }),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}
