//! hyper 0.14 glue (feature `hyper`): read a request's key and body, send a `Response`,
//! and turn `Client::handle_stream`'s events into a streamed (chunked) response.

use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Body, StatusCode};
use tokio::sync::mpsc;

use crate::common::Request;
use crate::http::{Response, KEY_HEADER};
use crate::stream::{pieces, StreamEvent};

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
/// an impossible status becomes 500. A stored stream (`chunks` set) is sent as a chunked
/// body, one chunk per stored length (sent by a task: call it inside a tokio runtime).
pub fn into_hyper(response: Response) -> hyper::Response<Body> {
    let body = match response.chunks {
        None => Body::from(response.body.clone()),
        Some(_) => {
            let (mut sender, body) = Body::channel();
            let pieces = pieces(&response);
            tokio::spawn(async move {
                for piece in pieces {
                    if sender.send_data(Bytes::from(piece)).await.is_err() {
                        return; // the client has gone
                    }
                }
            });
            body
        }
    };
    with_head(&response, body)
}

fn with_head(response: &Response, body: Body) -> hyper::Response<Body> {
    let mut out = hyper::Response::new(body);
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
fn field_value(value: &str) -> Option<HeaderValue> {
    let octets: Option<Vec<u8>> = value.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
    HeaderValue::from_bytes(&octets?).ok()
}

/// The hyper response of a `Client::handle_stream` call whose events come on `events`:
/// waits for the first event; a live stream's chunks are then forwarded to a chunked body
/// as they come, one chunk each, and the body ends at `End` (or is aborted, no last
/// chunk, when the events stop without it). A call that ended in an error before any
/// event is a 500. When the client goes away, the forwarding stops and the writer's next
/// `write` fails, so the handler stops and nothing is stored.
pub async fn stream_response(mut events: mpsc::Receiver<StreamEvent>) -> hyper::Response<Body> {
    let head = match events.recv().await {
        Some(StreamEvent::Whole(response)) => return into_hyper(response),
        Some(StreamEvent::Head(head)) => head,
        _ => {
            let mut failed = hyper::Response::new(Body::from("Internal error"));
            *failed.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return failed;
        }
    };
    let (mut sender, body) = Body::channel();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Some(StreamEvent::Chunk(chunk)) => {
                    if sender.send_data(Bytes::from(chunk)).await.is_err() {
                        return; // drops `events`: the writer sees the client gone
                    }
                }
                Some(StreamEvent::End) => return, // the body ends with the last chunk
                _ => {
                    sender.abort(); // broken: no last chunk, the client sees it
                    return;
                }
            }
        }
    });
    with_head(&head, body)
}

#[cfg(test)]
mod tests {
    use super::field_value;

    #[test]
    fn every_stored_field_value_replays() {
        let value = field_value("a\tb c\u{80}\u{e9}\u{ff}").expect("a field value");
        assert_eq!(value.as_bytes(), b"a\tb c\x80\xe9\xff");
        assert!(field_value("20 \u{20ac}").is_none(), "above U+00FF is not one octet");
        assert!(field_value("a\nb").is_none(), "LF is refused by HeaderValue too");
    }
}
