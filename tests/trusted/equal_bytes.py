#!/usr/bin/python3
"""The trusted edition's jcs and fingerprint give the C++ edition's bytes.

    equal_bytes.py --cpp "dsn of a database with the C++ edition" \
                   --trusted "dsn of a database with the trusted edition" [--count 1000]

On the RFC 8785 vectors (tests/jcs: input/output, primitives, the numbers of
numbers.txt and es6_1k.txt), invalid documents, raw, empty and non-UTF-8 bodies,
exclude lists, and --count documents of tests/fingerprints/agree.py's
generator, both databases are asked for jcs(text), jcs(jsonb) and fingerprint;
the answers (the bytes, or the SQLSTATE of the error) must be identical, and
the vectors must also equal their expected outputs, so the test fails when
both editions agree on a wrong answer. Prints "N passed, N failed".
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fingerprints"))

from agree import random_value, spell  # noqa: E402

JCS = ROOT / "tests" / "jcs"

INVALID = ["", " ", "{", "[1,]", "01", "-", "1.", ".5", "NaN", "Infinity", "\ufeff{}", '"\x01"',
           '{"a":1,"a":2}', '{"a":1,"\\u0061":2}', '"\\ud800"', '"\\udc00\\ud800"', "1e400",
           "-1e400", "1e-400", "[1e309]", "1.7976931348623157e308", "1.8e308", "5e-324",
           "2e-324", "3e-324", "[" * 512 + "]" * 512, '"a\\u0000b"', '{"\\u0000":1,"a":2}',
           "[1] x", "[true, false, null]", '{"a":[],"b":{}}', "-0", "-0.0e5", "1E+2"]

EXCLUDES = [None, ["/a"], ["/b", "/a"], ["/items/0"], ["/items/1", "/items/0/x"],
            ["/items/01"], ["/items/-"], ["/a~1b"], ["/m~0n"], ["/nothing/here"],
            ["/items/5"], ["/items"], ["/items", "/items/0"]]
BAD_EXCLUDES = [[""], ["a"], ["/~2"], ["/~"]]


def answer(conn: psycopg.Connection, sql: str, params) -> tuple:
    """The value, or ('error', SQLSTATE); each call in its own transaction."""
    try:
        with conn.transaction():
            row = conn.execute(sql, params).fetchone()
            return ("value", row[0])
    except psycopg.Error as error:
        return ("error", error.sqlstate)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpp", required=True)
    parser.add_argument("--trusted", required=True)
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    cpp = psycopg.connect(args.cpp, autocommit=True)
    trusted = psycopg.connect(args.trusted, autocommit=True)
    passed = failed = 0

    def same(what: str, sql: str, params, expected=None) -> None:
        nonlocal passed, failed
        a = answer(cpp, sql, params)
        b = answer(trusted, sql, params)
        ok = a == b and (expected is None or a == ("value", expected))
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"not ok - {what}: C++ {a!r:.200} trusted {b!r:.200} expected {expected!r:.100}")

    jcs = "SELECT idempotency.jcs(%s::text)"
    jcsb = "SELECT idempotency.jcs(%s::text::jsonb)"
    fp = "SELECT idempotency.fingerprint(%s, %s, %s::bytea, %s::text[])"

    for folder in (JCS, JCS / "primitives"):
        for path in sorted((folder / "input").glob("*.json")):
            text = path.read_text(encoding="utf-8")
            expected = (folder / "output" / path.name).read_text(encoding="utf-8").rstrip("\n")
            same(f"vector {path.name}", jcs, (text,), expected)
            same(f"fingerprint {path.name}", fp, ("POST", "/v", text.encode(), None))
    for name in ("numbers.txt", "es6_1k.txt"):
        for line in (JCS / name).read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            bits, expected = line.split(",", 1)
            value = struct.unpack(">d", bytes.fromhex(bits.rjust(16, "0")))[0]
            for literal in {repr(value), f"{value:.17e}", f"{value:.20g}"}:
                same(f"number {literal}", jcs, (literal,), expected)
    for text in INVALID:
        same(f"document {text[:30]!r}", jcs, (text,))
        same(f"fingerprint of {text[:30]!r}", fp, ("POST", "/x", text.encode(), None))
    for body in (None, b"", b"a=1&b=2", b"\xff\xfe", b"\x00\x01", '{"é":1}'.encode("latin-1")):
        same(f"raw body {body!r}", fp, ("put", "/raw", body, None))
    for method, path in (("", "/"), ("GET x", "/"), ("GET", "a\nb"), ("patch", "/ü")):
        same(f"method {method!r} path {path!r}", fp, (method, path, b"{}", None))
    document = '{"a":1,"b":[1,2],"a/b":3,"m~n":4,"items":[{"x":1,"y":2},{"x":3},7]}'
    for exclude in EXCLUDES + BAD_EXCLUDES:
        same(f"exclude {exclude}", fp, ("POST", "/e", document.encode(), exclude))

    # The one documented difference: the trusted edition stops at 512 levels.
    deep = "[" * 513 + "]" * 513
    if answer(trusted, jcs, (deep,)) == ("error", "54000") and \
            answer(cpp, jcs, (deep,))[0] == "value":
        passed += 1
    else:
        failed += 1
        print("not ok - 513 levels: C++ canonicalizes, the trusted edition refuses (54000)")

    rng = random.Random(39)
    for i in range(args.count):
        value = random_value(rng, 0)
        messy = spell(rng, value, True)
        same(f"generated {i} jcs", jcs, (messy,))
        same(f"generated {i} jcs(jsonb)", jcsb, (messy,))
        same(f"generated {i} fingerprint", fp, ("POST", "/g", messy.encode(), None))
        if i % 10 == 0:
            same(f"generated {i} exclude", fp,
                 ("POST", "/g", messy.encode(), ["/a", "/0", "/id", "/b/1"]))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
