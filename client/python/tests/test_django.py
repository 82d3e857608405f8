"""The Django middleware (pg_idempotency.django) under Django's own test client: the
view's writes and the key commit together in Django's transaction.atomic, final 4xx
stored after the rollback, on_commit callbacks only for writes that committed,
serialization failures rerun, streams replayed as the same chunks, bad settings
refused."""

from __future__ import annotations

import uuid
from typing import Iterator, List

import psycopg
import pytest

django = pytest.importorskip("django")

from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.http import HttpResponse, StreamingHttpResponse  # noqa: E402
from django.test import Client as DjangoClient  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django.urls import path  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

committed: List[str] = []  # what the views' on_commit callbacks saw
flaky: set = set()


def principal_of(request):
    auth = request.headers.get("Authorization", "")
    return auth[len("Bearer "):] if auth.startswith("Bearer ") else None


def insert(request) -> int:
    """One order row for the request's principal, through Django's connection."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (principal, item, quantity) VALUES (%s, %s, 1) RETURNING id",
                       [principal_of(request) or "anonymous", request.body.decode() or "none"])
        (order_id,) = cursor.fetchone()
    return order_id


def create(request):
    order_id = insert(request)
    if hasattr(request, "idempotency"):  # not without a principal
        request.idempotency.resource_id = str(order_id)
    transaction.on_commit(lambda: committed.append(request.headers.get("Idempotency-Key", "")))
    return HttpResponse(b'{"id":%d}' % order_id, status=201, content_type="application/json",
                        headers={"Location": f"/orders/{order_id}"})


def fails(request):
    insert(request)
    transaction.on_commit(lambda: committed.append("never"))
    return HttpResponse(b"boom", status=500, content_type="text/plain")


def refuses(request):
    insert(request)  # rolled back: a final 4xx keeps no effect
    transaction.on_commit(lambda: committed.append("never"))
    return HttpResponse(b'{"error":"no"}', status=422, content_type="application/json")


def raises(request):
    insert(request)
    raise RuntimeError("the view failed")


def serialization_once(request):
    key = request.headers["Idempotency-Key"]
    if key not in flaky:
        flaky.add(key)
        insert(request)
        with connection.cursor() as cursor:
            cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
    return create(request)


def secret(request):
    insert(request)
    request.idempotency.one_time_secret = True
    return HttpResponse(b'{"secret":"sk_%s"}' % uuid.uuid4().hex.encode(), status=201,
                        content_type="application/json")


def stream(request):
    insert(request)
    return StreamingHttpResponse((str(i).encode() * 3 for i in range(4)), content_type="text/plain")


def terminated(request):
    insert(request)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    return HttpResponse(b"unreachable", status=201)


urlpatterns = [
    path("terminated", terminated),
    path("orders", create),
    path("fails", fails),
    path("refuses", refuses),
    path("raises", raises),
    path("serialization", serialization_once),
    path("secret", secret),
    path("stream", stream),
]


@pytest.fixture(scope="module")
def configured(dsn: str) -> Iterator[None]:
    """Django configured once per process, against this module's database."""
    if settings.configured:
        pytest.skip("Django was configured by another module")
    params = conninfo_to_dict(dsn)
    settings.configure(
        DEBUG=False,
        SECRET_KEY="pg_idempotency tests",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        INSTALLED_APPS=[],
        MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": params.pop("dbname"),
                               "HOST": params.pop("host"), "PORT": str(params.pop("port")),
                               "USER": params.pop("user"), "OPTIONS": params}},
        PG_IDEMPOTENCY={"PRINCIPAL": principal_of, "MAX_STREAM_BYTES": 1000},
        LOGGING_CONFIG=None,
    )
    django.setup()
    yield
    connection.close()


@pytest.fixture
def http(configured) -> DjangoClient:
    committed.clear()
    return DjangoClient(raise_request_exception=False)


