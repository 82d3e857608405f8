//! Streamed responses (client/protocol.json's stream entries).
//!
//! `Client::handle_stream` gives the handler a [`StreamWriter`]: `start` sends the status
//! and headers, each `write` sends one chunk, as it is produced, to the transport (a
//! channel of [`StreamEvent`]s; `hyper_glue::stream_response` turns it into a hyper
//! response with a chunked body), and keeps a copy while the total stays within
//! `Options::max_stream_bytes`. When the handler returns, the key is completed with the
//! concatenation as body and the chunks' lengths in the reserved `:chunks` entry of the
//! stored headers; a replay sends the same chunks. Past the limit nothing of the body is
//! kept and the key is completed with `:not_kept` alone: a retry gets 409
//! response-not-kept. A stream whose status is not final is not stored. `End` (the end of
//! the chunked body) is sent only after the key's transaction committed.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::common::Error;
use crate::http::{problem_response, Problem, Response, REPLAY_HEADER};

/// The reserved entry of the stored headers that keeps a streamed response's chunk
/// lengths ("5,5,3"). No header can have this name; it is never sent.
pub const STREAM_CHUNKS_ENTRY: &str = ":chunks";
/// The reserved entry of the stored headers of a stream too large to keep.
pub const NOT_KEPT_ENTRY: &str = ":not_kept";
/// The value of `NOT_KEPT_ENTRY`.
pub const NOT_KEPT_VALUE: &str = "stream-too-large";
/// The longest streamed body kept by default (bytes).
pub const DEFAULT_MAX_STREAM_BYTES: usize = 1_048_576;
/// The detail of the 409 response-not-kept.
pub const NOT_KEPT_DETAIL: &str = "The first response to this request was streamed and was \
     larger than this service keeps; it was sent once and not stored. Use a new key for a new \
     request.";

/// What `Client::handle_stream` sends to the transport, in order.
#[derive(Debug)]
pub enum StreamEvent {
    /// A whole answer (a replay, a problem, a response that did not stream); a stored
    /// stream (`chunks` set) is sent one chunk per length. Nothing follows.
    Whole(Response),
    /// The status and headers of a live stream; chunks follow, then `End`.
    Head(Response),
    /// One chunk of a live stream.
    Chunk(Vec<u8>),
    /// The live stream ended and its key was settled: end the body. When the channel
    /// closes without it, the stream broke: abort the body (no last chunk).
    End,
}

#[derive(Debug, Default)]
struct Capture {
    started: bool,
    head: Response,
    kept: Vec<u8>,
    lengths: Vec<usize>,
    total: usize,
    too_large: bool,
    gone: bool,
    expires: Option<i64>,
}

/// The handler's side of a streamed response (cheap to clone; clones share the stream).
#[derive(Clone, Debug)]
pub struct StreamWriter {
    out: mpsc::Sender<StreamEvent>,
    limit: usize,
    capture: Arc<Mutex<Capture>>,
}

fn gone() -> Error {
    Error::Protocol("the client has gone: the stream was not completed".into())
}

impl StreamWriter {
    pub(crate) fn new(out: mpsc::Sender<StreamEvent>, limit: usize) -> Self {
        StreamWriter { out, limit, capture: Arc::new(Mutex::new(Capture::default())) }
    }

