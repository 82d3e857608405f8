"""The HTTP mapping without a database: problem bodies and headers."""

from pg_idempotency import Problem, Response, problem_body, problem_response

# Bytes the C++ client (nlohmann_json) produces for the same problems; the
# conformance suite (tests/conformance) checks them against the C++ service.
CPP_KEY_REUSE = (
    b'{"detail":"This Idempotency-Key was used for a different request; use a new key for a new request.",'
    b'"status":422,"title":"Idempotency-Key was used for another request",'
    b'"type":"/problems/idempotency-key-reuse"}'
)


def test_problem_body_matches_the_cpp_client_bytes():
    response = problem_response(
        Problem.KEY_REUSE,
        "This Idempotency-Key was used for a different request; use a new key for a new request.",
    )
    assert response.status == 422
    assert response.headers == [("Content-Type", "application/problem+json")]
    assert response.body == CPP_KEY_REUSE


def test_problem_body_escapes_like_nlohmann():
    body = problem_body(400, "/p/x", "t", 'quote " backslash \\ tab \t ctl \x01 del \x7f é €')
    assert body == (
        '{"detail":"quote \\" backslash \\\\ tab \\t ctl \\u0001 del \x7f é €",'
        '"status":400,"title":"t","type":"/p/x"}'
    ).encode()


def test_every_problem_has_its_status_and_slug():
    expected = {
        Problem.KEY_MISSING: (400, "idempotency-key-missing"),
        Problem.KEY_MALFORMED: (400, "idempotency-key-malformed"),
        Problem.BODY_INVALID: (400, "request-body-invalid"),
        Problem.KEY_REUSE: (422, "idempotency-key-reuse"),
        Problem.REQUEST_IN_PROGRESS: (409, "request-in-progress"),
        Problem.ONE_TIME_SECRET: (409, "one-time-secret"),
        Problem.ALREADY_PROCESSED: (409, "request-already-processed"),
        Problem.RESPONSE_NOT_KEPT: (409, "response-not-kept"),
        Problem.KEY_EXPIRED: (410, "idempotency-key-expired"),
        Problem.DATABASE_UNAVAILABLE: (503, "database-unavailable"),
    }
    assert set(expected) == set(Problem)
    for problem, (status, slug) in expected.items():
        response = problem_response(problem, "d", "https://api.example.test/errors/")
        assert response.status == status
        assert f'"type":"https://api.example.test/errors/{slug}"'.encode() in response.body


def test_headers_compare_without_case_and_set_header_replaces():
    response = Response(headers=[("content-type", "a"), ("X-A", "1"), ("Content-Type", "b")])
    assert response.header("CONTENT-TYPE") == "a"
    response.set_header("Content-Type", "c")
    assert response.headers == [("X-A", "1"), ("Content-Type", "c")]
    assert response.header("missing") is None
