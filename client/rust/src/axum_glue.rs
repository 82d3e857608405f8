//! axum 0.8 (hyper 1) glue, feature `axum`: read a request's key and body, send a
//! `Response` (a stored stream one chunk per stored length), turn
//! `Client::handle_stream`'s events into a streamed body, and [`LeaseLayer`], a tower
//! layer that runs the routes under it through a [`LeaseRunner`].
//!
//! ```no_run
//! # fn doc(runner: pg_idempotency::LeaseRunner) {
//! use std::sync::Arc;
//! use axum::{routing::post, Router};
//! use pg_idempotency::axum_glue::LeaseLayer;
//!
//! let layer = LeaseLayer::new(Arc::new(runner), |parts: &axum::http::request::Parts| {
//!     let auth = parts.headers.get("authorization")?.to_str().ok()?;
//!     auth.strip_prefix("Bearer ").map(str::to_string) // the principal
//! });
//! let app: Router = Router::new().route("/charges", post(|| async { "charged" })).layer(layer);
//! # }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::header::{HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};

use crate::common::Request;
use crate::error::BoxError;
use crate::http::{Response, KEY_HEADER};
use crate::lease::LeaseRunner;
use crate::stream::{pieces, StreamEvent};

/// The largest request body read (bytes); a longer one is answered 413.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The Idempotency-Key header as text; a value that is not visible ASCII is kept as
/// lossy UTF-8 so that the key check answers 400 malformed (not missing).
pub fn key_of(headers: &HeaderMap) -> Option<String> {
    headers.get(KEY_HEADER).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Reads the whole body of an axum request (at most `MAX_BODY_BYTES`) into a `Request`
/// for `principal`.
pub async fn read_request(
    request: axum::extract::Request,
    principal: &str,
) -> Result<Request, axum::Error> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await?;
    Ok(request_of(&parts, principal, &bytes))
}

fn request_of(parts: &Parts, principal: &str, body: &Bytes) -> Request {
    let (method, path) = (parts.method.as_str(), parts.uri.path());
    Request::new(principal, key_of(&parts.headers), method, path, Some(body.to_vec()))
}

/// A `Response` as an axum response; headers that HTTP cannot carry are skipped and an
/// impossible status becomes 500. A stored stream (`chunks` set) is sent one chunk per
/// stored length.
pub fn into_axum(response: Response) -> axum::response::Response {
    let body = match response.chunks {
        None => Body::from(response.body.clone()),
        Some(_) => {
            let chunks = pieces(&response).into_iter().map(|p| Ok::<_, Infallible>(Bytes::from(p)));
            Body::from_stream(futures_util::stream::iter(chunks))
        }
    };
    with_head(&response, body)
}

fn with_head(response: &Response, body: Body) -> axum::response::Response {
    let mut out = axum::response::Response::new(body);
    *out.status_mut() =
        StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in &response.headers {
        if let (Ok(n), Some(v)) = (HeaderName::from_bytes(name.as_bytes()), field_value(value)) {
            out.headers_mut().append(n, v);
        }
    }
    out
}

/// A stored header value as the octets it stands for: the server keeps only RFC 9110
/// field values (visible ASCII, SP, HTAB and U+0080..U+00FF, obs-text as Latin-1), so
/// every character is one octet. `HeaderValue::from_str` takes visible ASCII only and
/// would drop a value with obs-text from the replay.
pub fn field_value(value: &str) -> Option<HeaderValue> {
    let octets: Option<Vec<u8>> = value.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
    HeaderValue::from_bytes(&octets?).ok()
}

