//! The business handlers: orders and API keys, the same bodies as the C++ service.

use std::collections::HashSet;
use std::io::Read;
use std::sync::Mutex;

use pg_idempotency::{BoxError, DuplicateMode, Error, Response};
use serde_json::{json, Value};
use tokio_postgres::{Client, Transaction};

use crate::pool::Statements;

/// The POST routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Orders,
    /// The orders handler in reject mode: a duplicate of a running request is 409 at once.
    RejectOrders,
    Plain,
    Flaky,
    ApiKeys,
}

impl Route {
    pub fn of(path: &str) -> Option<Route> {
        match path {
            "/orders" | "/classic/orders" => Some(Route::Orders),
            "/reject/orders" => Some(Route::RejectOrders),
            "/plain/orders" => Some(Route::Plain),
            "/flaky/orders" => Some(Route::Flaky),
            "/api-keys" => Some(Route::ApiKeys),
            _ => None,
        }
    }

    /// What a duplicate of a running request does on this route (the request's
    /// `duplicates`): reject on /reject/orders, the client's default (wait) elsewhere.
    pub fn duplicates(self) -> Option<DuplicateMode> {
        match self {
            Route::RejectOrders => Some(DuplicateMode::Reject),
            _ => None,
        }
    }
}

/// Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service.
pub fn json_response(status: u16, document: Value, location: Option<String>) -> Response {
    let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    if let Some(location) = location {
        headers.push(("Location".to_string(), location));
    }
    Response::new(status, headers, serde_json::to_vec(&document).expect("JSON serializes"))
}

/// The service's own problem bodies (type about:blank).
pub fn problem(status: u16, title: &str, detail: &str) -> Response {
    let document =
        json!({"type": "about:blank", "title": title, "status": status, "detail": detail});
    let mut response = json_response(status, document, None);
    response.set_header("Content-Type", "application/problem+json");
    response
}

/// Remembers which (principal, key) already failed once on /flaky/orders.
#[derive(Default)]
pub struct FirstRuns(Mutex<HashSet<(String, String)>>);

impl FirstRuns {
    /// True the first time for this (principal, key).
    pub fn first(&self, principal: &str, key: &str) -> bool {
        self.0.lock().expect("lock").insert((principal.to_string(), key.to_string()))
    }
}

/// (item, quantity) of an order body, or the 400/422 to answer.
fn parse_order(body: &[u8]) -> Result<(String, i32), Response> {
    let data: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let item = match data.get("item").and_then(Value::as_str) {
        Some(item) if !item.is_empty() => item.to_string(),
        _ => {
            let detail = "The body must be a JSON object with a non-empty \"item\" string.";
            return Err(problem(400, "Invalid order", detail));
        }
    };
    let quantity = match data.get("quantity") {
        None => Some(1),
        Some(q) => q.as_i64().filter(|q| (1..=1000).contains(q)),
    };
    match quantity {
        Some(q) => Ok((item, q as i32)),
        None => Err(problem(422, "Invalid quantity", "quantity must be 1 to 1000.")),
    }
}

/// The order handler, in the transaction it is given.
pub async fn create_order(
    tx: &Transaction<'_>,
    statements: &Statements,
    principal: &str,
    body: &[u8],
    delay_ms: u64,
) -> Result<Response, BoxError> {
    let (item, quantity) = match parse_order(body) {
        Ok(order) => order,
        Err(answer) => return Ok(answer),
    };
    if delay_ms > 0 {
        tx.execute(&statements.sleep, &[&(delay_ms as i64)]).await?;
    }
    let row = tx.query_one(&statements.insert_order, &[&principal, &item, &quantity]).await?;
    let (id, created_at): (i64, String) = (row.get(0), row.get(1));
    let document = json!({"id": id, "item": item, "quantity": quantity, "created_at": created_at});
    let mut response = json_response(201, document, Some(format!("/orders/{}", id)));
    response.resource_id = Some(id.to_string());
    Ok(response)
}

/// The same handler without the middleware: a plain transaction (the baseline).
pub async fn plain(
    client: &mut Client,
    statements: &Statements,
    principal: &str,
    body: &[u8],
    delay_ms: u64,
) -> Result<Response, Error> {
    let tx = client.transaction().await.map_err(Error::Db)?;
    let response =
        create_order(&tx, statements, principal, body, delay_ms).await.map_err(Error::Body)?;
    let ended = if response.status < 300 { tx.commit().await } else { tx.rollback().await };
    ended.map_err(Error::Db)?;
    Ok(response)
}

/// A new secret: 16 bytes from the kernel's random source, hex.
fn secret() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("sk_{}", bytes.iter().map(|b| format!("{:02x}", b)).collect::<String>()))
}

/// The API key handler: the secret is answered once (one_time_secret).
pub async fn create_api_key(
    tx: &Transaction<'_>,
    statements: &Statements,
    principal: &str,
    body: &[u8],
) -> Result<Response, BoxError> {
    let data: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let name = match data.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => {
            let detail = "The body must be a JSON object with a non-empty \"name\" string.";
            return Ok(problem(400, "Invalid API key request", detail));
        }
    };
    let row = tx.query_one(&statements.insert_api_key, &[&principal, &name]).await?;
    let id: i64 = row.get(0);
    let document = json!({"id": id, "name": name, "secret": secret()?});
    let mut response = json_response(201, document, Some(format!("/api-keys/{}", id)));
    response.resource_id = Some(id.to_string());
    response.one_time_secret = true;
    Ok(response)
}
