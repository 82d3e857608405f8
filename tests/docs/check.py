#!/usr/bin/python3
"""Runs or compiles every fenced code block of README.md and docs/*.md (tests/docs/README.md
says how each language is checked and how a block is marked). Needs a running cluster with
the extension installed (PGHOST/PGPORT/PGUSER) and, for C++ and CMake blocks, the client
library installed into the prefix IDEM_DOCS_PREFIX (cmake --install; its pkg-config file and
CMake package are used). Prints one line per block, then
"N ok, N skipped, N not run, N failed"; exits 1 if any failed.

    tests/docs/check.py [FILE.md ...]     (default: README.md docs/*.md)

IDEM_TEST_SCOPE=matrix: the chroots of scripts/test-matrix.sh have no node, Go or Rust by
design; blocks of those languages are then counted "not run" instead of failed.
"""

import glob
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blocks import indented_code_blocks, read_blocks  # noqa: E402
from runners import RUNNERS  # noqa: E402

# Roles that the docs' GRANT blocks name; created for the run when missing, dropped after.
DOC_ROLES = ("app", "ops", "monitoring", "support")
DATABASE = "shop"  # the database the docs' connection strings name
ABSENT_BY_DESIGN = {"node", "gofmt", "rustfmt"}  # in the matrix chroots


class Context:
    def __init__(self, root):
        self.root = root
        self.database = DATABASE
        self.env = dict(os.environ, PGDATABASE=DATABASE)
        self.scope = os.environ.get("IDEM_TEST_SCOPE", "full")
        self.python = "/usr/bin/python3"
        self.cxx = os.environ.get("CXX", "g++")
        self.prefix = os.environ.get("IDEM_DOCS_PREFIX", "")
        self.cxxflags = self._pkg_config()

    def _pkg_config(self):
        env = dict(os.environ)
        if self.prefix:
            env["PKG_CONFIG_PATH"] = os.path.join(self.prefix, "lib/pkgconfig")
        p = subprocess.run(["pkg-config", "--cflags", "idempotency_client"], capture_output=True, text=True,
                           env=env)
        return shlex.split(p.stdout) if p.returncode == 0 else None

    def absent(self, tool):
        if self.scope == "matrix" and tool in ABSENT_BY_DESIGN:
            return "not run", f"no {tool} in the matrix chroots (by design)"
        return "failed", f"{tool} is not installed"


def psql(ctx, database, *commands):
    argv = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database]
    for c in commands:
        argv += ["-c", c]
    p = subprocess.run(argv, capture_output=True, text=True, env=ctx.env)
    if p.returncode:
        raise RuntimeError(f"psql: {p.stderr.strip()}")


def fresh_database(ctx, blocks):
    """One fresh database per file; the extension too unless a block of the file creates it."""
    psql(ctx, "postgres", f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)", f"CREATE DATABASE {DATABASE}")
    creates = any("CREATE EXTENSION idempotency" in b.text for b in blocks
                  if b.lang == "sql" and b.marker != "skip")
    if not creates:
        psql(ctx, DATABASE, "CREATE EXTENSION idempotency")


def check_block(block, ctx):
    if block.problem:
        return "failed", block.problem
    if block.marker == "skip":
        return "skipped", block.reason
    runner = RUNNERS.get(block.lang)
    if runner is None:
        lang = block.lang or "no language"
        return "failed", (f"{lang}: no way to run it; name a language the checker knows "
                          "or mark it <!-- doc-check: skip (reason) -->")
    return runner(block, ctx)


def check_file(path, ctx, counts):
    rel = os.path.relpath(path, ctx.root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for line in indented_code_blocks(text):
        print(f"FAILED   {rel}:{line} indented code block: use a fence with a language")
        counts["failed"] += 1
    blocks = read_blocks(rel, text)
    if not blocks:
        return
    fresh_database(ctx, blocks)
    for block in blocks:
        status, detail = check_block(block, ctx)
        counts[status] += 1
        label = {"ok": "ok", "skipped": "skipped", "not run": "NOT RUN", "failed": "FAILED"}[status]
        first, _, rest = detail.partition("\n")
        print(f"{label:8} {block.where} {block.lang or '-'}: {first}")
        if rest:
            print("\n".join("           " + line for line in rest.split("\n")))


def role_setup(ctx):
    """Creates the docs' roles that do not exist yet; returns those to drop at the end."""
    p = subprocess.run(["psql", "-X", "-qAt", "-d", "postgres", "-c",
                        "SELECT rolname FROM pg_roles"], capture_output=True, text=True, env=ctx.env)
    existing = set(p.stdout.split())
    made = [r for r in DOC_ROLES if r not in existing]
    for role in made:
        psql(ctx, "postgres", f"CREATE ROLE {role} NOLOGIN")
    return made


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = argv or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs/*.md")))
    ctx = Context(root)
    counts = {"ok": 0, "skipped": 0, "not run": 0, "failed": 0}
    made = role_setup(ctx)
    try:
        for path in files:
            check_file(os.path.abspath(path), ctx, counts)
    finally:
        subprocess.run(["psql", "-X", "-q", "-d", "postgres", "-c",
                        f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"], env=ctx.env)
        for role in made:
            subprocess.run(["psql", "-X", "-q", "-d", "postgres", "-c", f"DROP ROLE IF EXISTS {role}"],
                           env=ctx.env)
    print(f"{counts['ok']} ok, {counts['skipped']} skipped, {counts['not run']} not run, "
          f"{counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
