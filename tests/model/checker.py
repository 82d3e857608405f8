#!/usr/bin/python3
"""Model-based checker of pg_idempotency (issue 11, section 2).

N concurrent clients run random operations over a small key space against a
real cluster while faults are injected; every answer is checked against a
model of what each (principal, key) may be (invariants I1-I7, see
docs/testing.md). On a violation it prints the seed, the invariant and the
history of the key, replays the seed with fewer clients and steps to find a
smaller failing run, prints that, and exits 1. The last line of every run is
`N steps, K faults, V violations`.

    /usr/bin/python3 tests/model/checker.py --seconds 60            # own cluster, random seed
    /usr/bin/python3 tests/model/checker.py --seed 7 --steps 3000
    /usr/bin/python3 tests/model/checker.py --cluster-dir /tmp/x/pg  # a scripts/pgcluster.sh cluster
    /usr/bin/python3 tests/model/checker.py --proxy-shards 4         # function calls through PL/Proxy
    /usr/bin/python3 tests/model/checker.py --roles --no-preload     # hostile roles (invariant BIND)
"""

import datetime
import os
import random
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True

import psycopg  # noqa: E402

from cluster import Cluster  # noqa: E402
from model import INVARIANTS, Model, Op  # noqa: E402
from faults import Faults, ProxyFaults  # noqa: E402
from options import parse_args  # noqa: E402
from transport_direct import DirectTransport  # noqa: E402
from transport_proxy import ProxyTransport  # noqa: E402
from workload import Client, Settings, fingerprint  # noqa: E402
import proxy  # noqa: E402
import roles  # noqa: E402