/// The axum response of a `Client::handle_stream` call whose events come on `events`:
/// waits for the first event; a live stream's chunks are then sent as they come, and the
/// body ends at `End` (or is aborted, no last chunk, when the events stop without it). A
/// call that ended in an error before any event is a 500. When the client goes away, the
/// body is dropped with `events`, so the writer's next `write` fails and nothing is stored.
pub async fn stream_response(mut events: mpsc::Receiver<StreamEvent>) -> axum::response::Response {
    let head = match events.recv().await {
        Some(StreamEvent::Whole(response)) => return into_axum(response),
        Some(StreamEvent::Head(head)) => head,
        _ => {
            let mut failed = axum::response::Response::new(Body::from("Internal error"));
            *failed.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return failed;
        }
    };
    let chunks = futures_util::stream::unfold(Some(events), |events| async move {
        let mut events = events?;
        match events.recv().await {
            Some(StreamEvent::Chunk(chunk)) => {
                Some((Ok::<_, BoxError>(Bytes::from(chunk)), Some(events)))
            }
            Some(StreamEvent::End) => None, // the body ends with the last chunk
            _ => Some((Err("the stream broke".into()), None)), // aborted: no last chunk
        }
    });
    with_head(&head, Body::from_stream(chunks))
}

/// Who a request's key belongs to, from its head (authentication); None: the request
/// is passed on without the lease protocol.
pub type PrincipalOf = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// A tower layer that runs the routes under it through a `LeaseRunner`: a request with
/// a principal and a key is acquired, the inner service is the body (its whole response
/// is what the runner's policy settles, stores and replays), and the answer is the
/// runner's. A request without a principal, or a GET/HEAD/OPTIONS without a key, goes to
/// the inner service as it is.
#[derive(Clone)]
pub struct LeaseLayer {
    runner: Arc<LeaseRunner>,
    principal: PrincipalOf,
}

impl LeaseLayer {
    /// A layer over `runner`, with the principal of each request from `principal`.
    pub fn new<F>(runner: Arc<LeaseRunner>, principal: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        LeaseLayer { runner, principal: Arc::new(principal) }
    }
}

impl<S> Layer<S> for LeaseLayer {
    type Service = LeaseService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaseService { inner, runner: self.runner.clone(), principal: self.principal.clone() }
    }
}

/// The service of a `LeaseLayer`.
#[derive(Clone)]
pub struct LeaseService<S> {
    inner: S,
    runner: Arc<LeaseRunner>,
    principal: PrincipalOf,
}

type Answer = Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;

impl<S> Service<axum::extract::Request> for LeaseService<S>
where
    S: Service<axum::extract::Request, Response = axum::response::Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Answer {
        let inner = self.inner.clone();
        let (runner, principal) = (self.runner.clone(), self.principal.clone());
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let safe = matches!(parts.method.as_str(), "GET" | "HEAD" | "OPTIONS");
            let principal = match principal(&parts) {
                Some(p) if !(safe && key_of(&parts.headers).is_none()) => p,
                _ => return inner.oneshot(axum::extract::Request::from_parts(parts, body)).await,
            };
            let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
                Ok(bytes) => bytes,
                Err(_) => return Ok(status(StatusCode::PAYLOAD_TOO_LARGE)),
            };
            let request = request_of(&parts, &principal, &bytes);
            let run = runner.run(&request, || async move {
                let forwarded = axum::extract::Request::from_parts(parts, Body::from(bytes));
                let answer = inner.oneshot(forwarded).await.unwrap_or_else(|never| match never {});
                collect(answer).await
            });
            Ok(match run.await {
                Ok(result) => into_axum(result.response),
                Err(error) if error.is_database_fault() => {
                    let options = runner.options();
                    let retry = crate::http::DEFAULT_RETRY_AFTER_SECONDS;
                    into_axum(crate::fault::database_fault_response(
                        retry,
                        &options.problem_type_base,
                    ))
                }
                Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR),
            })
        })
    }
}

fn status(code: StatusCode) -> axum::response::Response {
    let mut response = axum::response::Response::new(Body::empty());
    *response.status_mut() = code;
    response
}

/// An axum response read whole into a `Response` (what the runner stores and replays).
async fn collect(answer: axum::response::Response) -> Result<Response, axum::Error> {
    let (parts, body) = answer.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await?;
    let headers = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (n.as_str().to_string(), v.as_bytes().iter().map(|&b| char::from(b)).collect())
        })
        .collect();
    Ok(Response::new(parts.status.as_u16(), headers, bytes.to_vec()))
}
