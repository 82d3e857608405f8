"""The Python client's protocol table against client/protocol.json (the one
source every client follows), field by field: problem types, titles and
statuses, details, the outcome -> HTTP mapping, kept headers, Retry-After
default, replay header, problem content type and type base. No database."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from pg_idempotency import LeaseOptions, Options, Problem, http
from pg_idempotency._common import stored_response

TABLE = json.loads((Path(__file__).resolve().parents[2] / "protocol.json").read_text(encoding="utf-8"))


def test_problem_types_statuses_and_titles():
    assert {p.name.lower() for p in Problem} == set(TABLE["problems"])
    for name, want in TABLE["problems"].items():
        mine = Problem[name.upper()]
        assert (mine.slug, mine.status, mine.title) == (want["type"], want["status"], want["title"]), name


def test_constants_and_defaults():
    assert http.PROBLEM_CONTENT_TYPE == TABLE["problem_content_type"]
    assert http.PROBLEM_TYPE_BASE == TABLE["problem_type_base"]
    assert http.REPLAY_HEADER == TABLE["replay_header"]
    assert http.KEY_HEADER == TABLE["key_header"]
    assert http.DEFAULT_RETRY_AFTER_SECONDS == TABLE["default_retry_after_seconds"]
    assert list(http.DEFAULT_KEPT_HEADERS) == TABLE["kept_headers"]
    for options in (Options(), LeaseOptions()):
        assert list(options.kept_headers) == TABLE["kept_headers"]
        assert options.problem_type_base == TABLE["problem_type_base"]
    assert Options().retry_after == TABLE["default_retry_after_seconds"]


def test_stream_entries_limit_and_not_kept_detail():
    assert http.STREAM_CHUNKS_ENTRY == TABLE["stream_chunks_entry"]
    assert http.NOT_KEPT_ENTRY == TABLE["not_kept_entry"]
    assert http.DEFAULT_MAX_STREAM_BYTES == TABLE["default_max_stream_bytes"]
    assert http.DETAILS["response_not_kept"] == TABLE["not_kept_detail"]
    response = http.not_kept_response(TABLE["problem_type_base"])
    kind = TABLE["problems"]["response_not_kept"]
    assert response.status == kind["status"]
    assert json.loads(response.body) == {"detail": TABLE["not_kept_detail"], "status": kind["status"],
                                         "title": kind["title"], "type": TABLE["problem_type_base"] + kind["type"]}
    from pg_idempotency import asgi, wsgi

    for middleware in (wsgi.IdempotencyMiddleware, asgi.IdempotencyMiddleware):
        default = inspect.signature(middleware).parameters["max_stream_bytes"].default
        assert default == TABLE["default_max_stream_bytes"]


def test_the_outcomes_with_a_problem_are_the_tables():
    with_problem = {name for name, want in TABLE["outcomes"].items() if "problem" in want}
    assert set(http.OUTCOME_PROBLEMS) == with_problem


@pytest.mark.parametrize("outcome", sorted(TABLE["outcomes"]))
def test_each_outcome_maps_to_the_tables_answer(outcome):
    want = TABLE["outcomes"][outcome]
    default = TABLE["default_retry_after_seconds"]
    response = http.problem_for_outcome(outcome, None, default, TABLE["problem_type_base"])
    if want["run_handler"] or want.get("response") == "stored":
        assert response is None  # started runs the handler; replay sends the stored response
        if want.get("response") == "stored":
            replay = stored_response(201, '[["Location","/o/1"]]', b"{}", None)
            assert (replay.header(TABLE["replay_header"]) == "true") == want["replayed"]
        return
    assert response is not None
    kind = TABLE["problems"][want["problem"]]
    assert response.status == kind["status"]
    assert response.header("Content-Type") == TABLE["problem_content_type"]
    assert json.loads(response.body) == {
        "detail": want["detail"],
        "status": kind["status"],
        "title": kind["title"],
        "type": TABLE["problem_type_base"] + kind["type"],
    }
    assert (response.header(TABLE["replay_header"]) == "true") == want["replayed"]
    assert response.replayed == want["replayed"]
    assert response.header("Retry-After") == (str(default) if want.get("retry_after") else None)


def test_routing_defaults_are_the_tables():
    from pg_idempotency import router

    table = TABLE["routing"]
    assert set(table) == {"placement_sql", "default_refresh_seconds", "default_node_down_seconds",
                          "default_max_principals", "stale_placement"}  # each one checked here
    assert router.PLACEMENT_SQL == table["placement_sql"]
    assert router.DEFAULT_REFRESH_SECONDS == table["default_refresh_seconds"]
    assert router.DEFAULT_NODE_DOWN_SECONDS == table["default_node_down_seconds"]
    assert router.DEFAULT_MAX_PRINCIPALS == table["default_max_principals"]
    assert set(table["stale_placement"]) == {"sqlstate", "message"}
    assert router.STALE_PLACEMENT_SQLSTATE == table["stale_placement"]["sqlstate"]
    assert router.STALE_PLACEMENT_MESSAGE == table["stale_placement"]["message"]
    for kind in (router.Router, router.AsyncRouter):
        params = inspect.signature(kind).parameters
        assert params["placement_sql"].default == table["placement_sql"]
        assert params["refresh"].default == table["default_refresh_seconds"]
        assert params["node_down"].default == table["default_node_down_seconds"]
        assert params["max_principals"].default == table["default_max_principals"]


def test_database_fault_answer_and_sqlstates():
    from pg_idempotency import fault

    want = TABLE["database_fault"]
    kind = TABLE["problems"][want["problem"]]
    response = http.database_fault_response(TABLE["default_retry_after_seconds"],
                                            TABLE["problem_type_base"])
    assert response.status == kind["status"]
    assert response.header("Content-Type") == TABLE["problem_content_type"]
    assert (response.header("Retry-After") is not None) == want["retry_after"]
    assert response.header("Retry-After") == str(TABLE["default_retry_after_seconds"])
    assert (response.header(TABLE["replay_header"]) == "true") == want["replayed"]
    assert http.DETAILS["database_fault"] == want["detail"]
    assert json.loads(response.body) == {"detail": want["detail"], "status": kind["status"],
                                         "title": kind["title"],
                                         "type": TABLE["problem_type_base"] + kind["type"]}
    assert list(fault.FAULT_SQLSTATE_CLASSES) == want["sqlstate_classes"]
    assert list(fault.FAULT_SQLSTATES) == want["sqlstates"]
