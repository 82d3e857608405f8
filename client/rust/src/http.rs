//! The HTTP side: responses, the problem table and RFC 9457 problem bodies.
//!
//! No database here. The table is the one of `client/protocol.json` (a test compares
//! it field by field with that file); problem bodies are byte-identical to the C++
//! and Python clients': the members `detail`, `status`, `title`, `type` in that
//! (sorted) order, no whitespace, non-ASCII characters as raw UTF-8.

use serde_json::{json, Value};

mod expiry;
pub use expiry::{
    http_date, DuplicateMode, DEFAULT_DUPLICATE_MODE, DUPLICATE_MODES, EXPIRES_FORMAT,
    EXPIRES_HEADER,
};

/// `Content-Type` of every problem body.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
/// Default prefix of problem `type` URIs.
pub const PROBLEM_TYPE_BASE: &str = "/problems/";
/// The header that marks a stored response played back.
pub const REPLAY_HEADER: &str = "Idempotent-Replay";
/// The request header that carries the key.
pub const KEY_HEADER: &str = "Idempotency-Key";
/// Retry-After (seconds) of a 409 for a key held by a transaction.
pub const DEFAULT_RETRY_AFTER_SECONDS: u32 = 1;
/// Response headers stored with the key and replayed, by default.
pub const DEFAULT_KEPT_HEADERS: [&str; 5] =
    ["Content-Type", "Location", "ETag", "Content-Location", "Last-Modified"];

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

/// The problem types of the bodies the client produces (`problems` in protocol.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// 400: a method that needs a key came without one.
    KeyMissing,
    /// 400: empty, too long, not visible ASCII, or refused by the server (22P02).
    KeyMalformed,
    /// 400: the body cannot be fingerprinted (JSON nested too deep).
    BodyInvalid,
    /// 422: the key was used for another request.
    KeyReuse,
    /// 409: the key is held by a running request (Retry-After).
    RequestInProgress,
    /// 409: the first response carried a one-time secret and was not kept.
    OneTimeSecret,
    /// 409: lease policies once / commit_on_success: done before, result not kept.
    AlreadyProcessed,
    /// 410: the key expired under an on_expiry 'refuse' policy (a tombstone).
    KeyExpired,
    /// 409: the first response was a stream larger than `max_stream_bytes`, not kept.
    ResponseNotKept,
    /// 503: the database failed under the request (`fault::database_fault_response`).
    DatabaseUnavailable,
}

impl Problem {
    /// Every problem type, in protocol.json's order.
    pub const ALL: [Problem; 10] = [
        Problem::KeyMissing,
        Problem::KeyMalformed,
        Problem::BodyInvalid,
        Problem::KeyReuse,
        Problem::RequestInProgress,
        Problem::OneTimeSecret,
        Problem::AlreadyProcessed,
        Problem::KeyExpired,
        Problem::ResponseNotKept,
        Problem::DatabaseUnavailable,
    ];

    /// The name of this problem in protocol.json (`key_reuse`).
    pub fn name(self) -> &'static str {
        self.row().0
    }

    /// The slug appended to the type base (`idempotency-key-reuse`).
    pub fn slug(self) -> &'static str {
        self.row().1
    }

    /// The HTTP status of this problem type.
    pub fn status(self) -> u16 {
        self.row().2
    }

    /// The fixed, human-readable title.
    pub fn title(self) -> &'static str {
        self.row().3
    }

    fn row(self) -> (&'static str, &'static str, u16, &'static str) {
        match self {
            Problem::KeyMissing => {
                ("key_missing", "idempotency-key-missing", 400, "Idempotency-Key header is missing")
            }
            Problem::KeyMalformed => (
                "key_malformed",
                "idempotency-key-malformed",
                400,
                "Idempotency-Key header is malformed",
            ),
            Problem::BodyInvalid => (
                "body_invalid",
                "request-body-invalid",
                400,
                "Request body cannot be fingerprinted",
            ),
            Problem::KeyReuse => (
                "key_reuse",
                "idempotency-key-reuse",
                422,
                "Idempotency-Key was used for another request",
            ),
            Problem::RequestInProgress => (
                "request_in_progress",
                "request-in-progress",
                409,
                "A request with this Idempotency-Key is in progress",
            ),
            Problem::OneTimeSecret => (
                "one_time_secret",
                "one-time-secret",
                409,
                "The response to this request was sent once and not kept",
            ),
            Problem::AlreadyProcessed => (
                "already_processed",
                "request-already-processed",
                409,
                "This request was already processed",
            ),
            Problem::KeyExpired => {
                ("key_expired", "idempotency-key-expired", 410, "Idempotency-Key has expired")
            }
            Problem::ResponseNotKept => (
                "response_not_kept",
                "response-not-kept",
                409,
                "The response to this request was too large to keep",
            ),
            Problem::DatabaseUnavailable => {
                ("database_unavailable", "database-unavailable", 503, "The database is unavailable")
            }
        }
    }
}

