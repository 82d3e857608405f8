//! The HTTP side without a database: problem bodies, the server's answers read back,
//! kept headers, key checks.

use pg_idempotency::http::*;

#[test]
fn problem_body_is_sorted_and_compact() {
    let body = problem_response(Problem::KEY_MALFORMED, "d\u{e9}", "/p/").body;
    let expected = "{\"detail\":\"d\u{e9}\",\"status\":400,\
                    \"title\":\"Idempotency-Key header is malformed\",\
                    \"type\":\"/p/idempotency-key-malformed\"}";
    assert_eq!(String::from_utf8(body).unwrap(), expected);
}

#[test]
fn answers_keep_order_and_repeats_and_give_chunks_back() {
    let headers = r#"[["Set-Cookie","a=1"],["Set-Cookie","b=2"],[":chunks","2,3"],
        ["Idempotent-Replay","true"]]"#;
    let response = answer_response(201, Some(headers), Some(b"aabbb".to_vec()), None);
    let names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Set-Cookie", "Set-Cookie", REPLAY_HEADER]);
    assert!(response.replayed);
    assert_eq!(response.chunks, Some(vec![2, 3]));
    let odd = answer_response(200, Some(r#"[[":chunks","2,2"]]"#), Some(b"abc".to_vec()), None);
    assert_eq!(odd.chunks, None, "lengths that do not fit: one piece");
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
fn stored_lengths_are_read_back_or_refused() {
    assert_eq!(parse_chunk_lengths("2,3", 5), Some(vec![2, 3]));
    assert_eq!(parse_chunk_lengths("", 0), Some(vec![]));
    assert_eq!(parse_chunk_lengths("2,x", 5), None);
    assert_eq!(parse_chunk_lengths("+2,3", 5), None);
    assert_eq!(parse_chunk_lengths(",5", 5), None);
}

#[test]
fn kept_headers_are_filtered_in_order_and_reserved_entries_last_or_alone() {
    let mut response = Response::new(201, Vec::new(), "");
    response.headers.push(("location".into(), "/o/1".into()));
    response.headers.push(("X-Trace".into(), "t".into()));
    response.headers.push(("Idempotency-Expires".into(), "the handler's".into()));
    response.headers.push(("Content-Type".into(), "a/b".into()));
    let kept = ["Location", "Content-Type", EXPIRES_HEADER];
    assert_eq!(
        kept_headers_json(&response, &kept),
        r#"[["location","/o/1"],["Content-Type","a/b"]]"#
    );
    response.chunks = Some(vec![2, 3]);
    assert!(kept_headers_json(&response, &kept).ends_with(r#"[":chunks","2,3"]]"#));
    response.stream_too_large = true;
    assert_eq!(kept_headers_json(&response, &kept), r#"[[":not_kept","stream-too-large"]]"#);
}
