#!/usr/bin/env bash
# The CPU of a keyed Node request against the plain route, by where it is spent:
# examples/node-orders (Express; or EXAMPLE=fastify-orders) under `perf record`
# (node --perf-basic-prof names the JavaScript frames), wrk on the keyed route
# (POST /orders) and then on the plain route (POST /plain/orders) of the same
# process. Each sample counts for the file of its innermost JavaScript frame (the
# client library, node-pg, node's http, the example's routes, ...) or, without one,
# for V8's threads (GC, compiler) or libuv's loop; the shares are scaled to the CPU
# per request the kernel counted (utime + stime), like bench/http/languages.sh.
# Unlike profile_node.sh (wall-clock samples), time spent preempted counts nowhere.
#
#   bench/http/perf_node.sh                          SECONDS_PER_RUN=10 by default
#   EXAMPLE=fastify-orders bench/http/perf_node.sh   the Fastify plugin
#
# Needs what bench/http/languages.sh needs for Node, and perf (linux-perf) with
# access to the service's samples (root, or kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${SECONDS_PER_RUN:-10}
example=${EXAMPLE:-node-orders}
# shellcheck source=service.sh
source bench/http/service.sh  # node_installed, start_shop, start_service
node_installed "$example"
work=$(mktemp -d /tmp/idem-nodeperf.XXXXXX)
service=""
trap '[[ -n $service ]] && kill "$service" 2>/dev/null; rm -f "/tmp/perf-$service.map";
  scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
start_shop "${BENCH_PORT:-55495}"
# --perf-basic-prof also starts V8's log: kept in $work, not in the current folder.
start_service node --perf-basic-prof --no-logfile-per-isolate --logfile="$work/v8.log" "examples/$example/app.js"
ticks() { sed 's/.*) //' "/proc/$service/stat" | awk '{ print $12 + $13 }'; }
for route in warm keyed plain; do
  path=/orders
  [[ $route == plain ]] && path=/plain/orders
  before=$(ticks)
  recorder=""
  if [[ $route != warm ]]; then
    perf record -q -F 999 -g -p "$service" -o "$work/$route.data" 2>/dev/null &
    recorder=$!
  fi
  WRK_PATH=$path WRK_RUN=perf-$route-$RANDOM wrk -t2 -c8 -d"${duration}s" -s bench/http/fresh_keys.lua \
    "http://127.0.0.1:$http_port" | awk '/requests in/ { print $1 }' >"$work/$route.requests"
  if [[ -n $recorder ]]; then
    kill -INT "$recorder"
    wait "$recorder" || true
  fi
  echo $(($(ticks) - before)) >"$work/$route.ticks"
  [[ $route == warm ]] || perf script -i "$work/$route.data" -F ip,sym 2>/dev/null >"$work/$route.stacks"
done
/usr/bin/python3 - "$work" "$(getconf CLK_TCK)" <<'PY'
import collections, re, sys
work, hz = sys.argv[1], int(sys.argv[2])
FRAME = re.compile(r"JS:[~^*+]?\S* (\S+?)(?::\d+)*$")


def where(stack):
    """The innermost JavaScript frame's file, or the native work the sample is in."""
    for symbol in stack:
        match = FRAME.match(symbol)
        if match:
            path = match.group(1)
            if "/client/node/dist/" in path:
                return "client library: " + path.rsplit("/", 1)[1]
            if "node_modules/" in path:
                return "npm: " + path.split("node_modules/")[-1].split("/")[0]
            if path.startswith("node:"):
                return "node: " + path[5:]
            return "example: " + path.rsplit("/", 1)[-1]
    for pattern, name in (("Scavenger", "V8: young GC"), ("Marking", "V8: old GC"), ("MarkCompact", "V8: old GC"),
                          ("Compile", "V8: compiler"), ("uv__io_poll", "libuv: poll, reads")):
        if any(pattern in symbol for symbol in stack):
            return name
    return "native: other"


def per_request(route):
    counts, stack, total = collections.Counter(), [], 0
    for line in open(f"{work}/{route}.stacks"):
        parts = line.split(None, 1)
        if parts:
            stack.append(parts[1].strip() if len(parts) > 1 else "?")
        elif stack:
            counts[where(stack)] += 1
            total += 1
            stack = []
    if stack:
        counts[where(stack)] += 1
        total += 1
    requests = int(open(f"{work}/{route}.requests").read())
    cpu = int(open(f"{work}/{route}.ticks").read()) * 1e6 / hz / requests
    return {k: v * cpu / total for k, v in counts.items()}, cpu, requests


keyed, keyed_cpu, keyed_n = per_request("keyed")
plain, plain_cpu, plain_n = per_request("plain")
print(f"keyed: {keyed_n} requests, {keyed_cpu:.0f} us of CPU per request")
print(f"plain: {plain_n} requests, {plain_cpu:.0f} us of CPU per request")
print("\nus of CPU per request by where it is spent: keyed, plain, keyed minus plain")
for name in sorted(set(keyed) | set(plain), key=lambda k: plain.get(k, 0) - keyed.get(k, 0)):
    k, p = keyed.get(name, 0), plain.get(name, 0)
    if max(k, p) >= 0.5:
        print(f"{k:7.1f} {p:7.1f} {k - p:+7.1f}  {name}")
PY
