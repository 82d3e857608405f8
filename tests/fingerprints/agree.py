#!/usr/bin/python3
"""Fingerprints agree across languages.

    agree.py --jcs-tool build-test/jcs_tool --dsn "host=... dbname=..." [--count 1000]

For every request (the RFC 8785 vectors in tests/jcs, raw and empty bodies,
and --count documents from a deterministic generator, each spelled with
shuffled members, random whitespace, escapes and number spellings) the
fingerprint is computed three ways and must be identical:

- C++: src/core through `jcs_tool fingerprints`;
- Python: pg_idempotency.fingerprint, which sends the parameters exactly as the
  client's begin() does (body as binary bytea);
- Node: the Node client's fingerprint(), which writes the values into the SQL
  text exactly as its begin() does (escaped literals; node_fingerprints.js,
  needs client/node built; --node "" leaves it out);
- SQL: idempotency.fingerprint over the bodies stored in a table (decoded from
  hex on the server, no client parameter at all).

Also checks that each generated spelling has the fingerprint of its compact,
sorted form (the generator's own idea of the canonical document), so the test
can fail when all three implementations agree on a wrong answer for member
order or whitespace. Prints "N passed, N failed"; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "client" / "python" / "src"))

import psycopg  # noqa: E402

import pg_idempotency  # noqa: E402

Request = Tuple[str, str, Optional[bytes]]

NAMES = ["a", "b", "id", "amount", "currency", "\u00e9t\u00e9", "\u20ac", "\ue000", "\U0001f600", "A", "aa",
         "", "z\u0000", "line\nbreak", "\u0435", "1", "10", "2"]
STRING_CHARS = "abcXYZ 019\"\\/\b\f\n\r\t\u0001\u001f\u007f\u00e9\u20ac\ue000\U0001f600\u2028"


def random_number(rng: random.Random) -> str:
    """A JSON number spelling; its value always fits a double."""
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randint(-1000, 1000))
    if kind == 1:
        return str(rng.randint(-(2 ** 70), 2 ** 70))
    if kind == 2:
        return repr(rng.uniform(-1e6, 1e6))
    if kind == 3:
        return f"{rng.uniform(1, 10):.{rng.randint(1, 17)}f}e{rng.randint(-320, 300)}"
    if kind == 4:
        return rng.choice(["0", "-0", "0.0", "1e21", "1e-7", "5e-324", "1.7976931348623157e308", "1E2", "100e-2"])
    if kind == 5:
        return f"{rng.randint(1, 999)}.{rng.randint(0, 999):03d}"
    return repr(rng.random() * 10 ** rng.randint(-30, 30))


def random_value(rng: random.Random, depth: int):
    """A JSON value as a Python structure; numbers kept as their spelling."""
    kind = rng.randrange(10 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind in (1, 2):
        return ("number", random_number(rng))
    if kind in (3, 4, 5):
        return "".join(rng.choice(STRING_CHARS) for _ in range(rng.randint(0, 12)))
    if kind in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    names = rng.sample(NAMES, rng.randint(0, 5))
    return {name: random_value(rng, depth + 1) for name in names}


def spell_string(rng: random.Random, text: str, escape_more: bool) -> str:
    """A string literal: canonical (RFC 8785: JSON.stringify's escapes) unless
    escape_more, which picks among the other spellings of each character."""
    if not escape_more:
        return json.dumps(text, ensure_ascii=False)
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20:
            out.append(rng.choice([f"\\u{code:04x}", f"\\u{code:04X}"]) if ch not in "\b\f\n\r\t" or rng.random() < 0.5
                       else {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif rng.random() < 0.3:
            if code > 0xFFFF:
                high = 0xD800 + ((code - 0x10000) >> 10)
                low = 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(f"\\u{high:04x}\\u{low:04x}")
            elif ch == "/":
                out.append("\\/")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def spell(rng: random.Random, value, messy: bool) -> str:
    """Serializes a value: messy adds whitespace, shuffles members and escapes more."""
    space = (lambda: rng.choice(["", " ", "\n", "\t", "  ", "\r\n"])) if messy else (lambda: "")
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return value[1]
    if isinstance(value, str):
        return spell_string(rng, value, messy)
    if isinstance(value, list):
        return "[" + space() + ("," + space()).join(spell(rng, v, messy) + space() for v in value) + "]"
    items = list(value.items())
    if messy:
        rng.shuffle(items)
    else:
        items.sort(key=lambda item: item[0].encode("utf-16-be"))
    members = [space() + spell_string(rng, k, messy) + space() + ":" + space() + spell(rng, v, messy) + space()
               for k, v in items]
    return "{" + ",".join(members) + "}"


def has_awkward_numbers(value) -> bool:
    """Numbers whose canonical spelling differs from the generator's literal:
    the compact form is then not canonical, so skip the self-check for them."""
    if isinstance(value, tuple):
        return True
    if isinstance(value, list):
        return any(has_awkward_numbers(v) for v in value)
    if isinstance(value, dict):
        return any(has_awkward_numbers(v) for v in value.values())
    return False


def requests(count: int) -> Tuple[List[Request], List[Tuple[int, bytes]]]:
    """The requests, and (index, canonical body) pairs for the generator's self-check."""
    items: List[Request] = []
    expected: List[Tuple[int, bytes]] = []
    jcs = ROOT / "tests" / "jcs"
    for folder in (jcs / "input", jcs / "primitives" / "input"):
        for path in sorted(folder.glob("*.json")):
            items.append(("POST", "/vectors/" + path.stem, path.read_bytes()))
    items += [
        ("POST", "/empty", None),
        ("post", "/empty", b""),
        ("PATCH", "/raw", b"not json at all \xff\xfe"),
        ("PUT", "/dup", b'{"a":1,"a":2}'),
        ("POST", "/lone-surrogate", b'{"a":"\\ud800"}'),
        ("POST", "/big", b"[1e400]"),
        ("POST", "/tiny", b"[1e-400]"),
        ("POST", "/\u00e9\u20ac/path?q=1", b"[]"),
    ]
    rng = random.Random(8785)
    for i in range(count):
        value = random_value(rng, 0)
        messy = spell(rng, value, True).encode("utf-8", "surrogatepass")
        items.append((rng.choice(["POST", "post", "Patch"]), f"/generated/{i}", messy))
        if not has_awkward_numbers(value):
            expected.append((len(items) - 1, spell(rng, value, False).encode("utf-8")))
    return items, expected


def cpp_fingerprints(tool: str, items: List[Request]) -> List[str]:
    records = bytearray()
    for method, path, body in items:
        m, p = method.encode(), path.encode()
        records += f"{len(m)} {len(p)} {-1 if body is None else len(body)}\n".encode()
        records += m + p + (body or b"") + b"\n"
    out = subprocess.run([tool, "fingerprints"], input=bytes(records), capture_output=True, check=True).stdout
    return out.decode().splitlines()


def node_fingerprints(script: str, dsn: str, items: List[Request]) -> List[str]:
    lines = "".join(json.dumps([m, p, None if b is None else b.hex()]) + "\n" for m, p, b in items)
    out = subprocess.run(["node", script, "--dsn", dsn], input=lines.encode(), capture_output=True, check=True).stdout
    return out.decode().splitlines()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jcs-tool", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--node", default=str(ROOT / "tests" / "fingerprints" / "node_fingerprints.js"),
                        help='the Node fingerprint script ("" to leave Node out)')
    args = parser.parse_args()
    if not os.access(args.jcs_tool, os.X_OK):
        print(f"not ok - jcs_tool not found at {args.jcs_tool}\n0 passed, 1 failed")
        return 1
    items, expected = requests(args.count)
    cpp = cpp_fingerprints(args.jcs_tool, items)
    node = node_fingerprints(args.node, args.dsn, items) if args.node else None
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        python = [pg_idempotency.fingerprint(conn, m, p, b).hex() for m, p, b in items]
        conn.execute("CREATE TEMP TABLE requests (n int, method text, path text, body_hex text)")
        with conn.cursor().copy("COPY requests FROM STDIN") as copy:
            for n, (method, path, body) in enumerate(items):
                copy.write_row((n, method, path, None if body is None else body.hex()))
        sql = [row[0] for row in conn.execute(
            "SELECT encode(idempotency.fingerprint(method, path, decode(body_hex, 'hex')), 'hex')"
            " FROM requests ORDER BY n")]
    passed = failed = 0
    for n, (method, path, body) in enumerate(items):
        if len(cpp) > n and cpp[n] == python[n] == sql[n] and (node is None or (len(node) > n and node[n] == sql[n])):
            passed += 1
        else:
            failed += 1
            if failed <= 10:
                print(f"not ok - {method} {path} {body[:120] if body else body!r}\n"
                      f"#   C++ {cpp[n] if len(cpp) > n else None}\n#   Python {python[n]}\n#   SQL {sql[n]}"
                  + (f"\n#   Node {node[n] if len(node) > n else None}" if node is not None else ""))
    print(f"ok - {passed} of {len(items)} requests: C++, Python, {'Node and ' if node is not None else ''}SQL"
          " fingerprints agree")
    self_passed = 0
    for n, canonical in expected:
        method, path, _ = items[n]
        digest = hashlib.sha256(method.upper().encode() + b"\n" + path.encode() + b"\n" + canonical).hexdigest()
        if digest == python[n]:
            self_passed += 1
        else:
            failed += 1
            if failed <= 20:
                print(f"not ok - {path}: messy spelling and sorted compact form differ\n#   {items[n][2][:200]!r}\n"
                      f"#   {canonical[:200]!r}")
    passed += self_passed
    print(f"ok - {self_passed} of {len(expected)} generated documents without numbers have the digest of"
          " their sorted compact form")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > args.count else 1


if __name__ == "__main__":
    sys.exit(main())