/// What `begin` / `acquire` answered (`outcomes` in protocol.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// No live row: the key is held, run the handler.
    Started,
    /// A completed row of the same request: send the stored response.
    Replay,
    /// A live row of another request: 422.
    Mismatch,
    /// Held by a running transaction past `wait`, or by a live lease: 409.
    InProgress,
    /// The stored response carried a one-time secret: 409.
    SecretReplay,
    /// The key expired under an on_expiry 'refuse' policy (a tombstone): 410, with
    /// Idempotency-Expires set to the (past) expiry begin/acquire returned.
    Expired,
}

/// How an outcome maps to HTTP (one row of `outcomes` in protocol.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// True when the handler runs.
    pub run_handler: bool,
    /// The stored response is sent (replay).
    pub stored_response: bool,
    /// The problem answered instead of running the handler.
    pub problem: Option<Problem>,
    /// `Idempotent-Replay: true` is sent.
    pub replayed: bool,
    /// `Retry-After` is sent.
    pub retry_after: bool,
    /// The problem's `detail`.
    pub detail: Option<&'static str>,
}

impl Outcome {
    /// Every outcome, in protocol.json's order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Started,
        Outcome::Replay,
        Outcome::Mismatch,
        Outcome::InProgress,
        Outcome::SecretReplay,
        Outcome::Expired,
    ];

    /// The outcome as the server spells it (`in_progress`).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Started => "started",
            Outcome::Replay => "replay",
            Outcome::Mismatch => "mismatch",
            Outcome::InProgress => "in_progress",
            Outcome::SecretReplay => "secret_replay",
            Outcome::Expired => "expired",
        }
    }

    /// Parses the server's spelling; None for an unknown outcome.
    pub fn parse(name: &str) -> Option<Outcome> {
        Outcome::ALL.iter().copied().find(|o| o.name() == name)
    }

    /// The outcome -> HTTP mapping every client shares.
    pub fn mapping(self) -> Mapping {
        let none = Mapping {
            run_handler: false,
            stored_response: false,
            problem: None,
            replayed: false,
            retry_after: false,
            detail: None,
        };
        match self {
            Outcome::Started => Mapping { run_handler: true, ..none },
            Outcome::Replay => Mapping { stored_response: true, replayed: true, ..none },
            Outcome::Mismatch => Mapping {
                problem: Some(Problem::KeyReuse),
                detail: Some(
                    "This Idempotency-Key was used for a different request; \
                     use a new key for a new request.",
                ),
                ..none
            },
            Outcome::InProgress => Mapping {
                problem: Some(Problem::RequestInProgress),
                retry_after: true,
                detail: Some(
                    "A request with this Idempotency-Key is still being processed; retry later.",
                ),
                ..none
            },
            Outcome::SecretReplay => Mapping {
                problem: Some(Problem::OneTimeSecret),
                replayed: true,
                detail: Some(
                    "The first response to this request carried a secret and was not kept; \
                     create a new one with a new key.",
                ),
                ..none
            },
            Outcome::Expired => Mapping {
                problem: Some(Problem::KeyExpired),
                detail: Some(
                    "This Idempotency-Key expired and its response is no longer kept; \
                     the request was not run again. Use a new key for a new request.",
                ),
                ..none
            },
        }
    }
}

/// Serializes an RFC 9457 problem object as the C++ client (nlohmann_json) does.
pub fn problem_body(status: u16, type_uri: &str, title: &str, detail: &str) -> Vec<u8> {
    // serde_json's map is sorted (no preserve_order feature), as nlohmann_json's is.
    let document = json!({"detail": detail, "status": status, "title": title, "type": type_uri});
    serde_json::to_vec(&document).expect("a JSON object of strings serializes")
}

/// An `application/problem+json` response with `type` = `type_base` + slug.
pub fn problem_response(problem: Problem, detail: &str, type_base: &str) -> Response {
    let type_uri = format!("{}{}", type_base, problem.slug());
    let body = problem_body(problem.status(), &type_uri, problem.title(), detail);
    let headers = vec![("Content-Type".to_string(), PROBLEM_CONTENT_TYPE.to_string())];
    Response::new(problem.status(), headers, body)
}

/// The answer for an outcome that does not run the handler and sends a problem
/// (mismatch, in_progress, secret_replay, expired); `retry_after` is used when the mapping
/// asks for it. None for started and replay.
pub fn outcome_problem(outcome: Outcome, type_base: &str, retry_after: u32) -> Option<Response> {
    let mapping = outcome.mapping();
    let problem = mapping.problem?;
    let mut response = problem_response(problem, mapping.detail.unwrap_or(""), type_base);
    if mapping.retry_after {
        response.set_header("Retry-After", &retry_after.max(1).to_string());
    }
    if mapping.replayed {
        response.replayed = true;
        response.set_header(REPLAY_HEADER, "true");
    }
    Some(response)
}

