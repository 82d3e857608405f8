"""The lease protocol: the three policies, renewal, lost leases."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest

from pg_idempotency import LeaseOptions, LeaseOutcome, LeaseRunner, Policy, Request, Response

BODY = b'{"amount":100}'


def request(principal: str, key: str, body: bytes = BODY) -> Request:
    return Request(principal, key, "POST", "/payments", body)


def effect(calls: list, status: int = 201) -> callable:
    def run() -> Response:
        calls.append(1)
        return Response(status, [("Content-Type", "application/json"), ("Location", "/p/1")], b'{"paid":true}')

    return run


@pytest.fixture
def runner_for(dsn):
    runners = []

    def make(**kwargs) -> LeaseRunner:
        runner = LeaseRunner(dsn, LeaseOptions(**kwargs))
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


def test_remember_replays_the_stored_response(runner_for, principal):
    runner = runner_for(policy=Policy.REMEMBER)
    calls: list = []
    key = uuid.uuid4().hex
    first = runner.run(request(principal, key), effect(calls))
    assert first.outcome == LeaseOutcome.FRESH and first.fence > 0
    again = runner.run(request(principal, key, b'{ "amount": 1e2 }'), effect(calls))
    assert again.outcome == LeaseOutcome.REPLAYED
    assert again.response.body == b'{"paid":true}'
    assert again.response.header("Idempotent-Replay") == "true"
    assert again.response.header("Location") == "/p/1"
    assert len(calls) == 1
    other = runner.run(request(principal, key, b'{"amount":5}'), effect(calls))
    assert other.outcome == LeaseOutcome.MISMATCH and other.response.status == 422


def test_remember_releases_a_non_final_response(runner_for, principal):
    runner = runner_for(policy=Policy.REMEMBER)
    calls: list = []
    key = uuid.uuid4().hex
    assert runner.run(request(principal, key), effect(calls, 503)).outcome == LeaseOutcome.FRESH
    assert runner.run(request(principal, key), effect(calls)).outcome == LeaseOutcome.FRESH
    assert len(calls) == 2


def test_once_holds_the_key_even_after_a_failure(runner_for, principal):
    runner = runner_for(policy=Policy.ONCE)
    key = uuid.uuid4().hex

    def boom() -> Response:
        raise RuntimeError("upstream down")

    with pytest.raises(RuntimeError):
        runner.run(request(principal, key), boom)
    duplicate = runner.run(request(principal, key), effect([]))
    assert duplicate.outcome == LeaseOutcome.DUPLICATE
    assert duplicate.response.status == 409
    assert b'"type":"/problems/request-already-processed"' in duplicate.response.body


def test_commit_on_success_releases_a_failure(runner_for, principal):
    runner = runner_for(policy=Policy.COMMIT_ON_SUCCESS)
    calls: list = []
    key = uuid.uuid4().hex
    assert runner.run(request(principal, key), effect(calls, 502)).outcome == LeaseOutcome.FRESH
    assert runner.run(request(principal, key), effect(calls, 200)).outcome == LeaseOutcome.FRESH
    assert runner.run(request(principal, key), effect(calls, 200)).outcome == LeaseOutcome.DUPLICATE
    assert len(calls) == 2


def test_a_live_lease_is_in_progress(runner_for, principal):
    holder = runner_for(lease=timedelta(seconds=5))
    other = runner_for()
    key = uuid.uuid4().hex
    seen = {}

    def body() -> Response:
        seen["other"] = other.run(request(principal, key), effect([]))
        return Response(201, [], b"{}")

    assert holder.run(request(principal, key), body).outcome == LeaseOutcome.FRESH
    busy = seen["other"]
    assert busy.outcome == LeaseOutcome.IN_PROGRESS
    assert busy.response.status == 409
    assert 1 <= int(busy.response.header("Retry-After")) <= 5


def test_renewal_keeps_a_long_body_fenced(runner_for, principal):
    runner = runner_for(lease=timedelta(milliseconds=300))
    key = uuid.uuid4().hex

    def slow() -> Response:
        time.sleep(1.0)
        return Response(201, [], b"{}")

    result = runner.run(request(principal, key), slow)
    assert result.outcome == LeaseOutcome.FRESH
    assert result.renewals >= 2


def test_a_lost_lease_is_fresh_unfenced(runner_for, principal):
    runner = runner_for(lease=timedelta(milliseconds=200), renew=False)
    thief = runner_for(lease=timedelta(seconds=5))
    key = uuid.uuid4().hex
    calls: list = []

    def slow() -> Response:
        time.sleep(0.5)  # the lease runs out; another holder takes the key over
        taken = thief.run(request(principal, key), effect(calls))
        assert taken.outcome == LeaseOutcome.FRESH
        return Response(201, [], b"{}")

    result = runner.run(request(principal, key), slow)
    assert result.outcome == LeaseOutcome.FRESH_UNFENCED
    assert len(calls) == 1


def test_missing_and_malformed_keys_are_rejected(runner_for, principal):
    runner = runner_for()
    assert runner.run(Request(principal, None, "POST", "/p"), effect([])).response.status == 400
    rejected = runner.run(Request(principal, "bad\u00e9", "POST", "/p"), effect([]))
    assert rejected.outcome == LeaseOutcome.REJECTED
    assert b"idempotency-key-malformed" in rejected.response.body


def test_renewal_survives_concurrent_runners(runner_for, principal):
    """One runner per thread, as documented."""
    results = []

    def worker(i: int) -> None:
        runner = runner_for(lease=timedelta(milliseconds=300))
        results.append(runner.run(request(principal, f"k-{i}"), effect([])).outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [LeaseOutcome.FRESH] * 4
