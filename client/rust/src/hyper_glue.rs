//! hyper 0.14 glue (feature `hyper`): read a request's key and body, send a `Response`.

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Body, StatusCode};

use crate::common::Request;
use crate::http::{Response, KEY_HEADER};

/// The Idempotency-Key header as text; a value that is not visible ASCII is kept as
/// lossy UTF-8 so that the key check answers 400 malformed (not missing).
pub fn key_of(headers: &hyper::HeaderMap) -> Option<String> {
    headers.get(KEY_HEADER).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Reads the whole body of a hyper request into a `Request` for `principal`.
pub async fn read_request(
    request: hyper::Request<Body>,
    principal: &str,
) -> Result<Request, hyper::Error> {
    let (parts, body) = request.into_parts();
    let bytes = hyper::body::to_bytes(body).await?;
    Ok(Request::new(
        principal,
        key_of(&parts.headers),
        parts.method.as_str(),
        parts.uri.path(),
        Some(bytes.to_vec()),
    ))
}

/// A `Response` as a hyper response; headers that hyper cannot carry are skipped and
/// an impossible status becomes 500.
pub fn into_hyper(response: Response) -> hyper::Response<Body> {
    let mut out = hyper::Response::new(Body::from(response.body));
    *out.status_mut() =
        StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in &response.headers {
        if let (Ok(n), Ok(v)) =
            (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value))
        {
            out.headers_mut().append(n, v);
        }
    }
    out
}
