//! Streamed responses (client/protocol.json's stream entries).
//!
//! `Client::handle_stream` gives the handler a [`StreamWriter`]: `start` sends the status
//! and headers, each `write` sends one chunk, as it is produced, to the transport (a
//! channel of [`StreamEvent`]s; `axum_glue::stream_response` turns it into an axum
//! response with a chunked body), and keeps a copy while the total stays within
//! `Options::max_stream_bytes`. When the handler returns, the key is completed with the
//! concatenation as body and the chunks' lengths in the reserved `:chunks` entry of the
//! stored headers; a replay sends the same chunks. Past the limit nothing of the body is
//! kept and the key is completed with `:not_kept` alone: a retry gets 409
//! response-not-kept. A stream whose status is not final is not stored. `End` (the end of
//! the chunked body) is sent only after the key's transaction committed.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::error::Error;
use crate::http::Response;

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
        self.send(StreamEvent::Head(head)).await
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
        self.send(StreamEvent::Chunk(chunk)).await
    }

    /// Sends one event to the transport; an error (and the stream marked gone) when the
    /// client has gone.
    async fn send(&self, event: StreamEvent) -> Result<(), Error> {
        self.out.send(event).await.map_err(|_| {
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
