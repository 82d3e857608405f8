"""The client's own problem bodies and headers, without a database."""

from pg_idempotency import Problem, Response, problem_body, problem_response

# Bytes the extension (idempotency.http_answer) and every client produce for a problem;
# the conformance suite (tests/conformance) checks them against the example services.
KEY_MISSING = (
    b'{"detail":"POST requests need an Idempotency-Key header.",'
    b'"status":400,"title":"Idempotency-Key header is missing",'
    b'"type":"/problems/idempotency-key-missing"}'
)


def test_problem_body_matches_the_extensions_bytes():
    response = problem_response(Problem.KEY_MISSING, "POST requests need an Idempotency-Key header.")
    assert response.status == 400
    assert response.headers == [("Content-Type", "application/problem+json")]
    assert response.body == KEY_MISSING


def test_problem_body_escapes_like_nlohmann():
    body = problem_body(400, "/p/x", "t", 'quote " backslash \\ tab \t ctl \x01 del \x7f é €')
    assert body == (
        '{"detail":"quote \\" backslash \\\\ tab \\t ctl \\u0001 del \x7f é €",'
        '"status":400,"title":"t","type":"/p/x"}'
    ).encode()


def test_the_type_base_prefixes_the_slug():
    response = problem_response(Problem.DATABASE_UNAVAILABLE, "d", "https://api.example.test/errors/")
    assert response.status == 503
    assert b'"type":"https://api.example.test/errors/database-unavailable"' in response.body


def test_headers_compare_without_case_and_set_header_replaces():
    response = Response(headers=[("content-type", "a"), ("X-A", "1"), ("Content-Type", "b")])
    assert response.header("CONTENT-TYPE") == "a"
    response.set_header("Content-Type", "c")
    assert response.headers == [("X-A", "1"), ("Content-Type", "c")]
    assert response.header("missing") is None