def post(http: DjangoClient, route: str, principal: str, key, body: bytes = b"book"):
    headers = {"Authorization": f"Bearer {principal}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return http.post(f"/{route}", data=body, content_type="application/json", headers=headers)


def count(admin: psycopg.Connection, principal: str) -> int:
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def stored(admin: psycopg.Connection, principal: str, key: str):
    return admin.execute("SELECT response_status FROM idempotency.keys WHERE principal = %s AND key = %s",
                         (principal, key)).fetchone()


def test_first_request_commits_with_the_key_and_the_retry_replays(http, admin, principal):
    first = post(http, "orders", principal, "k1")
    retry = post(http, "orders", principal, "k1")
    assert first.status_code == 201 and "Idempotent-Replay" not in first.headers
    assert first.headers["Idempotency-Expires"].endswith("GMT")
    assert retry.status_code == 201 and retry.content == first.content
    assert retry.headers["Idempotent-Replay"] == "true" and retry.headers["Location"] == first.headers["Location"]
    assert count(admin, principal) == 1
    assert committed == ["k1"]  # on_commit ran once, after the commit
    assert not connection.in_atomic_block


def test_another_body_under_the_same_key_is_422(http, admin, principal):
    post(http, "orders", principal, "k2", b"book")
    other = post(http, "orders", principal, "k2", b"pen")
    assert other.status_code == 422
    assert other.headers["Content-Type"] == "application/problem+json"
    assert count(admin, principal) == 1


def test_missing_and_malformed_keys_are_400_without_the_view(http, admin, principal):
    missing = post(http, "orders", principal, None)
    malformed = post(http, "orders", principal, "k\u00e9y")
    assert missing.status_code == 400 and b"idempotency-key-missing" in missing.content
    assert malformed.status_code == 400 and b"idempotency-key-malformed" in malformed.content
    assert count(admin, principal) == 0 and committed == []


def test_no_principal_passes_through(http, admin):
    response = http.post("/orders", data=b"book", content_type="application/json")
    assert response.status_code == 201  # the view ran in Django's autocommit, no key
    assert committed == [""]


def test_a_500_rolls_back_and_stores_nothing(http, admin, principal):
    assert post(http, "fails", principal, "k3").status_code == 500
    assert post(http, "fails", principal, "k3").status_code == 500  # ran again: nothing stored
    assert count(admin, principal) == 0 and stored(admin, principal, "k3") is None
    assert committed == []


def test_a_final_4xx_is_stored_after_the_rollback(http, admin, principal):
    first = post(http, "refuses", principal, "k4")
    retry = post(http, "refuses", principal, "k4")
    assert first.status_code == 422 and first.content == b'{"error":"no"}'
    assert retry.status_code == 422 and retry.headers["Idempotent-Replay"] == "true"
    assert count(admin, principal) == 0 and stored(admin, principal, "k4") == (422,)
    assert committed == []


def test_an_exception_in_the_view_is_djangos_500_and_nothing_stays(http, admin, principal):
    assert post(http, "raises", principal, "k5").status_code == 500
    assert count(admin, principal) == 0 and stored(admin, principal, "k5") is None
    assert post(http, "orders", principal, "k6").status_code == 201  # the connection is usable


def test_a_serialization_failure_reruns_the_view(http, admin, principal):
    response = post(http, "serialization", principal, "k7")
    assert response.status_code == 201
    assert count(admin, principal) == 1  # the first run's insert was rolled back
    assert committed == ["k7"]


def test_a_lost_connection_is_503_with_retry_after(http, admin, principal):
    response = post(http, "terminated", principal, "k12")
    connection.close()  # Django's test client keeps connections across requests
    assert response.status_code == 503 and response.headers["Retry-After"]
    assert b"database-unavailable" in response.content
    assert count(admin, principal) == 0 and stored(admin, principal, "k12") is None
    assert post(http, "orders", principal, "k12").status_code == 201  # the retry runs once


def test_atomic_requests_makes_the_view_a_savepoint(http, admin, principal):
    settings_dict = connection.settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        first = post(http, "orders", principal, "k13")
        retry = post(http, "orders", principal, "k13")
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False
    assert first.status_code == 201 and retry.headers["Idempotent-Replay"] == "true"
    assert count(admin, principal) == 1 and committed == ["k13"]


def test_a_one_time_secret_is_sent_once(http, admin, principal):
    assert post(http, "secret", principal, "k8").status_code == 201
    retry = post(http, "secret", principal, "k8")
    assert retry.status_code == 409 and b"one-time-secret" in retry.content
    assert count(admin, principal) == 1


def test_a_stream_is_replayed_as_the_same_chunks(http, admin, principal):
    first = post(http, "stream", principal, "k9")
    chunks = list(first.streaming_content)
    retry = post(http, "stream", principal, "k9")
    assert chunks == [b"000", b"111", b"222", b"333"]
    assert retry.headers["Idempotent-Replay"] == "true"
    assert list(retry.streaming_content) == chunks
    assert count(admin, principal) == 1


def test_a_key_held_elsewhere_is_409_in_reject_mode(http, admin, principal, dsn):
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT idempotency.begin(%s, 'k10', 'POST /orders', sha256(''::bytea))", (principal,))
        with override_settings(PG_IDEMPOTENCY={"PRINCIPAL": principal_of, "DUPLICATES": "reject"}):
            response = DjangoClient().post("/orders", data=b"book", content_type="application/json",
                                         headers={"Authorization": f"Bearer {principal}", "Idempotency-Key": "k10"})
        holder.rollback()
    assert response.status_code == 409 and response.headers["Retry-After"]
    assert count(admin, principal) == 0


@pytest.mark.parametrize("config, message", [
    ({"PRINCIPLE": principal_of}, "unknown settings"),
    ({"DATABASE": "other"}, "no database alias"),
    ({"MAX_STREAM_BYTES": -1}, "MAX_STREAM_BYTES"),
    ({"OPTIONS": ["wait"]}, "OPTIONS"),
    ({"PRINCIPAL": 42}, "PRINCIPAL"),
])
def test_bad_settings_are_refused_at_start(configured, config, message):
    from pg_idempotency.django import IdempotencyMiddleware

    with override_settings(PG_IDEMPOTENCY=config):
        with pytest.raises(ImproperlyConfigured, match=message):
            IdempotencyMiddleware(lambda request: HttpResponse())


def test_inside_an_atomic_block_is_refused(configured, principal):
    from django.test import RequestFactory

    from pg_idempotency.django import IdempotencyMiddleware

    request = RequestFactory().post("/orders", data=b"book", content_type="application/json",
                                    headers={"Authorization": f"Bearer {principal}", "Idempotency-Key": "k11"})
    middleware = IdempotencyMiddleware(lambda request: HttpResponse())
    with transaction.atomic():
        with pytest.raises(ImproperlyConfigured, match="atomic"):
            middleware(request)
