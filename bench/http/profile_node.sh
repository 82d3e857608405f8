#!/usr/bin/env bash
# Where a keyed Node request's time goes: examples/node-orders (Express; or
# EXAMPLE=fastify-orders, the Fastify plugin) under `node --cpu-prof`, wrk on the
# keyed route (POST /orders) and then, in a second run of the service, on the plain
# route (POST /plain/orders); prints the time per request of each and the functions
# whose self time per request grows most on the keyed route. The profiler samples
# wall-clock time: a write that wakes PostgreSQL and is preempted on a busy machine
# counts in full (writeBuffer, writev). bench/http/perf_node.sh counts CPU only.
#
#   bench/http/profile_node.sh                         SECONDS_PER_RUN=10 by default
#   EXAMPLE=fastify-orders bench/http/profile_node.sh  the Fastify plugin
#
# Needs what bench/http/languages.sh needs for Node.
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${SECONDS_PER_RUN:-10}
example=${EXAMPLE:-node-orders}
# shellcheck source=service.sh
source bench/http/service.sh  # node_installed, start_shop, start_service
node_installed "$example"
work=$(mktemp -d /tmp/idem-nodeprof.XXXXXX)
service=""
trap '[[ -n $service ]] && kill "$service" 2>/dev/null; scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
start_shop "${BENCH_PORT:-55490}"
for route in keyed plain; do
  path=/orders
  [[ $route == plain ]] && path=/plain/orders
  mkdir -p "$work/$route"
  start_service node --cpu-prof --cpu-prof-dir="$work/$route" "examples/$example/app.js"
  WRK_PATH=$path WRK_RUN=prof-$route-$RANDOM wrk -t2 -c8 -d"${duration}s" -s bench/http/fresh_keys.lua \
    "http://127.0.0.1:$http_port" | awk '/requests in/ { print $1 }' >"$work/$route.requests"
  kill -INT "$service"
  wait "$service" || true
  service=""
done
/usr/bin/python3 - "$work" <<'PY'
import glob, json, os, sys
work = sys.argv[1]

def self_times(route):
    (path,) = glob.glob(os.path.join(work, route, "*.cpuprofile"))
    profile = json.load(open(path))
    nodes = {n["id"]: n for n in profile["nodes"]}
    deltas = profile["timeDeltas"]
    spent = {}
    for sample, delta in zip(profile["samples"], deltas):
        frame = nodes[sample]["callFrame"]
        name = f'{frame["functionName"] or "(anonymous)"} {os.path.basename(frame["url"])}:{frame["lineNumber"] + 1}'
        spent[name] = spent.get(name, 0) + delta
    requests = int(open(os.path.join(work, route + ".requests")).read())
    return {k: v / requests for k, v in spent.items()}, requests

keyed, nk = self_times("keyed")
plain, np_ = self_times("plain")
busy = lambda d: sum(v for k, v in d.items() if not k.startswith("(idle)"))
print(f"keyed: {nk} requests, {busy(keyed):.0f} us of JS/VM time per request (profiler samples, not idle)")
print(f"plain: {np_} requests, {busy(plain):.0f} us of JS/VM time per request")
diff = sorted(((keyed.get(k, 0) - plain.get(k, 0), k) for k in set(keyed) | set(plain) if not k.startswith("(idle)")),
              reverse=True)
print("\nself time per request, keyed minus plain (us), the largest 25:")
for us, name in diff[:25]:
    print(f"{us:8.1f}  {name}")
PY