/// The kept headers of a response as a JSON array of `[name, value]` pairs, in
/// their order, repeated names (Set-Cookie, Link) included. `Idempotency-Expires` is
/// never kept, whatever `kept` says: every answer gets the key row's own value. A
/// stream's reserved entry comes last; a stream too large to keep has that entry alone.
pub fn kept_headers_json<S: AsRef<str>>(response: &Response, kept: &[S]) -> String {
    use crate::stream::{chunk_lengths, NOT_KEPT_ENTRY, NOT_KEPT_VALUE, STREAM_CHUNKS_ENTRY};
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

/// A stored response as it is replayed: kept headers, `Idempotent-Replay: true`.
/// `headers_json` is the stored array of pairs or an object of name -> value.
pub fn stored_response(
    status: u16,
    headers_json: Option<&str>,
    body: Option<Vec<u8>>,
    resource_id: Option<String>,
) -> Response {
    let mut response = Response::new(status, Vec::new(), body.unwrap_or_default());
    response.resource_id = resource_id;
    response.replayed = true;
    let stored: Value =
        headers_json.and_then(|h| serde_json::from_str(h).ok()).unwrap_or(Value::Null);
    let mut push = |name: &Value, value: &Value| {
        if let (Some(n), Some(v)) = (name.as_str(), value.as_str()) {
            response.headers.push((n.to_string(), v.to_string()));
        }
    };
    match &stored {
        Value::Array(pairs) => {
            for pair in pairs {
                if let Some([name, value]) = pair.as_array().map(|p| p.as_slice()) {
                    push(name, value);
                }
            }
        }
        Value::Object(map) => {
            for (name, value) in map {
                push(&Value::String(name.clone()), value);
            }
        }
        _ => {}
    }
    response.set_header(REPLAY_HEADER, "true");
    response
}

/// 1 to `max_length` visible ASCII characters (space included), as every client checks.
pub fn valid_key(key: &str, max_length: usize) -> bool {
    !key.is_empty() && key.len() <= max_length && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// The reason phrase of a status for a status line ("Created"); "Unknown" otherwise.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_body_is_sorted_and_compact() {
        let body = problem_response(Problem::KeyReuse, "d\u{e9}", "/p/").body;
        let expected = "{\"detail\":\"d\u{e9}\",\"status\":422,\
                        \"title\":\"Idempotency-Key was used for another request\",\
                        \"type\":\"/p/idempotency-key-reuse\"}";
        assert_eq!(String::from_utf8(body).unwrap(), expected);
    }

    #[test]
    fn stored_headers_keep_order_and_repeats() {
        let response = stored_response(
            201,
            Some(r#"[["Set-Cookie","a=1"],["Set-Cookie","b=2"],["Location","/x"]]"#),
            Some(b"{}".to_vec()),
            None,
        );
        let names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Set-Cookie", "Set-Cookie", "Location", REPLAY_HEADER]);
        assert!(response.replayed);
    }

    #[test]
    fn keys_are_visible_ascii() {
        assert!(valid_key("k", 255));
        assert!(valid_key(&"k".repeat(255), 255));
        assert!(!valid_key(&"k".repeat(256), 255));
        assert!(!valid_key("", 255));
        assert!(!valid_key("cl\u{e9}", 255));
        assert!(!valid_key("a\tb", 255));
    }

    #[test]
    fn kept_headers_are_filtered_in_order() {
        let mut response = Response::new(201, Vec::new(), "");
        response.headers.push(("location".into(), "/o/1".into()));
        response.headers.push(("X-Trace".into(), "t".into()));
        response.headers.push(("Content-Type".into(), "application/json".into()));
        let json = kept_headers_json(&response, &DEFAULT_KEPT_HEADERS);
        assert_eq!(json, r#"[["location","/o/1"],["Content-Type","application/json"]]"#);
    }

    #[test]
    fn the_expiry_header_is_never_kept_and_set_once() {
        let mut response = Response::new(201, Vec::new(), "");
        response.headers.push(("idempotency-expires".into(), "the handler's".into()));
        response.headers.push(("Location".into(), "/o/1".into()));
        let kept = [EXPIRES_HEADER, "Location"];
        assert_eq!(kept_headers_json(&response, &kept), r#"[["Location","/o/1"]]"#);
        response.set_expires(None);
        assert_eq!(response.header(EXPIRES_HEADER), Some("the handler's"));
        response.set_expires(Some(784_111_777));
        let values: Vec<&str> = response
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(EXPIRES_HEADER))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(values, ["Sun, 06 Nov 1994 08:49:37 GMT"]);
    }
}
