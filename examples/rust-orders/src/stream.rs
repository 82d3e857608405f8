//! POST /orders/stream: one order, then a streamed answer (contract C of the stream
//! scenario): 200 text/plain as n chunks of m bytes, chunk i made of the digit i % 10.

use std::sync::Arc;

use pg_idempotency::axum_glue::{into_axum, stream_response};
use pg_idempotency::http::{problem_response, Problem, PROBLEM_TYPE_BASE};
use pg_idempotency::{BoxError, Request, Response, StreamWriter};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_postgres::Transaction;

use crate::pool::Statements;
use crate::App;

/// (chunks, chunk_bytes) of a body, or the 400 to answer.
fn parse(body: &[u8]) -> Result<(usize, usize), Response> {
    let data: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    // An integral number (5 or 5.0: the same request to the fingerprint) in 1..=most.
    let count = |name: &str, most: f64| {
        let n = data.get(name).and_then(Value::as_f64)?;
        (n.fract() == 0.0 && (1.0..=most).contains(&n)).then_some(n as u64)
    };
    match (count("chunks", 1000.0), count("chunk_bytes", 65536.0)) {
        (Some(n), Some(m)) => Ok((n as usize, m as usize)),
        _ => {
            let detail = "The body must be a JSON object with \"chunks\" (1 to 1000) and \
                          \"chunk_bytes\" (1 to 65536).";
            Err(problem_response(Problem::BODY_INVALID, detail, PROBLEM_TYPE_BASE))
        }
    }
}

/// The handler: validate, insert one order in the key's transaction, stream the chunks.
async fn create_stream(
    tx: &Transaction<'_>,
    statements: &Statements,
    principal: &str,
    body: &[u8],
    out: StreamWriter,
) -> Result<Response, BoxError> {
    let (chunks, chunk_bytes) = match parse(body) {
        Ok(sizes) => sizes,
        Err(answer) => return Ok(answer),
    };
    tx.query_one(&statements.insert_order, &[&principal, &"stream", &1i32]).await?;
    out.start(200, vec![("Content-Type".into(), "text/plain".into())]).await?;
    for i in 0..chunks {
        let digit = b'0' + (i % 10) as u8;
        out.write(vec![digit; chunk_bytes]).await?; // an error: the client has gone
    }
    Ok(Response::default())
}

/// Runs the request in a task of its own (the connection is held until the stream ends)
/// and answers with the stream as its events come.
pub async fn serve(app: Arc<App>, request: Request) -> axum::response::Response {
    let mut slot = match app.pool.get().await {
        Ok(slot) => slot,
        Err(e) => return into_axum(crate::failed(&app, pg_idempotency::Error::Db(e))),
    };
    let (events, answers) = mpsc::channel(16);
    tokio::spawn(async move {
        let statements = slot.statements.clone();
        let principal = request.principal.clone();
        let body = request.body.clone().unwrap_or_default();
        let result = app
            .client
            .handle_stream(&mut slot.conn, &request, events, |tx, out| {
                let (statements, principal, body) =
                    (statements.clone(), principal.clone(), body.clone());
                Box::pin(
                    async move { create_stream(tx, &statements, &principal, &body, out).await },
                )
            })
            .await;
        match result {
            Ok(_) => app.pool.put(slot),
            Err(e) => eprintln!("rust-orders: /orders/stream: {}", e), // the connection dropped
        }
    });
    stream_response(answers).await
}