class Run:
    """One run: a fresh database, clients, faults, the end phase."""

    counter = 0

    def __init__(self, args, cluster, seed, clients, steps, duration, log, target=None):
        self.args = args
        self.cluster = cluster
        self.seed = seed
        self.clients = clients
        self.steps = steps
        self.duration = duration
        self.log = log
        self.model = Model()
        self.stats = {"lock": threading.Lock(), "steps": 0, "faults": 0}
        self.stop = threading.Event()
        self.first_violation_steps = None
        self.target = target  # (invariant, kind): stop only on this one (reduction), None: on any
        self.stopped_early = False
        Run.counter += 1
        self.dbname = "model_%d_%d_%d" % (os.getpid(), seed, Run.counter)

    def execute(self):
        """Runs the clients and the end phase; returns self (model, stats)."""
        version = self.cluster.fresh_database(self.dbname)
        self.version = version
        settings = Settings(self.args)
        if settings.roles:
            with self.admin() as conn:
                how = random.Random("%s:binding" % self.seed).choice(["role", "role_in_database"])
                roles.prepare(conn, settings.principals, self.dbname, how)
                self.preloaded = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
            self.log("roles %s bound by ALTER ROLE%s; shared_preload_libraries = '%s'"
                     % (", ".join(settings.principals), " ... IN DATABASE" if how != "role" else "",
                        self.preloaded))
        settings.header_arrays = tuple(int(p) for p in version.split(".")[:2]) >= (0, 6)
        if settings.refuse:
            if tuple(int(p) for p in version.split(".")[:2]) < (0, 8):
                raise SystemExit("--refuse needs the extension at 0.8.0 or later (this database has %s)" % version)
            with self.admin() as conn:
                conn.execute("SELECT idempotency.set_expiry_policy('claim', 'refuse', %s)",
                             (datetime.timedelta(milliseconds=settings.claim_grace_ms),))
            self.log("refuse: %.0f%% of requests, grace %d-%d ms; claims %d ms"
                     % (100 * settings.refuse, settings.grace_ms[0], settings.grace_ms[1], settings.claim_grace_ms))
        proxied = isinstance(self.cluster, proxy.ProxyTopology)
        if proxied:
            settings.principals = self.cluster.pick_principals(self.args.principals)
            settings.owners = self.cluster.owners
        faults = set(self.args.faults)
        if not self.cluster.can_restart():
            faults.discard("restart")
        settings.faults = faults
        deadline = time.time() + self.duration if self.duration is not None else None
        per_client = None if self.steps is None else max(1, self.steps // self.clients)
        conninfo = self.cluster.conninfo(self.dbname)
        transport = ProxyTransport if proxied else DirectTransport
        clients = [Client(n, self.seed, settings, self.model, transport, conninfo, self.stop, per_client, deadline,
                          self.stats)
                   for n in range(self.clients)]
        watch = threading.Thread(target=self.watch_violations, args=(clients,), daemon=True)
        fault_stop = threading.Event()
        if proxied:
            fault_thread = ProxyFaults(self.seed, self.cluster, self.dbname, faults, self.args.fault_interval,
                                       fault_stop, self.stats, self.log, self.model)
        else:
            fault_thread = Faults(self.seed, self.cluster, self.cluster.admin_conninfo(), self.dbname, faults,
                                  self.args.fault_interval, fault_stop, self.stats, self.log, self.model)
        for c in clients:
            c.start()
        watch.start()
        fault_thread.start()
        for c in clients:
            c.join()
        fault_stop.set()
        fault_thread.join(timeout=120)
        self.stop.set()
        self.model.settle_lock_checks(final=True)
        self.cluster.ensure_running()
        if not self.stopped_early:
            if proxied:
                proxy.end_phase(self, settings)
            else:
                self.end_phase(settings)
        self.cluster.drop_database(self.dbname)
        return self

    def watch_violations(self, clients):
        """Stops the run at the first violation (unless --keep-going) and notes how
        far each client had got, for the reduction."""
        while not self.stop.is_set():
            self.model.settle_lock_checks()
            found = [v for v in self.model.violations
                     if self.target is None or (v.invariant, v.signature) == self.target]
            if found and self.first_violation_steps is None:
                self.first_violation_steps = max(c.steps for c in clients)
                if not self.args.keep_going:
                    self.stopped_early = True
                    self.stop.set()
            time.sleep(0.05)

    # -- end of run -----------------------------------------------------------

    def admin(self):
        """A superuser connection to the run's database (waiting for recovery)."""
        return self.connect_until(self.cluster.conninfo(self.dbname))

    def connect_until(self, conninfo):
        """A connection of the end phase (waiting up to 90 s for recovery)."""
        give_up = time.time() + 90
        while True:
            try:
                return psycopg.connect(conninfo, autocommit=True, connect_timeout=5, application_name="model-end")
            except psycopg.Error:
                if time.time() > give_up:
                    raise
                time.sleep(0.3)

    def end_op(self, kind, key, conn, fp=None):
        """Records a call of the end phase (client `end`) with the server's now() and clock."""
        op = Op("end.%d" % (len(self.model.ops) + 1), "end", kind, key[0], key[1], fp)
        op.sent = time.time()
        self.model.add(op)
        now, clock = conn.execute("SELECT now(), clock_timestamp()").fetchone()
        op.now, op.clock = now.timestamp(), clock.timestamp()
        return op

    def end_phase(self, settings):
        """I4 (effects and key rows against the model), then I6 and I3 once every
        ttl and lease has passed."""
        model = self.model
        keys = [(p, k) for p in settings.principals for k in settings.keys]
        with self.admin() as conn:
            conn.execute("SET statement_timeout = '10s'")
            effects = conn.execute("SELECT op_id, kind, principal, key, fence, writer::text FROM model_effects"
                                   ).fetchall()
            present = {}
            for op_id, kind, principal, key, fence, writer in effects:
                present.setdefault(op_id, []).append((kind, principal, key, fence))
                if settings.roles and writer != principal:
                    model.violation("BIND", (principal, key), "the effect of %s for principal %s was written by "
                                    "role %s" % (op_id, principal, writer), [model.ops.get(op_id)],
                                    "effect of another role's principal")
            with model.lock:
                for op in list(model.ops.values()):
                    if op.kind == "txn" and op.commit == "unknown":
                        op.commit = "yes" if op.id in present else "no"
                        op.commit_acked = time.time()
                        op.note = (op.note + " in-doubt commit resolved").strip()
                self.check_effects(present)
            for key in keys:
                op = self.end_op("inspect", key, conn)
                row = conn.execute("SELECT action, fence, state, response_status, response_headers, response_body"
                                   "  FROM idempotency.keys WHERE principal = %s AND key = %s", key).fetchone()
                op.acked = time.time()
                if row is None:
                    op.outcome = "absent"
                    model.check_row(op, None)
                else:
                    action, fence, state, status, headers, body = row
                    op.outcome = "%s/%s/fence %s" % (action, state, fence)
                    model.check_row(op, {"action": action, "fence": fence, "state": state, "status": status,
                                         "headers": headers, "body": body and bytes(body)})
            # I6: past every ttl and lease, one cleanup leaves nothing; every key starts.
            time.sleep(self.latest_deadline(settings) + 0.3)
            conn.execute("CALL idempotency.cleanup()")
            for principal, key, state, expired, lease_live in conn.execute(
                    "SELECT principal, key, state, expires_at <= now(),"
                    "       state = 'in_progress' AND lease_until > clock_timestamp()"
                    "  FROM idempotency.keys ORDER BY 1, 2").fetchall():
                model.violation("I6", (principal, key),
                                "after every ttl and lease had passed, CALL idempotency.cleanup() left a %s row "
                                "(expired: %s, lease live: %s)" % (state, expired, lease_live))
            fresh = settings.fingerprints + 1
            for key in keys:
                self.end_start(conn, key, fresh)

    def latest_deadline(self, settings):
        """Seconds until every ttl and lease handed out in the run has passed."""
        latest = time.time()
        with self.model.lock:
            for op in self.model.ops.values():
                if op.expires is not None:
                    latest = max(latest, op.expires + (op.refuse_grace or 0))
                if op.kind == "acquire" and op.lease_min is not None:
                    latest = max(latest, op.lease_min)
                if op.kind == "renew" and op.now is not None and op.clock is not None:
                    latest = max(latest, op.clock + op.params["lease_s"])
                if op.kind == "complete" and op.outcome is True and op.acked is not None:
                    # A completion may keep the key for one more ttl of the key from then (0.6.0).
                    latest = max(latest, op.acked + settings.max_ttl_ms / 1000.0
                                 + ((op.holder.refuse_grace or 0) if op.holder is not None else 0))
        return max(0.0, latest - time.time())

    def check_effects(self, present):
        """I4 and I1 on the effect table, with every in-doubt commit resolved."""
        model = self.model
        for op in model.ops.values():
            if op.kind == "txn" and op.fence is not None:
                if op.commit == "yes" and op.id not in present:
                    model.violation("I4", op.key_id(), "the effect of %s committed but is not in the table "
                                    "(lost in a crash?)" % op.id, [op])
                elif op.commit == "no" and op.id in present:
                    model.violation("I4", op.key_id(), "the effect of %s is in the table although its "
                                    "transaction did not commit" % op.id, [op])
            if op.kind == "effect":
                if op.commit == "yes" and op.holder.id not in present:
                    model.violation("I4", op.key_id(), "the lease effect %s committed but is not in the table"
                                    % op.id, [op])
        generations = {}
        for op_id, rows in present.items():
            writer = model.ops.get(op_id)
            if writer is None:
                model.violation("I4", None, "an effect row names op %s, which this run never ran" % op_id)
                continue
            for kind, principal, key, fence in rows:
                generations.setdefault((principal, key, fence), []).append(writer)
        for (principal, key, fence), writers in generations.items():
            if len(writers) > 1:
                model.violation("I1", (principal, key), "%d committed effects for generation fence %s: %s"
                                % (len(writers), fence, ", ".join(w.id for w in writers)), writers)

    def end_start(self, conn, key, fresh):
        """Every key must answer started to a fresh begin and a fresh acquire, and
        the acquire's fence must be above every fence handed out before."""
        model = self.model
        op = self.end_op("txn", key, conn, fresh)
        try:
            conn.execute("BEGIN")
            outcome, fence = conn.execute(
                "SELECT outcome, fence FROM idempotency.begin(%s, %s, 'end', %s, wait => '2s')",
                (key[0], key[1], fingerprint(fresh))).fetchone()
            conn.execute("ROLLBACK")
            op.outcome, op.commit = outcome, "no"
        except psycopg.Error as error:
            conn.rollback()
            op.outcome = "error %s" % getattr(error, "sqlstate", error)
        op.acked = time.time()
        if op.outcome != "started":
            model.violation("I6", key, "once every ttl and lease had passed, begin answered %s" % op.outcome, [op])
        op = self.end_op("acquire", key, conn, fresh)
        try:
            outcome, fence = conn.execute(
                "SELECT outcome, fence FROM idempotency.acquire(%s, %s, 'end', %s, lease => '1s', wait => '2s')",
                (key[0], key[1], fingerprint(fresh))).fetchone()
            op.outcome, op.fence, op.commit = outcome, fence, "yes"
        except psycopg.Error as error:
            op.outcome = "error %s" % getattr(error, "sqlstate", error)
        op.acked = time.time()
        if op.outcome != "started":
            model.violation("I6", key, "once every ttl and lease had passed, acquire answered %s" % op.outcome, [op])
            return
        with model.lock:
            handed = [o for o in model.by_key.get(key, []) if o is not op and o.fence is not None
                      and o.kind in ("txn", "acquire") and o.commit == "yes"]
            if handed:
                top = max(handed, key=lambda o: o.fence)
                if op.fence <= top.fence:
                    model.violation("I3", key, "the final acquire got fence %s, but %s had committed fence %s "
                                    "earlier: fences repeat" % (op.fence, top.id, top.fence), [top, op],
                                    "fence handed out again")
        try:
            conn.execute("SELECT idempotency.release(%s, %s, %s)", (key[0], key[1], op.fence))
        except psycopg.Error:
            pass


def print_violations(model, seed, out, limit=3, only="", match=None):
    """The first `limit` violations (containing `only`, or of kind `match`), each
    with its key's history."""
    shown = 0
    for v in model.violations:
        if only and only not in v.invariant + " " + v.signature:
            continue
        if match is not None and (v.invariant, v.signature) != match:
            continue
        if shown == limit:
            out("... and %d more violations" % (len(model.violations) - limit))
            break
        shown += 1
        out("")
        out("VIOLATION %s (%s), seed %d, %.1f s into the run" % (v.invariant, INVARIANTS.get(v.invariant, "?"),
                                                                   seed, v.at))
        out("  key: %s" % (v.key,))
        out("  %s" % v.message)
        if v.key is not None:
            out("  history of %s (seconds from the start; sent, answered, client, kind, op, ...):" % (v.key,))
            moments = [t for o in v.ops for t in (o.sent, o.acked, o.commit_acked) if t is not None]
            until = max(moments) if moments else None
            for line in model.history(v.key, until=until):
                out("    " + line)


def summarize(model, out):
    """One line per kind of violation found, with how many and the first key."""
    if not model.violations:
        return
    kinds = {}
    for v in model.violations:
        kinds.setdefault((v.invariant, v.signature), []).append(v)
    out("")
    out("violations by kind:")
    for (invariant, signature), found in sorted(kinds.items()):
        out("  %-4s %-50s %4d  (first after %.1f s, on %s)" % (invariant, signature, len(found), found[0].at,
                                                                   found[0].key))
        out("       e.g. %s" % found[0].message)


def reduce_failure(args, cluster, first, log, out):
    """Replays the seed with fewer clients and steps; returns the smallest run
    that fails the same way (same invariant and kind) as the first violation."""
    if args.reduce_seconds <= 0:
        return None
    target = (first.model.violations[0].invariant, first.model.violations[0].signature)

    def same_failure(run):
        return any((v.invariant, v.signature) == target for v in run.model.violations)

    budget_end = time.time() + args.reduce_seconds
    per_client = first.first_violation_steps or max(1, first.stats["steps"] // first.clients)
    best = None
    candidates = sorted({c for c in (1, 2, 3, 4, first.clients // 2) if 0 < c < first.clients})
    out("")
    out("reducing: replaying seed %d with fewer clients (%d steps in all), then fewer steps, "
        "while it fails with %s (%s)" % (first.seed, per_client * first.clients, target[0], target[1]))
    for clients in candidates + [first.clients]:
        if time.time() > budget_end:
            break
        steps = per_client * first.clients  # the same work, done by fewer clients
        run = Run(args, cluster, first.seed, clients, steps, min(args.reduce_seconds, 120), log, target).execute()
        failed = same_failure(run)
        out("  %d clients, %d steps: %s" % (clients, run.stats["steps"], "fails the same way" if failed else
                                             "does not fail that way"))
        if failed:
            best = run
            break
    while best is not None and time.time() < budget_end:
        steps = min(best.first_violation_steps or per_client, best.steps // best.clients) * best.clients // 2
        if steps < best.clients or steps >= best.steps:
            break
        run = Run(args, cluster, best.seed, best.clients, steps, 60, log, target).execute()
        failed = same_failure(run)
        out("  %d clients, %d steps: %s" % (run.clients, run.stats["steps"], "fails the same way" if failed else
                                             "does not fail that way"))
        if not failed:
            break
        best = run
    return best


def main(argv):
    """Runs the checker; returns the exit status (0 clean, 1 violations, 2 could not start)."""
    args = parse_args(argv, __doc__)
    if args.install_script:
        import cluster as cluster_module
        cluster_module.INSTALL_SCRIPT = os.path.abspath(args.install_script)
    # SIGTERM (CI timeouts, kill) ends the run through the finally below, which stops the cluster.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    out = lambda line: print(line, flush=True)  # noqa: E731
    log = (lambda line: None) if args.quiet else (lambda line: print("  " + line, flush=True))
    what = ("%d steps" % args.steps) if args.steps is not None else ("%g s" % args.seconds)
    form = (" (function calls through PL/Proxy, %d shards, ports %d-%d)"
            % (args.proxy_shards, args.proxy_port, args.proxy_port + args.proxy_shards)) if args.proxy_shards else ""
    out("model checker: seed %d, %d clients, %s, faults: %s%s" % (args.seed, args.clients, what,
                                                                   ", ".join(args.faults) or "none", form))
    try:
        if args.dsn:
            cluster = Cluster(dsn=args.dsn)
        elif args.cluster_dir:
            cluster = Cluster.existing(args.cluster_dir)
        elif args.proxy_shards:
            cluster = proxy.ProxyTopology.start(args.proxy_shards, args.proxy_port)
        else:
            cluster = Cluster.start(args.port or random.SystemRandom().randrange(20000, 40000),
                                    preload="pg_cron" if args.no_preload else None)
    except Exception as error:
        out("cannot start: %s" % error)
        out("0 steps, 0 faults, 0 violations")
        return 2
    run = None
    try:
        started = time.time()
        run = Run(args, cluster, args.seed, args.clients, args.steps, args.seconds, log)
        run.execute()
        out("extension %s; ran %.1f s" % (run.version, time.time() - started))
        if run.model.violations:
            print_violations(run.model, args.seed, out, limit=args.show, only=args.show_only)
            small = reduce_failure(args, cluster, run, log, out)
            if small is not None:
                out("")
                out("smallest failing run: --seed %d --clients %d --steps %d (%d steps, %d faults)"
                    % (small.seed, small.clients, small.steps, small.stats["steps"], small.stats["faults"]))
                target = run.model.violations[0]
                print_violations(small.model, small.seed, out, limit=1,
                                 match=(target.invariant, target.signature))
        summarize(run.model, out)
        if args.roles:
            out("roles (shared_preload_libraries = '%s'): %s" % (
                getattr(run, "preloaded", "?"), ", ".join("%s %d" % item for item in
                                                          sorted(run.stats.get("roles", {}).items())) or "-"))
        out("")
        out("%d steps, %d faults, %d violations" % (run.stats["steps"], run.stats["faults"],
                                                     len(run.model.violations)))
        return 1 if run.model.violations else 0
    except Exception:  # the checker itself failed: say so, and still end with the figures
        traceback.print_exc(file=sys.stdout)
        stats = run.stats if run is not None else {"steps": 0, "faults": 0}
        violations = len(run.model.violations) if run is not None else 0
        out("checker error (not a finding about the extension)")
        out("%d steps, %d faults, %d violations" % (stats["steps"], stats["faults"], violations))
        return 2
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
