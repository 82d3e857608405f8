"""The business handlers. The keyed routes run inside the transaction that
pg_idempotency's middleware opened (transaction.atomic on the default alias): their
ORM writes commit with the key. /plain/orders is the same handler in a plain
transaction.atomic (the benchmark's baseline)."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Optional, Tuple

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from .models import ApiKey, Order


def dumps(document: dict) -> bytes:
    """Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def answer(status: int, body: bytes, content_type: str = "application/json", **headers: str) -> HttpResponse:
    """A response with exactly these headers (Django's default Content-Type replaced)."""
    response = HttpResponse(body, status=status, content_type=content_type)
    for name, value in headers.items():
        response[name] = value
    return response


def problem(status: int, title: str, detail: str) -> HttpResponse:
    """An RFC 9457 problem body of the example's own (type about:blank)."""
    body = dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return answer(status, body, "application/problem+json")


def not_found(request: HttpRequest, exception: Optional[Exception] = None) -> HttpResponse:
    """Django's handler404: a problem body like the other services'."""
    return problem(404, "Not found", "No such route.")


def principal_of(request: HttpRequest) -> Optional[str]:
    """The principal: the bearer token (the example's stand-in for authentication)."""
    auth = request.headers.get("Authorization", "")
    prefix = "Bearer "
    if len(auth) > len(prefix) and auth.startswith(prefix):
        return auth[len(prefix):]
    return None


def keyed(request: HttpRequest) -> bool:
    """The requests the middleware handles (settings PG_IDEMPOTENCY['APPLIES'])."""
    return request.method == "POST" and request.path != "/plain/orders"


def duplicates(request: HttpRequest) -> str:
    """Reject mode on /reject/orders (settings PG_IDEMPOTENCY['DUPLICATES'])."""
    return "reject" if request.path == "/reject/orders" else "wait"


def health(request: HttpRequest) -> HttpResponse:
    """GET /health: answers without the database."""
    return answer(200, b"ok", "text/plain")


def count(request: HttpRequest) -> HttpResponse:
    """GET /orders/count: every principal's orders."""
    if request.method != "GET":
        return not_found(request)
    return answer(200, dumps({"orders": Order.objects.count()}))


def _post(request: HttpRequest) -> Tuple[Optional[str], Optional[HttpResponse]]:
    if request.method != "POST":
        return None, not_found(request)
    principal = principal_of(request)
    if principal is None:
        return None, problem(401, "Unauthorized", "Send Authorization: Bearer <token>.")
    return principal, None


def _json(body: bytes) -> Optional[dict]:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def create_order(request: HttpRequest, principal: str) -> HttpResponse:
    """The handler of every orders route: validates the body, inserts the order (ORM)."""
    data = _json(request.body)
    if data is None or not isinstance(data.get("item"), str) or not data["item"]:
        return problem(400, "Invalid order", 'The body must be a JSON object with a non-empty "item" string.')
    quantity = data.get("quantity", 1)
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= 1000:
        return problem(422, "Invalid quantity", "quantity must be 1 to 1000.")
    delay = request.GET.get("delay_ms", "0")
    if delay.isdigit() and int(delay) > 0:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s::float8 / 1000)", [int(delay)])
    order = Order.objects.create(principal=principal, item=data["item"], quantity=quantity)
    context = getattr(request, "idempotency", None)
    if context is not None:
        context.resource_id = str(order.id)
    body = dumps({"id": order.id, "item": order.item, "quantity": order.quantity,
                  "created_at": order.created_at.isoformat()})
    return answer(201, body, Location=f"/orders/{order.id}")


def orders(request: HttpRequest) -> HttpResponse:
    """POST /orders, /reject/orders, /classic/orders."""
    principal, refused = _post(request)
    return refused or create_order(request, principal)


flaky_lock = threading.Lock()
flaky_failed: set = set()


def flaky_orders(request: HttpRequest) -> HttpResponse:
    """The first run for each (principal, key) inserts the order, then answers 500."""
    principal, refused = _post(request)
    if refused:
        return refused
    response = create_order(request, principal)
    key = request.headers.get("Idempotency-Key", "")
    with flaky_lock:
        first = (principal, key) not in flaky_failed
        flaky_failed.add((principal, key))
    if response.status_code < 300 and first:
        return problem(500, "Internal error", "The request failed; it is safe to retry with the same key.")
    return response


def plain_orders(request: HttpRequest) -> HttpResponse:
    """The same handler without the middleware, in a transaction of its own."""
    principal, refused = _post(request)
    if refused:
        return refused
    with transaction.atomic():
        response = create_order(request, principal)
        if response.status_code >= 300:
            transaction.set_rollback(True)
    return response


def api_keys(request: HttpRequest) -> HttpResponse:
    """POST /api-keys: the new key's secret is answered once (one_time_secret)."""
    principal, refused = _post(request)
    if refused:
        return refused
    data = _json(request.body)
    if data is None or not isinstance(data.get("name"), str) or not data["name"]:
        return problem(400, "Invalid API key request", 'The body must be a JSON object with a non-empty "name" string.')
    secret = "sk_" + uuid.uuid4().hex
    key = ApiKey.objects.create(principal=principal, name=data["name"])
    request.idempotency.resource_id = str(key.id)
    request.idempotency.one_time_secret = True
    return answer(201, dumps({"id": key.id, "name": key.name, "secret": secret}), Location=f"/api-keys/{key.id}")


def stream(request: HttpRequest) -> HttpResponse:
    """POST /orders/stream: one order, then n chunks of m digits (chunk i the digit i % 10)."""
    principal, refused = _post(request)
    if refused:
        return refused
    data = _json(request.body) or {}
    n, m = data.get("chunks"), data.get("chunk_bytes")
    if any(not isinstance(v, int) or isinstance(v, bool) for v in (n, m)) or not (1 <= n <= 1000 and 1 <= m <= 65536):
        detail = 'The body must be a JSON object with "chunks" 1 to 1000 and "chunk_bytes" 1 to 65536.'
        return problem(400, "Invalid stream request", detail)
    order = Order.objects.create(principal=principal, item="stream", quantity=n)
    request.idempotency.resource_id = str(order.id)
    return StreamingHttpResponse((str(i % 10).encode() * m for i in range(n)), content_type="text/plain")
