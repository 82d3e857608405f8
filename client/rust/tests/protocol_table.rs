//! The crate's HTTP table against client/protocol.json, field by field, read from the
//! repository at test time: a change on either side that the other does not share fails.

use std::collections::BTreeSet;

use pg_idempotency::http::{
    http_date, Outcome, Problem, DEFAULT_DUPLICATE_MODE, DEFAULT_KEPT_HEADERS,
    DEFAULT_RETRY_AFTER_SECONDS, DUPLICATE_MODES, EXPIRES_FORMAT, EXPIRES_HEADER, KEY_HEADER,
    PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE, REPLAY_HEADER,
};
use serde_json::Value;

fn protocol() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol.json");
    let text = std::fs::read_to_string(path).expect("client/protocol.json is readable");
    serde_json::from_str(&text).expect("client/protocol.json is JSON")
}

#[test]
fn constants_match() {
    let p = protocol();
    assert_eq!(p["problem_content_type"], PROBLEM_CONTENT_TYPE);
    assert_eq!(p["problem_type_base"], PROBLEM_TYPE_BASE);
    assert_eq!(p["replay_header"], REPLAY_HEADER);
    assert_eq!(p["key_header"], KEY_HEADER);
    assert_eq!(p["default_retry_after_seconds"], DEFAULT_RETRY_AFTER_SECONDS);
    let kept: Vec<&str> =
        p["kept_headers"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(kept, DEFAULT_KEPT_HEADERS);
}

#[test]
fn expiry_and_duplicate_modes_match() {
    let p = protocol();
    assert_eq!(p["expires_header"], EXPIRES_HEADER);
    assert_eq!(p["expires_format"], EXPIRES_FORMAT);
    let modes: Vec<&str> =
        p["duplicate_modes"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let ours: Vec<&str> = DUPLICATE_MODES.iter().map(|m| m.name()).collect();
    assert_eq!(modes, ours);
    assert_eq!(p["default_duplicate_mode"], DEFAULT_DUPLICATE_MODE.name());
    // RFC 9110's own example of an IMF-fixdate.
    assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
}

#[test]
fn problems_match_field_by_field() {
    let p = protocol();
    let table = p["problems"].as_object().expect("problems is an object");
    let ours: BTreeSet<&str> = Problem::ALL.iter().map(|q| q.name()).collect();
    let theirs: BTreeSet<&str> = table.keys().map(String::as_str).collect();
    assert_eq!(ours, theirs, "the same problem names");
    for problem in Problem::ALL {
        let row = &table[problem.name()];
        assert_eq!(row["type"], problem.slug(), "{}: type", problem.name());
        assert_eq!(row["status"], problem.status(), "{}: status", problem.name());
        assert_eq!(row["title"], problem.title(), "{}: title", problem.name());
        let fields: BTreeSet<&str> = row.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            ["status", "title", "type"].into_iter().collect(),
            "{}: fields",
            problem.name()
        );
    }
}

#[test]
fn outcomes_match_field_by_field() {
    let p = protocol();
    let table = p["outcomes"].as_object().expect("outcomes is an object");
    let ours: BTreeSet<&str> = Outcome::ALL.iter().map(|o| o.name()).collect();
    let theirs: BTreeSet<&str> = table.keys().map(String::as_str).collect();
    assert_eq!(ours, theirs, "the same outcomes");
    for outcome in Outcome::ALL {
        let (row, m, name) = (&table[outcome.name()], outcome.mapping(), outcome.name());
        let known = ["run_handler", "response", "problem", "replayed", "retry_after", "detail"];
        for field in row.as_object().unwrap().keys() {
            assert!(known.contains(&field.as_str()), "{}: field {} is checked", name, field);
        }
        assert_eq!(row["run_handler"], m.run_handler, "{}: run_handler", name);
        assert_eq!(
            row["response"].as_str() == Some("stored"),
            m.stored_response,
            "{}: response",
            name
        );
        assert_eq!(row["problem"].as_str(), m.problem.map(Problem::name), "{}: problem", name);
        assert_eq!(row["replayed"].as_bool().unwrap_or(false), m.replayed, "{}: replayed", name);
        assert_eq!(
            row["retry_after"].as_bool().unwrap_or(false),
            m.retry_after,
            "{}: retry_after",
            name
        );
        assert_eq!(row["detail"].as_str(), m.detail, "{}: detail", name);
    }
}

#[test]
fn stream_entries_match() {
    use pg_idempotency::stream::{
        DEFAULT_MAX_STREAM_BYTES, NOT_KEPT_DETAIL, NOT_KEPT_ENTRY, STREAM_CHUNKS_ENTRY,
    };
    let p = protocol();
    assert_eq!(p["stream_chunks_entry"], STREAM_CHUNKS_ENTRY);
    assert_eq!(p["not_kept_entry"], NOT_KEPT_ENTRY);
    assert_eq!(p["default_max_stream_bytes"], DEFAULT_MAX_STREAM_BYTES);
    assert_eq!(p["not_kept_detail"], NOT_KEPT_DETAIL);
    assert_eq!(pg_idempotency::Options::default().max_stream_bytes, DEFAULT_MAX_STREAM_BYTES);
}

#[test]
fn routing_defaults_match() {
    use pg_idempotency::{
        RouterOptions, DEFAULT_MAX_PRINCIPALS, DEFAULT_NODE_DOWN_SECONDS, DEFAULT_REFRESH_SECONDS,
        PLACEMENT_SQL, STALE_PLACEMENT_MESSAGE, STALE_PLACEMENT_SQLSTATE,
    };
    let p = protocol();
    let routing = &p["routing"];
    let fields: BTreeSet<&str> =
        routing.as_object().expect("routing").keys().map(String::as_str).collect();
    let checked: BTreeSet<&str> = [
        "placement_sql",
        "default_refresh_seconds",
        "default_node_down_seconds",
        "default_max_principals",
        "stale_placement",
    ]
    .into_iter()
    .collect();
    assert_eq!(fields, checked, "every routing field is checked");
    assert_eq!(routing["placement_sql"], PLACEMENT_SQL);
    assert_eq!(routing["default_refresh_seconds"], DEFAULT_REFRESH_SECONDS);
    assert_eq!(routing["default_node_down_seconds"], DEFAULT_NODE_DOWN_SECONDS);
    assert_eq!(routing["default_max_principals"], DEFAULT_MAX_PRINCIPALS);
    let stale = &routing["stale_placement"];
    let stale_fields: BTreeSet<&str> =
        stale.as_object().expect("stale_placement").keys().map(String::as_str).collect();
    assert_eq!(stale_fields, ["message", "sqlstate"].into_iter().collect());
    assert_eq!(stale["sqlstate"], STALE_PLACEMENT_SQLSTATE);
    assert_eq!(stale["message"], STALE_PLACEMENT_MESSAGE);
    let options = RouterOptions::default();
    assert_eq!(options.placement_sql, PLACEMENT_SQL);
    assert_eq!(options.refresh.as_secs(), DEFAULT_REFRESH_SECONDS);
    assert_eq!(options.node_down.as_secs(), DEFAULT_NODE_DOWN_SECONDS);
    assert_eq!(options.max_principals, DEFAULT_MAX_PRINCIPALS);
}

#[test]
fn database_fault_matches_field_by_field() {
    use pg_idempotency::fault::{
        database_fault_response, DATABASE_FAULT_DETAIL, FAULT_SQLSTATES, FAULT_SQLSTATE_CLASSES,
    };
    let p = protocol();
    let want = &p["database_fault"];
    let fields: BTreeSet<&str> = want.as_object().unwrap().keys().map(String::as_str).collect();
    let known = ["detail", "problem", "replayed", "retry_after", "sqlstate_classes", "sqlstates"];
    assert_eq!(fields, known.into_iter().collect(), "database_fault: fields");
    assert_eq!(want["problem"], Problem::DatabaseUnavailable.name());
    assert_eq!(want["detail"], DATABASE_FAULT_DETAIL);
    let list = |name: &str| -> Vec<String> {
        want[name].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    assert_eq!(list("sqlstate_classes"), FAULT_SQLSTATE_CLASSES);
    assert_eq!(list("sqlstates"), FAULT_SQLSTATES);
    let retry = p["default_retry_after_seconds"].as_u64().unwrap() as u32;
    let base = p["problem_type_base"].as_str().unwrap();
    let response = database_fault_response(retry, base);
    let kind = &p["problems"][want["problem"].as_str().unwrap()];
    assert_eq!(response.status, kind["status"]);
    assert_eq!(response.header("Retry-After").is_some(), want["retry_after"].as_bool().unwrap());
    assert_eq!(response.header("Retry-After"), Some(retry.to_string().as_str()));
    assert_eq!(response.header(REPLAY_HEADER).is_some(), want["replayed"].as_bool().unwrap());
    assert_eq!(response.header("Content-Type"), Some(PROBLEM_CONTENT_TYPE));
    let body: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body["detail"], want["detail"]);
    assert_eq!(body["title"], kind["title"]);
    assert_eq!(body["status"], kind["status"]);
    assert_eq!(body["type"], format!("{}{}", base, kind["type"].as_str().unwrap()));
}