    fn capture(&self) -> std::sync::MutexGuard<'_, Capture> {
        self.capture.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends the status and headers (once; the key's `Idempotency-Expires` is added).
    pub async fn start(&self, status: u16, headers: Vec<(String, String)>) -> Result<(), Error> {
        let head = {
            let mut capture = self.capture();
            if capture.started {
                return Err(Error::Protocol("the stream was started already".into()));
            }
            capture.started = true;
            capture.head = Response::new(status, headers, Vec::new());
            let mut head = capture.head.clone();
            head.set_expires(capture.expires);
            head
        };
        self.out.send(StreamEvent::Head(head)).await.map_err(|_| {
            self.capture().gone = true;
            gone()
        })
    }

    /// Sends one chunk (an empty one is skipped: it would end the chunked body). Starts
    /// the stream as 200 without headers when `start` was not called. An error means the
    /// client has gone: stop; nothing will be stored.
    pub async fn write(&self, chunk: impl Into<Vec<u8>>) -> Result<(), Error> {
        let chunk = chunk.into();
        if !self.capture().started {
            self.start(200, Vec::new()).await?;
        }
        if chunk.is_empty() {
            return Ok(());
        }
        {
            let mut capture = self.capture();
            if capture.gone {
                return Err(gone());
            }
            capture.total += chunk.len();
            if !capture.too_large && capture.total > self.limit {
                capture.too_large = true; // never a truncated body: nothing of it is kept
                capture.kept = Vec::new();
                capture.lengths = Vec::new();
            }
            if !capture.too_large {
                capture.kept.extend_from_slice(&chunk);
                capture.lengths.push(chunk.len());
            }
        }
        self.out.send(StreamEvent::Chunk(chunk)).await.map_err(|_| {
            self.capture().gone = true;
            gone()
        })
    }

    pub(crate) fn started(&self) -> bool {
        self.capture().started
    }

    pub(crate) fn set_expires(&self, expires: Option<i64>) {
        self.capture().expires = expires;
    }

    /// The response the key stores: the head's status and headers, the handler's resource
    /// id and secret flag, the kept body and chunk lengths (or `stream_too_large`).
    pub(crate) fn stored(&self, answer: &Response) -> Result<Response, Error> {
        let capture = self.capture();
        if capture.gone {
            return Err(gone());
        }
        let mut stored = capture.head.clone();
        stored.resource_id = answer.resource_id.clone();
        stored.one_time_secret = answer.one_time_secret;
        if capture.too_large {
            stored.stream_too_large = true;
        } else {
            stored.body = capture.kept.clone();
            stored.chunks = Some(capture.lengths.clone());
        }
        Ok(stored)
    }

    pub(crate) async fn end(&self) {
        let _ = self.out.send(StreamEvent::End).await;
    }
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
    (total == body_len).then(|| lengths)
}

/// The chunks of a stored stream (one slice per length), or the whole body.
pub fn pieces(response: &Response) -> Vec<Vec<u8>> {
    match &response.chunks {
        None => vec![response.body.clone()],
        Some(lengths) => {
            let mut at = 0;
            let mut out = Vec::new();
            for &n in lengths {
                if n > 0 && at + n <= response.body.len() {
                    out.push(response.body[at..at + n].to_vec());
                }
                at += n;
            }
            out
        }
    }
}

/// A stored response as replayed: a stored stream gets its chunk lengths back (the
/// `:chunks` entry is never sent); a stream that was not kept becomes 409
/// response-not-kept (with `Idempotent-Replay`, as a one-time secret's retry).
pub fn restore_stream(mut stored: Response, type_base: &str) -> Response {
    if stored.header(NOT_KEPT_ENTRY).is_some() {
        let mut answer = problem_response(Problem::ResponseNotKept, NOT_KEPT_DETAIL, type_base);
        answer.replayed = true;
        answer.set_header(REPLAY_HEADER, "true");
        return answer;
    }
    let lengths = match stored.header(STREAM_CHUNKS_ENTRY) {
        Some(lengths) => lengths.to_string(),
        None => return stored,
    };
    stored.headers.retain(|(name, _)| name != STREAM_CHUNKS_ENTRY);
    // Lengths that do not fit the body: sent as one piece, all that can be done with it.
    stored.chunks = parse_chunk_lengths(&lengths, stored.body.len());
    stored
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{kept_headers_json, stored_response, DEFAULT_KEPT_HEADERS};

    #[test]
    fn stored_lengths_are_read_back_or_refused() {
        assert_eq!(parse_chunk_lengths("2,3", 5), Some(vec![2, 3]));
        assert_eq!(parse_chunk_lengths("", 0), Some(vec![]));
        assert_eq!(parse_chunk_lengths("2,2", 5), None);
        assert_eq!(parse_chunk_lengths("2,x", 5), None);
        assert_eq!(parse_chunk_lengths("+2,3", 5), None);
        assert_eq!(parse_chunk_lengths(",5", 5), None);
    }

    #[test]
    fn reserved_entries_are_stored_last_or_alone() {
        let mut response = Response::new(200, vec![("Content-Type".into(), "a/b".into())], "");
        response.chunks = Some(vec![2, 3]);
        assert_eq!(
            kept_headers_json(&response, &DEFAULT_KEPT_HEADERS),
            r#"[["Content-Type","a/b"],[":chunks","2,3"]]"#
        );
        response.stream_too_large = true;
        assert_eq!(
            kept_headers_json(&response, &DEFAULT_KEPT_HEADERS),
            r#"[[":not_kept","stream-too-large"]]"#
        );
    }

    #[test]
    fn a_stored_stream_is_replayed_in_its_chunks_and_a_not_kept_one_is_409() {
        let headers = r#"[["Content-Type","text/plain"],[":chunks","2,3"]]"#;
        let stored = stored_response(200, Some(headers), Some(b"aabbb".to_vec()), None);
        let replay = restore_stream(stored, "/p/");
        assert_eq!(replay.header(STREAM_CHUNKS_ENTRY), None);
        assert_eq!(pieces(&replay), vec![b"aa".to_vec(), b"bbb".to_vec()]);
        let headers = r#"[[":not_kept","stream-too-large"]]"#;
        let gone = restore_stream(stored_response(200, Some(headers), None, None), "/p/");
        assert_eq!(gone.status, 409);
        assert_eq!(gone.header(REPLAY_HEADER), Some("true"));
        assert!(String::from_utf8(gone.body).unwrap().contains("/p/response-not-kept"));
    }
}
