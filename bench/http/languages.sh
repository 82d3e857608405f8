#!/usr/bin/env bash
# Requests per second of the Python, Node, Go and Rust example services, keyed route
# (POST /orders, through the middleware) against the same framework's plain
# route (POST /plain/orders, same handler in a plain transaction), with
# synchronous_commit on, fresh key per request, wrk with 8 connections on
# loopback, order rotated each round, medians. Same method as bench/http/run.sh.
# Each run also reports the server's CPU (all PostgreSQL processes) and the
# service's CPU per request, in microseconds: where a keyed request's time goes.
#
#   bench/http/languages.sh      ROUNDS=5 SECONDS_PER_RUN=10 LANGS="python asgi node go rust" by default
#                                (also: django, fastify)
#
# python: examples/python-orders (WSGI, Client); asgi: examples/asgi-orders
# (Starlette on uvicorn, ASGI middleware, AsyncClient); django: examples/django-orders
# (Django on gunicorn, the Django middleware; not in the default list).
#
# Needs the extension installed in PGBIN's PostgreSQL (make install), wrk,
# python3-venv (the Python services run in client/python/tools/env.sh's venv: the
# built wheel, psycopg's compiled speedups), client/node built (npm ci there), and for
# Go 1.25 or later (examples/go-orders is built here, modules from the Go module proxy).
# Rust: Debian's cargo and rustc (examples/rust-orders, release build, here).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-5}
duration=${SECONDS_PER_RUN:-10}
# shellcheck source=service.sh
source bench/http/service.sh  # node_installed, start_shop, start_service
node_installed node-orders fastify-orders

work=$(mktemp -d /tmp/idem-langbench.XXXXXX)
service=""
trap '[[ -n $service ]] && kill "$service" 2>/dev/null; scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
start_shop "${BENCH_PORT:-55470}"

# CPU ticks (utime + stime, getconf CLK_TCK a second) of the service process and its
# children (gunicorn serves django-orders from a worker process).
service_ticks() {
  local pid ticks=0
  for pid in "$service" $(pgrep -P "$service"); do
    ticks=$((ticks + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
  done
  echo "$ticks"
}

rps() {  # rps PATH RUN-ID -> "requests/s server-us/request service-us/request"
  local pg0 svc0 out requests
  pg0=$(cpu_ticks "$work/pg") svc0=$(service_ticks)
  out=$(WRK_PATH=$1 WRK_RUN=$2 wrk -t2 -c8 -d"${duration}s" -s bench/http/fresh_keys.lua \
    "http://127.0.0.1:$http_port" 2>"$work/wrk.err")
  requests=$(awk '/requests in/ { print $1 }' <<<"$out")
  awk -v r="$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")" -v n="$requests" -v hz="$(getconf CLK_TCK)" \
    -v pg=$(($(cpu_ticks "$work/pg") - pg0)) -v svc=$(($(service_ticks) - svc0)) \
    'BEGIN { printf "%s %.0f %.0f\n", r, pg * 1e6 / hz / n, svc * 1e6 / hz / n }'
  if [[ -s $work/wrk.err ]]; then echo "wrk reported: $(sort "$work/wrk.err" | uniq -c | head -3)" >&2; fi
}

# shellcheck source=../lib.sh
source bench/lib.sh  # median

if [[ " ${LANGS:-python asgi node go rust} " == *" go "* ]]; then  # Go: a module on pgx v5 (docs/go.md)
  (cd examples/go-orders && go build -o "$work/go-orders" .)
fi

case " ${LANGS:-python asgi} " in
*" python "* | *" asgi "* | *" django "*) python_env=$(client/python/tools/env.sh /usr/bin/python3) ;;
esac

printf '%-8s %-7s %9s %9s %8s  %s\n' service round keyed plain keyed/pl \
  "server us/req keyed plain, service us/req keyed plain"
for lang in ${LANGS:-python asgi node go rust}; do
  case $lang in
    python) start_service "$python_env/bin/python" examples/python-orders/app.py ;;
    asgi) start_service "$python_env/bin/python" examples/asgi-orders/app.py ;;
    django) start_service "$python_env/bin/python" examples/django-orders/app.py ;;
    node) start_service node examples/node-orders/app.js ;;
    fastify) start_service node examples/fastify-orders/app.js ;;
    go) start_service "$work/go-orders" ;;
    rust)  # the machine's cargo, the crates of the example's Cargo.lock; the release build (cold: minutes)
      target=${CARGO_TARGET_DIR:-$PWD/build/rust}
      (cd examples/rust-orders && CARGO_TARGET_DIR="$target" cargo build --release --locked --quiet)
      start_service "$target/release/rust-orders" ;;
  esac
  rps /orders "warm-keyed-$lang" >/dev/null
  rps /plain/orders "warm-plain-$lang" >/dev/null
  for f in keyed plain ratio pgk pgp svk svp; do : >"$work/$f.$lang"; done
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then order=(keyed plain); else order=(plain keyed); fi
    declare -A got=() pg=() svc=()
    for name in "${order[@]}"; do
      path=/orders
      [[ $name == plain ]] && path=/plain/orders
      read -r got[$name] pg[$name] svc[$name] < <(rps "$path" "$name-$lang-$r-$RANDOM")
      echo "${got[$name]}" >>"$work/$name.$lang"
    done
    ratio=$(echo "${got[keyed]} / ${got[plain]}" | bc -l)
    echo "$ratio" >>"$work/ratio.$lang"
    echo "${pg[keyed]}" >>"$work/pgk.$lang"; echo "${pg[plain]}" >>"$work/pgp.$lang"
    echo "${svc[keyed]}" >>"$work/svk.$lang"; echo "${svc[plain]}" >>"$work/svp.$lang"
    printf '%-8s %-7s %9s %9s %8.3f  %5s %5s  %5s %5s\n' "$lang" "$r" "${got[keyed]}" "${got[plain]}" \
      "$ratio" "${pg[keyed]}" "${pg[plain]}" "${svc[keyed]}" "${svc[plain]}"
  done
  # The paired figure (the median of each round's keyed/plain, the two runs of a
  # round back to back) is the one reported: it cancels the machine's drift.
  printf '%-8s %-7s %9.0f %9.0f %8.3f  %5.0f %5.0f  %5.0f %5.0f   (median of the rounds; goal >= 0.90)\n' \
    "$lang" median "$(median <"$work/keyed.$lang")" "$(median <"$work/plain.$lang")" \
    "$(median <"$work/ratio.$lang")" "$(median <"$work/pgk.$lang")" "$(median <"$work/pgp.$lang")" \
    "$(median <"$work/svk.$lang")" "$(median <"$work/svp.$lang")"
done
grep -v "listening on" "$work/service.log" | sort | uniq -c | head -20 || true
