//! The HTTP side: responses, problem bodies, and the answers the server makes.
//!
//! No database here, and no table: the answer of every outcome that does not run the
//! handler comes whole from `idempotency.http_answer` (status, `[name, value]` pairs,
//! body; [`answer_response`] reads it), and the names and the client's own problems
//! are generated from `client/protocol.json` (module `generated`). Problem bodies are
//! byte-identical to the server's: `detail`, `status`, `title`, `type` in that
//! (sorted) order, no whitespace, non-ASCII characters as raw UTF-8.

use serde_json::{json, Value};

mod expiry;
pub use crate::generated::*;
pub use expiry::http_date;

/// The value of `NOT_KEPT_ENTRY`: the stream was larger than the service keeps.
pub const NOT_KEPT_VALUE: &str = "stream-too-large";

/// An HTTP response produced by a handler or by the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code (100..=599).
    pub status: u16,
    /// Header fields in order; names compare case-insensitively.
    pub headers: Vec<(String, String)>,
    /// Body bytes, sent and stored as they are.
    pub body: Vec<u8>,
    /// True when this is a stored response played back for a retry.
    pub replayed: bool,
    /// Id of what the request created, stored with the key (support, mismatch reports).
    pub resource_id: Option<String>,
    /// The response carries a secret (a new API key): sent once, never stored.
    pub one_time_secret: bool,
    /// A streamed response: the byte lengths of its chunks, in order (`body` is their
    /// concatenation); stored as the `:chunks` entry, replayed one chunk per length.
    pub chunks: Option<Vec<usize>>,
    /// A streamed response larger than `max_stream_bytes`: stored without its body, with
    /// the `:not_kept` entry alone; a retry gets 409 response-not-kept.
    pub stream_too_large: bool,
}

impl Response {
    /// A response with a status, headers and body; nothing else set.
    pub fn new(status: u16, headers: Vec<(String, String)>, body: impl Into<Vec<u8>>) -> Self {
        Response { status, headers, body: body.into(), ..Response::default() }
    }

    /// The value of the first header with this name (ASCII case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Replaces every header with this name by one with `value`, appended last.
    pub fn set_header(&mut self, name: &str, value: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
    }

    /// Sets `Idempotency-Expires` to the key row's expiry (seconds since the epoch),
    /// replacing any value already there; does nothing for None (no key row).
    pub fn set_expires(&mut self, expires_epoch: Option<i64>) {
        if let Some(epoch) = expires_epoch {
            self.set_header(EXPIRES_HEADER, &http_date(epoch));
        }
    }
}

/// Serializes an RFC 9457 problem object: members sorted, no whitespace.
pub fn problem_body(status: u16, type_uri: &str, title: &str, detail: &str) -> Vec<u8> {
    // serde_json's map is sorted (no preserve_order feature), as the server's bodies are.
    let document = json!({"detail": detail, "status": status, "title": title, "type": type_uri});
    serde_json::to_vec(&document).expect("a JSON object of strings serializes")
}

/// An `application/problem+json` response with `type` = `type_base` + slug.
pub fn problem_response(problem: Problem, detail: &str, type_base: &str) -> Response {
    let type_uri = format!("{}{}", type_base, problem.slug);
    let body = problem_body(problem.status, &type_uri, problem.title, detail);
    let headers = vec![("Content-Type".to_string(), PROBLEM_CONTENT_TYPE.to_string())];
    Response::new(problem.status, headers, body)
}

/// The answer of `idempotency.http_answer` as a `Response`: its status, its headers
/// in order (the `:chunks` entry of a stored stream taken out as `chunks`), its body.
pub fn answer_response(
    status: i32,
    headers_json: Option<&str>,
    body: Option<Vec<u8>>,
    resource_id: Option<String>,
) -> Response {
    let mut response = Response::new(status as u16, Vec::new(), body.unwrap_or_default());
    response.resource_id = resource_id;
    let pairs: Vec<(String, String)> =
        headers_json.and_then(|h| serde_json::from_str(h).ok()).unwrap_or_default();
    let mut lengths = None;
    for (name, value) in pairs {
        if name == STREAM_CHUNKS_ENTRY {
            lengths = Some(value);
        } else {
            response.headers.push((name, value));
        }
    }
    response.replayed = response.header(REPLAY_HEADER).is_some();
    // Lengths that do not fit the body: sent as one piece, all that can be done with it.
    response.chunks = lengths.and_then(|l| parse_chunk_lengths(&l, response.body.len()));
    response
}

/// The kept headers of a response as a JSON array of `[name, value]` pairs, in
/// their order, repeated names (Set-Cookie, Link) included. `Idempotency-Expires` is
/// never kept, whatever `kept` says: every answer gets the key row's own value. A
/// stream's reserved entry comes last; a stream too large to keep has that entry alone.
pub fn kept_headers_json<S: AsRef<str>>(response: &Response, kept: &[S]) -> String {
    if response.stream_too_large {
        return json!([[NOT_KEPT_ENTRY, NOT_KEPT_VALUE]]).to_string();
    }
    let mut pairs: Vec<Value> = response
        .headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(EXPIRES_HEADER))
        .filter(|(name, _)| kept.iter().any(|k| k.as_ref().eq_ignore_ascii_case(name)))
        .map(|(name, value)| json!([name, value]))
        .collect();
    if let Some(chunks) = &response.chunks {
        pairs.push(json!([STREAM_CHUNKS_ENTRY, chunk_lengths(chunks)]));
    }
    Value::Array(pairs).to_string()
}

/// Formats chunk lengths as the `:chunks` value ("5,5,3").
pub fn chunk_lengths(chunks: &[usize]) -> String {
    chunks.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
}

/// Reads a `:chunks` value; None unless it is decimal lengths that add up to `body_len`.
pub fn parse_chunk_lengths(text: &str, body_len: usize) -> Option<Vec<usize>> {
    let mut lengths = Vec::new();
    if !text.is_empty() {
        for part in text.split(',') {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            lengths.push(part.parse::<usize>().ok()?);
        }
    }
    let total = lengths.iter().try_fold(0usize, |sum, n| sum.checked_add(*n))?;
    (total == body_len).then_some(lengths)
}

/// 1 to `max_length` visible ASCII characters (space included), as every client checks.
pub fn valid_key(key: &str, max_length: usize) -> bool {
    !key.is_empty() && key.len() <= max_length && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
}
