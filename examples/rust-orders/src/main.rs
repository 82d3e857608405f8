//! rust-orders: the orders service of examples/orders-service on axum 0.8 and
//! tokio-postgres, idempotent through the pg_idempotency crate (client/rust).
//!
//!     rust-orders --port 8080 --dsn "host=... dbname=..." [--threads 8]
//!
//! Same routes, bodies and headers as the C++ and Python services:
//!
//!     POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
//!                           Authorization: Bearer <principal>; ?delay_ms=N slows the handler
//!     POST /reject/orders   the same in reject mode: a duplicate of a running request
//!                           gets 409 with Retry-After at once instead of waiting
//!     POST /plain/orders    the same handler without the middleware (baseline)
//!     POST /classic/orders  the same as /orders
//!     POST /flaky/orders    the first run for each (principal, key) inserts the order,
//!                           then answers 500: rolled back, not stored, the retry runs again
//!     POST /orders/stream   {"chunks": n, "chunk_bytes": m}: one order, then 200 text/plain
//!                           streamed as n chunks of m bytes (chunk i: digit i % 10); kept up
//!                           to 65536 bytes, a retry of a longer stream gets 409
//!     POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
//!     GET  /orders/count    {"orders": n}
//!     GET  /health          ok

mod orders;
mod pool;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request as HttpRequest;
use axum::http::Method;
use pg_idempotency::axum_glue::{into_axum, read_request};
use pg_idempotency::{Client, Error, Options, Response};

pub use orders::problem;
use orders::{create_api_key, create_order, Route};
use pool::Pool;

pub struct App {
    pool: Pool,
    client: Client,
    flaky: orders::FirstRuns,
}

fn principal_of(request: &HttpRequest) -> Option<String> {
    let auth = request.headers().get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ").filter(|p| !p.is_empty()).map(str::to_string)
}

fn delay_ms(request: &HttpRequest) -> u64 {
    let query = request.uri().query().unwrap_or("");
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("delay_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// POST /orders/stream is answered as a stream; every other route as one response.
async fn serve(app: Arc<App>, request: HttpRequest) -> axum::response::Response {
    if request.method() != Method::POST || request.uri().path() != "/orders/stream" {
        return into_axum(route(app, request).await);
    }
    let principal = match principal_of(&request) {
        Some(p) => p,
        None => {
            let detail = "Send Authorization: Bearer <token>.";
            return into_axum(problem(401, "Unauthorized", detail));
        }
    };
    match read_request(request, &principal).await {
        Ok(req) => stream::serve(app, req).await,
        Err(e) => into_axum(problem(400, "Bad request", &e.to_string())),
    }
}

async fn route(app: Arc<App>, request: HttpRequest) -> Response {
    let path = request.uri().path().to_string();
    if request.method() == Method::GET && path == "/health" {
        return Response::new(200, vec![("Content-Type".into(), "text/plain".into())], "ok");
    }
    if request.method() == Method::GET && path == "/orders/count" {
        return match app.pool.count_orders().await {
            Ok(n) => orders::json_response(200, serde_json::json!({ "orders": n }), None),
            Err(e) => failed(&app, Error::Db(e)),
        };
    }
    let route = match (request.method() == Method::POST, Route::of(&path)) {
        (true, Some(route)) => route,
        _ => return problem(404, "Not found", "No such route."),
    };
    let principal = match principal_of(&request) {
        Some(p) => p,
        None => return problem(401, "Unauthorized", "Send Authorization: Bearer <token>."),
    };
    let delay = delay_ms(&request);
    let mut req = match read_request(request, &principal).await {
        Ok(req) => req,
        Err(e) => return problem(400, "Bad request", &e.to_string()),
    };
    req.duplicates = route.duplicates();
    let mut slot = match app.pool.get().await {
        Ok(slot) => slot,
        Err(e) => return failed(&app, Error::Db(e)),
    };
    let insert = slot.statements.clone();
    let body = req.body.clone().unwrap_or_default();
    let result = if route == Route::Plain {
        orders::plain(slot.conn.client(), &insert, &principal, &body, delay).await
    } else {
        let key = req.key.clone().unwrap_or_default();
        app.client
            .handle(&mut slot.conn, &req, |tx| {
                let (insert, principal, body) = (insert.clone(), principal.clone(), body.clone());
                let (app, key) = (app.clone(), key.clone());
                Box::pin(async move {
                    let mut response = match route {
                        Route::ApiKeys => create_api_key(tx, &insert, &principal, &body).await?,
                        _ => create_order(tx, &insert, &principal, &body, delay).await?,
                    };
                    let failing = route == Route::Flaky && response.status < 300;
                    if failing && app.flaky.first(&principal, &key) {
                        let detail = "The request failed; it is safe to retry with the same key.";
                        response = problem(500, "Internal error", detail);
                    }
                    Ok(response)
                })
            })
            .await
    };
    match result {
        Ok(response) => {
            app.pool.put(slot);
            response
        }
        Err(e) => {
            // After an error the connection is not trusted: dropped, never put back.
            drop(slot);
            failed(&app, e)
        }
    }
}

/// The answer to an error of the database: the one fault answer for a database fault
/// (and the pool's idle connections closed: a restart ended them all), else a 500 that
/// does not show the driver's text; the error itself goes to the log.
pub fn failed(app: &App, error: Error) -> Response {
    eprintln!("rust-orders: {}", error);
    if error.is_database_fault() {
        app.pool.discard_idle();
        return app.client.fault_response();
    }
    problem(500, "Internal error", "The request failed; it is safe to retry with the same key.")
}

fn argument(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = argument(&args, "--threads").and_then(|t| t.parse().ok()).unwrap_or(8);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(serve_forever(args, threads));
}

async fn serve_forever(args: Vec<String>, threads: usize) {
    let port: u16 = argument(&args, "--port").and_then(|p| p.parse().ok()).unwrap_or(8080);
    let dsn = argument(&args, "--dsn").unwrap_or_default();
    let pool = match Pool::open(&dsn, threads) {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("rust-orders: bad --dsn: {}", e);
            std::process::exit(1);
        }
    };
    // The tables are made once the database answers: the service starts while its
    // database is down (or restarting) and serves when it is back.
    tokio::spawn(pool::prepare(pool.config()));
    // POST /orders/stream: a stream longer than 65536 bytes is sent once, not kept.
    let client = Client::new(Options { max_stream_bytes: 65536, ..Options::default() });
    let app = Arc::new(App { pool, client, flaky: orders::FirstRuns::default() });
    let router = axum::Router::new().fallback(move |request: HttpRequest| {
        let app = app.clone();
        async move { serve(app, request).await }
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("rust-orders: {}", e);
            std::process::exit(1);
        }
    };
    eprintln!("rust-orders: listening on 127.0.0.1:{}", port);
    if let Err(e) = axum::serve(listener, router).await {
        eprintln!("rust-orders: {}", e);
        std::process::exit(1);
    }
}
