"""Scenario 'vectors' of conformance.py: plays the shared scenario vectors of
vectors.json (sequences of requests and their exact answers, the same for every
example service; see the file's comment) against the service under test.

Each scenario runs under a principal of its own; a step's answer is checked
byte for byte where the vector says so (a problem of client/protocol.json, an
exact body, an earlier step's body), then the effects in the database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Union

VECTORS = Path(__file__).resolve().with_name("vectors.json")


def key_of(spec: Any) -> Union[str, bytes, None]:
    """A step's Idempotency-Key: None (no header), a string, or bytes."""
    if spec is None or isinstance(spec, str):
        return spec
    if "repeat" in spec:
        return spec["repeat"] * spec["times"]
    if "utf8" in spec:
        return spec["utf8"].encode("utf-8")
    raise ValueError(f"vectors.json: a key is a string, null, repeat or utf8, not {spec!r}")


def expected_body(suite, problem, expect: Dict[str, Any], replies: List) -> Union[bytes, None]:
    """The exact bytes a step must answer, when the vector says (else None)."""
    protocol = suite.protocol
    if "problem" in expect:
        kind = protocol["problems"][expect["problem"]]
        detail = expect["detail"]
        if isinstance(detail, dict):
            detail = protocol["outcomes"][detail["outcome"]]["detail"]
        return problem(kind["status"], suite.problem_base + kind["type"], kind["title"], detail)
    if "body" in expect:
        return expect["body"].encode("utf-8")
    if "body_of" in expect:
        return replies[expect["body_of"]].body
    return None


def scenario(suite, problem) -> None:
    """Plays every scenario of vectors.json against the suite's service."""
    vectors = json.loads(VECTORS.read_text("utf-8"))
    for vector in vectors["scenarios"]:
        name = vector["name"]
        who = suite.principal(f"vectors-{name}")
        replies = []
        for index, step in enumerate(vector["steps"]):
            expect = step["expect"]
            reply = suite.post(step["path"], step["body"].encode("utf-8"), who, key_of(step["key"]))
            replies.append(reply)
            body = expected_body(suite, problem, expect, replies)
            status = json.loads(body)["status"] if "problem" in expect else expect["status"]
            content_type = suite.protocol["problem_content_type"] if "problem" in expect else None
            suite.expect(f"vectors {name}, step {index}: {step['path']}", reply, status, body=body,
                         replay=expect.get("replayed"), content_type=content_type)
            for header, value in expect.get("headers", {}).items():
                suite.check(f"vectors {name}, step {index}: {header}: {value}", reply.header(header) == value,
                            reply.describe())
            if "headers_of" in expect:
                earlier, names = expect["headers_of"]
                for header in names:
                    first = replies[earlier].header(header)
                    suite.check(f"vectors {name}, step {index}: {header} as step {earlier}'s",
                                first is not None and reply.header(header) == first,
                                f"step {earlier}: {first!r}, step {index}: {reply.header(header)!r}")
        for table, rows in vector["effects"].items():
            suite.effects(f"vectors {name}", table, who, rows)
