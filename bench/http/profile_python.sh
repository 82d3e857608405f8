#!/usr/bin/env bash
# Where a keyed Python (WSGI) request's time goes: examples/python-orders' WSGI
# application called directly (no HTTP server, no threads), N keyed and N plain
# POST /orders on one connection, under cProfile; prints the wall time per
# request of each route and the functions that take the keyed route's extra
# time (own time per request, keyed minus plain).
#
#   bench/http/profile_python.sh        N=2000 by default
#
# Needs the extension installed in PGBIN's PostgreSQL; runs in the venv of
# client/python/tools/env.sh (the built wheel, psycopg[binary]), as bench/http/languages.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d /tmp/idem-pyprof.XXXXXX)
trap 'scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
# shellcheck source=service.sh
source bench/http/service.sh  # start_shop
start_shop "${BENCH_PORT:-55480}"
python_env=$(client/python/tools/env.sh /usr/bin/python3)
N=${N:-2000} DSN="host=$PGHOST port=$PGPORT dbname=shop user=postgres" "$python_env/bin/python" - <<'PY'
import cProfile, io, os, pstats, sys, time, uuid
sys.path.insert(0, "examples/python-orders")
import psycopg
print(f"psycopg {psycopg.__version__}, implementation {psycopg.pq.__impl__}, libpq {psycopg.pq.version()}")
import app as orders

n, dsn = int(os.environ["N"]), os.environ["DSN"]
with psycopg.connect(dsn, autocommit=True) as setup:
    setup.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL,"
                  " item text NOT NULL, quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
wsgi = orders.make_app(orders.Pool(dsn, 1))
body = b'{"item":"book","quantity":2}'

def call(path):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body), "HTTP_AUTHORIZATION": "Bearer alice",
               "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex, "CONTENT_TYPE": "application/json"}
    status = []
    b"".join(wsgi(environ, lambda s, h, e=None: status.append(s)))
    assert status[0].startswith("201"), status

stats = {}
for path in ("/orders", "/plain/orders"):
    for _ in range(200):
        call(path)  # warm: connection, prepared statements
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(n):
        call(path)
    profile.disable()
    wall = (time.perf_counter() - start) / n * 1e6
    print(f"{path:14s} {wall:8.0f} us per request (wall, under cProfile)")
    stats[path] = pstats.Stats(profile).stats
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        call(path)
    print(f"{path:14s} {(time.perf_counter() - start) / n * 1e6:8.0f} us per request (wall, no profiler),"
          f" {(time.process_time() - cpu) / n * 1e6:.0f} us CPU")

def own(st):
    out = {}
    for (file, line, name), (cc, nc, tt, ct, callers) in st.items():
        where = f"{os.path.basename(file)}:{name}"
        out[where] = out.get(where, 0.0) + tt
    return out

keyed, plain = own(stats["/orders"]), own(stats["/plain/orders"])
extra = sorted(((keyed.get(k, 0) - plain.get(k, 0)) / n * 1e6, k) for k in set(keyed) | set(plain))
print("\nown time per request, keyed minus plain (us), the largest 25:")
for us, name in reversed(extra[-25:]):
    print(f"{us:8.1f}  {name}")
print(f"{sum(u for u, _ in extra):8.1f}  total")
PY
