"""The function-call form of the checker (--proxy-shards N): N shard clusters
and one PL/Proxy cluster, each a scripts/pgcluster.sh cluster the checker
starts and stops itself. Clients talk only to the proxy; every operation is
one function call of tests/model/proxy_functions.sql, routed to the shard that
owns the principal (hashtext(principal) & (N - 1)).

The topology offers what a run needs from a Cluster (fresh databases, the
clients' connection string, restarts) plus the shards' own connection
strings for the fault thread and the end phase.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import psycopg
from psycopg.types.json import Jsonb

from cluster import PGBIN_DEFAULT, REPO, Cluster
from workload import (CONNECTION_LOST, RETRYABLE, Client, ConnectionLost, Faults, ServerError, epoch, fingerprint,
                      seconds)

FUNCTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proxy_functions.sql")
# application_name of the proxy's connections to the shards (the fault thread kills those backends).
SHARD_APP = "model-proxy-conn"
# Principal names the key space draws from, spread over the shards by pick_principals.
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj",
         "oscar", "peggy", "rupert", "sybil", "trent", "victor", "walter", "wendy"]


def sql_parts():
    """{'SHARD': sql, 'PROXY': sql} from proxy_functions.sql."""
    with open(FUNCTIONS) as f:
        text = f.read()
    parts = {}
    for name, body in re.findall(r"^-- @@ (\w+)\n(.*?)(?=^-- @@ |\Z)", text, flags=re.S | re.M):
        parts[name] = body
    return parts


def start_cluster(directory, port, preload=None, conf=""):
    """scripts/pgcluster.sh start; returns a Cluster that owns the folder."""
    env = dict(os.environ, PGBIN=os.environ.get("PGBIN", PGBIN_DEFAULT), PGCLUSTER_CONF=conf)
    if preload is not None:
        env["PGCLUSTER_PRELOAD"] = preload
    result = subprocess.run([os.path.join(REPO, "scripts", "pgcluster.sh"), "start", directory, str(port)],
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError("could not start a cluster on port %d: %s%s" % (port, result.stdout, result.stderr))
    return Cluster(directory=directory, port=port, own=True)


class ProxyTopology:
    """N shard clusters and a PL/Proxy cluster in one temporary folder."""

    def __init__(self, shards, proxy, parent):
        self.shards = shards
        self.proxy = proxy
        self.parent = parent
        self.owners = {}  # principal -> shard number, from the proxy's hashtext

    @classmethod
    def start(cls, count, base_port):
        """Starts `count` shards on base_port.. and the proxy on base_port + count."""
        if count < 1 or count & (count - 1):
            raise RuntimeError("--proxy-shards must be a power of two (PL/Proxy's partition count)")
        pgbin = os.environ.get("PGBIN", PGBIN_DEFAULT)
        sharedir = subprocess.run([os.path.join(pgbin, "pg_config"), "--sharedir"], capture_output=True,
                                  text=True).stdout.strip()
        if sharedir and not os.path.exists(os.path.join(sharedir, "extension", "plproxy.control")):
            raise RuntimeError("PL/Proxy is not installed in %s (Debian: apt-get install postgresql-<major>-plproxy)"
                               % sharedir)
        parent = tempfile.mkdtemp(prefix="idem-model-proxy.")
        shards, proxy = [], None
        try:
            for n in range(count):
                shards.append(start_cluster(os.path.join(parent, "shard%d" % n), base_port + n))
            # The proxy needs neither pg_cron nor the extension; it notices clients that went away.
            proxy = start_cluster(os.path.join(parent, "proxy"), base_port + count, preload="",
                                  conf="client_connection_check_interval = '50ms'")
        except Exception:
            for c in shards + ([proxy] if proxy else []):
                c.stop()
            shutil.rmtree(parent, ignore_errors=True)
            raise
        return cls(shards, proxy, parent)

    # -- what a run needs from a cluster ----------------------------------------

    def can_restart(self):
        """Restarts are always possible (the checker owns every folder)."""
        return True

    def conninfo(self, dbname):
        """The clients' connection string: the proxy."""
        return self.proxy.conninfo(dbname)

    def admin_conninfo(self):
        """The proxy's maintenance database."""
        return self.proxy.admin_conninfo()

    def all_clusters(self):
        """The shards, then the proxy."""
        return self.shards + [self.proxy]

    def shard_conninfos(self, dbname):
        """One connection string per shard, by shard number."""
        return [s.conninfo(dbname) for s in self.shards]

    def owner(self, principal):
        """The shard that owns `principal` (hashtext(principal) & (N - 1), computed by the proxy)."""
        return self.owners[principal]

    def compute_owners(self, principals):
        """Asks the proxy's hashtext which shard owns each principal."""
        with psycopg.connect(self.proxy.admin_conninfo(), autocommit=True, connect_timeout=10) as conn:
            for p in principals:
                self.owners[p] = conn.execute("SELECT hashtext(%s) & %s", (p, len(self.shards) - 1)).fetchone()[0]
        return self.owners

    def pick_principals(self, count):
        """`count` principals spread over the shards (round robin by owner),
        from a fixed list of names."""
        self.compute_owners(NAMES)
        by_shard = [[p for p in NAMES if self.owners[p] == n] for n in range(len(self.shards))]
        chosen = []
        while len(chosen) < count and any(by_shard):
            for names in by_shard:
                if names and len(chosen) < count:
                    chosen.append(names.pop(0))
        if len(chosen) < count:
            raise RuntimeError("not enough principal names for %d principals" % count)
        return chosen

    def restart(self):
        """Not used: the fault thread restarts one cluster at a time."""
        raise RuntimeError("restart a shard or the proxy")

    def ensure_running(self):
        """Starts again any cluster a fault left stopped."""
        for c in self.all_clusters():
            c.ensure_running()

    def stop(self):
        """Stops and removes every cluster."""
        for c in self.all_clusters():
            c.stop()
        shutil.rmtree(self.parent, ignore_errors=True)

    def fresh_database(self, name):
        """Database `name` on every shard (extension, effect table, shard
        functions, its number) and on the proxy (plproxy, the server
        model_shards naming every shard's database, proxy functions); returns
        the extension version."""
        parts = sql_parts()
        version = None
        for n, shard in enumerate(self.shards):
            version = shard.fresh_database(name)
            with psycopg.connect(shard.conninfo(name), autocommit=True, connect_timeout=10) as conn:
                conn.execute(parts["SHARD"])
                conn.execute("INSERT INTO model.whoami VALUES (%s)", (n,))
        with psycopg.connect(self.proxy.admin_conninfo(), autocommit=True, connect_timeout=10) as conn:
            conn.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
            conn.execute('CREATE DATABASE "%s"' % name)
        with psycopg.connect(self.proxy.conninfo(name), autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE EXTENSION plproxy")
            options = ", ".join("p%d '%s application_name=%s connect_timeout=5'" % (n, s.conninfo(name), SHARD_APP)
                                for n, s in enumerate(self.shards))
            conn.execute("CREATE SERVER model_shards FOREIGN DATA WRAPPER plproxy OPTIONS (%s)" % options)
            conn.execute("CREATE USER MAPPING FOR PUBLIC SERVER model_shards OPTIONS (user 'postgres')")
            conn.execute(parts["PROXY"])
        return version

    def drop_database(self, name):
        """Drops a run's database everywhere (best effort)."""
        for c in self.all_clusters():
            c.drop_database(name)




class RemoteLost(Exception):
    """PL/Proxy lost (or could not open) its connection to a shard, or the shard
    answered a connection-level error: the call's outcome is unknown, the
    client's connection to the proxy is still fine."""


class ProxyClient(Client):
    """A client of the function-call form: every operation is one call on the
    proxy (one transaction on the owning shard, committed when it answers)."""

    def resolve_unknown(self):
        """In-doubt calls are resolved at the end of the run only: a shard may
        still be running (and then commit) a call whose answer was lost."""
        self.unresolved = []

    def q(self, sql, params=None):
        """Runs one statement on the proxy; raises ConnectionLost (proxy
        connection gone), RemoteLost (the shard's) or ServerError (with .detail,
        the remote DETAIL without PL/Proxy's prefix)."""
        try:
            cur = self.conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else None
        except psycopg.Error as error:
            state = getattr(error, "sqlstate", None)
            text = str(error)
            if self.conn is None or self.conn.broken or self.conn.closed or (
                    state is None and isinstance(error, psycopg.OperationalError)):
                self.drop_connection()
                raise ConnectionLost(text) from None
            remote = "REMOTE ERROR" in text
            if ("PL/Proxy function" in text and not remote) or (remote and state in CONNECTION_LOST):
                raise RemoteLost(text) from None
            if state in CONNECTION_LOST:
                self.drop_connection()
                raise ConnectionLost(text) from None
            failure = ServerError(state, text.strip())
            detail = error.diag.message_detail or ""
            failure.detail = detail[len("Remote detail: "):] if detail.startswith("Remote detail: ") else detail
            raise failure from None

    def call(self, op, sql, params):
        """One function call = one transaction on a shard. Returns its rows, or
        raises: ServerError (op.commit no; unknown for 57014, whose cancel may
        come after the shard committed), RemoteLost or ConnectionLost (op.commit
        unknown)."""
        op.commit_sent = op.sent  # the shard may commit at any moment of the call
        try:
            rows = self.q(sql, params)
        except ServerError as error:
            op.acked = op.commit_acked = time.time()
            op.commit, op.outcome = ("unknown", "cancelled") if error.sqlstate == "57014" else (
                "no", "error " + error.sqlstate)
            raise
        except RemoteLost:
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "shard lost"
            raise
        except ConnectionLost:
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "lost"
            raise
        op.acked = op.commit_acked = time.time()
        op.commit = "yes"
        return rows

    def simple(self, op, sql, params):
        """call() for the short operations: the row, or None when the call
        failed (an unexpected SQLSTATE is recorded)."""
        try:
            return self.call(op, sql, params)[0]
        except ServerError as error:
            op.writes = False
            if error.sqlstate not in RETRYABLE | {"57014"}:
                self.unexpected(op, error)
            return None
        except RemoteLost:
            return None

    def in_progress_usable(self, op, usable):
        """I5, checked on the shard: after in_progress the transaction was still usable."""
        if usable is not None:
            self.model.violation("I5", op.key_id(), "%s: after %s answered in_progress, SELECT 1 raised %s"
                                 % (op.id, op.kind, usable), [op])

    # -- operations ---------------------------------------------------------

    def op_txn(self):
        """model.txn: begin -> effect -> complete in one call, or one of the ways to fail."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1, 0.3])
        variant = self.pick({"complete": 70, "rollback": 8, "no_complete": 6, "stmt_error": 6, "secret": 5,
                             "timeout": 3 if "timeout" in self.settings.faults else 0,
                             "disconnect": 3 if "disconnect" in self.settings.faults else 0})
        op = self.new_op("txn", principal, key, fp)
        op.params = {"ttl": ttl, "wait": wait, "variant": variant}
        status, headers, body = self.response(op, [200, 201, 202, 204])
        pause = self.rng.uniform(0.05, 0.2) if variant in ("timeout", "disconnect") else 0.0
        if variant in ("complete", "secret", "timeout", "disconnect"):
            op.writes = True  # until the answer says otherwise
            op.secret = variant == "secret"
            op.response = (status, None, None) if op.secret else (status, headers, body)
        sql = ("SELECT outcome, status, headers, body, resource_id, expires_at, fence, now_at, clock_at, usable"
               "  FROM model.txn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
        params = (principal, key, "t:" + op.id, fingerprint(fp), seconds(ttl), seconds(wait),
                  "slow" if pause else variant, status, body, Jsonb(headers) if headers is not None else None,
                  self.number, op.id, pause)
        if variant == "disconnect":
            self.count_fault()
            op.note = "disconnect fault during the call"
            text = psycopg.ClientCursor(self.conn).mogrify(sql, params)
            op.commit_sent = op.sent
            self.conn.pgconn.send_query(text.encode())
            time.sleep(self.rng.uniform(0, 2 * pause))
            op.acked = time.time()
            op.commit, op.outcome = "unknown", "disconnected"
            self.drop_connection()
            return
        timeout = None
        if variant == "timeout":
            timeout = self.rng.choice([20, 60, 150])
            op.note = "statement_timeout %d ms fault" % timeout
            self.q("SET statement_timeout = %d" % timeout)
        try:
            rows = self.call(op, sql, params)
        except ServerError as error:
            if error.sqlstate in ("MR001", "22012") and variant in ("rollback", "stmt_error"):
                fence, expires, now, clock = error.detail.split()
                op.outcome, op.fence, op.expires = "started", int(fence), float(expires)
                op.now, op.clock = float(now), float(clock)
                op.note = "rolled back (%s)" % error.sqlstate
                self.model.check_start(op)
            elif error.sqlstate == "55000" and variant == "no_complete":
                op.note = "started, no complete: the commit failed"
            elif error.sqlstate == "57014" and variant == "timeout":
                self.count_fault()  # cancelled: in doubt, resolved at the end from the effect table
            elif error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
            return
        except RemoteLost:
            return
        finally:
            if timeout is not None and self.conn is not None:
                try:
                    self.q("SET statement_timeout = '20s'")
                except (ServerError, RemoteLost):
                    pass
        outcome, r_status, r_headers, r_body, resource_id, expires, fence, now, clock, usable = rows[0]
        op.outcome = outcome
        op.now, op.clock = epoch(now), epoch(clock)
        if outcome != "started":
            op.writes = False
            if outcome == "in_progress":
                self.in_progress_usable(op, usable)
            elif outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(op, outcome, r_status, r_headers, r_body and bytes(r_body),
                                        resource_id, fence)
            return
        op.fence, op.expires = fence, epoch(expires)
        self.model.check_start(op)
        if variant == "no_complete":
            self.model.violation("I1", op.key_id(), "%s: the call committed without complete(): an effect "
                                 "committed without its key" % op.id, [op])

    def op_lease(self):
        """acquire -> the external effect -> renew(s) -> complete(fence), release or abandon, one call each."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, lease = self.draw_ttl_lease()
        wait = self.rng.choice([0, 0.02, 0.1])
        acq = self.new_op("acquire", principal, key, fp)
        acq.params = {"ttl": ttl, "lease": lease, "wait": wait}
        row = self.simple(acq, "SELECT outcome, status, headers, body, resource_id, expires_at, fence, lease_until,"
                               "       now_at, clock_at, usable"
                               "  FROM model.acquire(%s, %s, %s, %s, %s, %s, %s)",
                          (principal, key, "l:" + acq.id, fingerprint(fp), seconds(lease), seconds(ttl),
                           seconds(wait)))
        if row is None:
            return
        outcome, status, headers, body, resource_id, expires, fence, lease_until, now, clock, usable = row
        acq.outcome = outcome
        acq.now, acq.clock = epoch(now), epoch(clock)
        acq.writes = outcome == "started"
        if outcome != "started":
            if outcome in ("replay", "secret_replay", "mismatch"):
                self.model.check_answer(acq, outcome, status, headers, body and bytes(body), resource_id, fence)
            elif outcome == "in_progress":
                self.in_progress_usable(acq, usable)
            return
        acq.fence, acq.expires, acq.lease_min = fence, epoch(expires), lease_until
        self.model.check_start(acq)
        effect = self.new_op("effect", principal, key, fp)
        effect.holder, effect.fence = acq, fence
        self.simple(effect, "SELECT model.lease_effect(%s, %s, %s, %s, %s)",
                    (principal, key, fence, self.number, acq.id))
        for _ in range(self.rng.choice([0, 0, 1, 1, 2, 3])):
            time.sleep(lease * self.rng.choice([0.2, 0.3, 0.5, 0.8, 1.3]))
            renewal = self.new_op("renew", principal, key, fp)
            renewal.holder, renewal.fence = acq, fence
            renewal.params = {"lease_s": lease}
            with self.model.lock:
                acq.renewed_by.append(renewal)
            row = self.simple(renewal, "SELECT now_at, renewed, clock_at FROM model.renew(%s, %s, %s, %s)",
                              (principal, key, fence, seconds(lease)))
            if row is None:
                break
            now, renewed, clock = row
            renewal.outcome = renewed
            renewal.now, renewal.clock = epoch(now), epoch(clock)
            if renewed:
                self.model.check_fenced_success(renewal)
            if not renewed:
                break
        time.sleep(lease * self.rng.choice([0.1, 0.3, 0.6, 1.2]))
        last = self.pick({"complete": 60, "release": 25, "abandon": 15})
        if last == "abandon":
            acq.note = "abandoned"
            return
        done = self.new_op(last, principal, key, fp)
        done.holder, done.fence = acq, fence
        with self.model.lock:
            (acq.completed_by if last == "complete" else acq.released_by).append(done)
        if last == "complete":
            secret = self.rng.random() < 0.1
            status, headers, body = self.response(done, [200, 201, 402, 404, 409, 500])
            done.secret = secret
            done.response = (status, None, None) if secret else (status, headers, body)
            done.params = {"status": status}
            row = self.simple(done, "SELECT model.complete_fenced(%s, %s, %s, %s, %s, %s, %s, %s)",
                              (principal, key, fence, status, body, Jsonb(headers) if headers is not None else None,
                               done.id, secret))
        else:
            row = self.simple(done, "SELECT model.release(%s, %s, %s)", (principal, key, fence))
        if row is None:
            return
        done.outcome = row[0]
        if done.outcome:
            self.model.check_fenced_success(done)
        if last == "complete" and done.outcome is True and self.rng.random() < 0.15:
            self.complete_again(acq, principal, key, fp, fence)

    def complete_again(self, acq, principal, key, fp, fence):
        """I1: a second complete(fence) of one lease generation must answer false."""
        again = self.new_op("complete", principal, key, fp)
        again.holder, again.fence = acq, fence
        status, headers, body = self.response(again, [200, 201])
        again.response = (status, headers, body)
        again.note = "second complete of one generation"
        row = self.simple(again, "SELECT model.complete_fenced(%s, %s, %s, %s, %s, %s, %s, false)",
                          (principal, key, fence, status, body, Jsonb(headers) if headers is not None else None,
                           again.id))
        if row is None:
            return
        again.outcome = row[0]
        if again.outcome:
            self.model.violation("I1", again.key_id(), "%s: a second complete(fence %s) of %s answered true: "
                                 "a lease generation completed twice" % (again.id, fence, acq.id), [acq, again],
                                 "lease generation completed twice")
            with self.model.lock:
                acq.completed_by.append(again)

    def op_save_final(self):
        """model.save_final of a final 4xx (or a non-final 500, which must answer false)."""
        principal, key = self.draw_key()
        fp = self.rng.randrange(self.settings.fingerprints)
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("save_final", principal, key, fp)
        status, headers, body = self.response(op, [404, 409, 422, 422, 500])
        op.params = {"ttl": ttl, "status": status}
        op.response = (status, headers, body)  # what a call whose answer is lost may have stored
        row = self.simple(op, "SELECT now_at, saved, clock_at FROM model.save_final(%s, %s, %s, %s, %s, %s, %s, %s)",
                          (principal, key, "s:" + op.id, fingerprint(fp), status, body,
                           Jsonb(headers) if headers is not None else None, seconds(ttl)))
        if row is None:
            return
        now, saved, clock = row
        op.outcome = saved
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(saved)
        if saved:
            op.expires = op.now + ttl
            self.model.check_start(op)

    def op_claim(self):
        """model.claim with a short ttl."""
        principal, key = self.draw_key()
        ttl, _ = self.draw_ttl_lease()
        op = self.new_op("claim", principal, key, "claim")
        op.params = {"ttl": ttl}
        row = self.simple(op, "SELECT now_at, claimed, clock_at FROM model.claim(%s, %s, %s)",
                          (principal, key, seconds(ttl)))
        if row is None:
            return
        now, claimed, clock = row
        op.outcome = claimed
        op.now, op.clock = epoch(now), epoch(clock)
        op.writes = bool(claimed)
        if claimed:
            op.expires = op.now + ttl
            self.model.check_start(op)

    def op_forget(self):
        """model.forget."""
        principal, key = self.draw_key()
        op = self.new_op("forget", principal, key)
        row = self.simple(op, "SELECT model.forget(%s, %s)", (principal, key))
        if row is not None:
            op.outcome = row[0]

    def op_cleanup(self):
        """model.cleanup(): one cleanup batch on every shard (RUN ON ALL)."""
        op = self.new_op("cleanup")
        row = self.simple(op, "SELECT sum(c)::int FROM model.cleanup() AS c", None)
        if row is not None:
            op.outcome = row[0]

    def op_inspect(self):
        """model.inspect on every shard: the owner's row is checked against the
        model, and no other shard may hold the key."""
        principal, key = self.draw_key()
        op = self.new_op("inspect", principal, key)
        try:
            rows = self.call(op, "SELECT shard, action, fence, state, status, headers, body, now_at, clock_at"
                                 "  FROM model.inspect(%s, %s)", (principal, key))
        except ServerError as error:
            if error.sqlstate not in RETRYABLE:
                self.unexpected(op, error)
            return
        except RemoteLost:
            return
        owner = self.settings.owners[principal]
        for shard, action, fence, state, status, headers, body, now, clock in rows:
            if shard != owner:
                if action is not None:
                    self.model.violation("ROUTE", op.key_id(), "%s: shard %d holds a row of the key (%s/%s/fence %s),"
                                         " but the key belongs to shard %d" % (op.id, shard, action, state, fence,
                                                                              owner), [op], "key on a foreign shard")
                continue
            op.now, op.clock = epoch(now), epoch(clock)
            if action is None:
                op.outcome = "absent"
                self.model.check_row(op, None)
            else:
                op.outcome = "%s/%s/fence %s" % (action, state, fence)
                self.model.check_row(op, {"action": action, "fence": fence, "state": state, "status": status,
                                          "headers": headers, "body": body and bytes(body)})


class ProxyFaults(Faults):
    """Server faults on one cluster of the topology at a time: SIGKILL of a
    backend (on a shard: one of the proxy's connections, crash recovery of that
    shard; on the proxy: a client's backend) or an immediate restart."""

    def __init__(self, seed, topology, dbname, kinds, mean_interval, stop, stats, log, model):
        super().__init__(seed, topology, topology.admin_conninfo(), dbname, kinds, mean_interval, stop, stats, log,
                         model)
        self.topology = topology

    def run(self):
        """Injects a fault at random moments until stopped."""
        if not self.kinds:
            return
        targets = self.topology.all_clusters()
        while not self.stop.wait(self.rng.uniform(0.3 * self.mean, 1.7 * self.mean)):
            kind = self.rng.choice(self.kinds * 3 if len(self.kinds) == 1 else ["kill", "kill", "kill", "restart"])
            n = self.rng.randrange(len(targets))
            target = targets[n]
            name = "proxy" if target is self.topology.proxy else "shard %d" % n
            try:
                if kind == "kill" and self.kill_on(target, name):
                    self.count()
                elif kind == "restart":
                    self.note()
                    target.restart()
                    self.count()
                    self.log("fault: immediate restart of the %s" % name)
            except Exception as error:  # keep injecting; the clients notice what happened
                self.log("fault %s on the %s failed: %s" % (kind, name, error))

    def kill_on(self, target, name):
        """SIGKILL of a random backend of this run on `target`; false when there was none."""
        like = "model-c%" if target is self.topology.proxy else SHARD_APP
        with psycopg.connect(target.admin_conninfo(), autocommit=True, connect_timeout=5) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name LIKE %s",
                (self.dbname, like)).fetchall()]
        if not pids:
            return False
        pid = self.rng.choice(sorted(pids))
        self.note()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.log("fault: SIGKILL backend %d on the %s" % (pid, name))
        return True


def end_phase(run, settings):
    """The end of a run in the function-call form, reading every shard
    directly: effects and key rows (I4, I1, I2, I3), every row and effect on
    the shard that owns its principal (ROUTE), then I6 and I3 on each key's
    shard once every ttl and lease has passed."""
    topology, model = run.cluster, run.model
    keys = [(p, k) for p in settings.principals for k in settings.keys]
    conns = [run.connect_until(c) for c in topology.shard_conninfos(run.dbname)]
    try:
        for conn in conns:
            conn.execute("SET statement_timeout = '10s'")
        # Calls whose answer was lost may still run on a shard (and commit): wait for them.
        give_up = time.time() + 15
        while time.time() < give_up and any(conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                "   AND application_name = %s AND state <> 'idle'", (SHARD_APP,)).fetchone()[0] for conn in conns):
            time.sleep(0.1)
        present = {}
        for shard, conn in enumerate(conns):
            for op_id, kind, principal, key, fence in conn.execute(
                    "SELECT op_id, kind, principal, key, fence FROM model_effects").fetchall():
                present.setdefault(op_id, []).append((kind, principal, key, fence))
                if topology.owner(principal) != shard:
                    model.violation("ROUTE", (principal, key), "the effect of %s is on shard %d, but the key "
                                    "belongs to shard %d" % (op_id, shard, topology.owner(principal)), [],
                                    "effect on a foreign shard")
        with model.lock:
            for op in list(model.ops.values()):
                if op.kind == "txn" and op.commit == "unknown":
                    op.commit = "yes" if op.id in present else "no"
                    op.commit_acked = time.time()
                    if op.id in present and op.fence is None:
                        op.fence = present[op.id][0][3]  # the fence it was handed, from its effect
                    op.note = (op.note + " in-doubt commit resolved").strip()
            run.check_effects(present)
        rows = {}
        for shard, conn in enumerate(conns):
            for principal, key, action, fence, state, status, headers, body in conn.execute(
                    "SELECT principal, key, action, fence, state, response_status, response_headers, response_body"
                    "  FROM idempotency.keys").fetchall():
                owner = topology.owner(principal)
                if owner != shard:
                    model.violation("ROUTE", (principal, key), "shard %d holds a row of the key (%s/%s/fence %s), "
                                    "but the key belongs to shard %d" % (shard, action, state, fence, owner), [],
                                    "key on a foreign shard")
                    continue
                rows[(principal, key)] = {"action": action, "fence": fence, "state": state, "status": status,
                                          "headers": headers, "body": body and bytes(body)}
        for key in keys:
            conn = conns[topology.owner(key[0])]
            op = run.end_op("inspect", key, conn)
            op.acked = time.time()
            row = rows.get(key)
            op.outcome = "absent" if row is None else "%s/%s/fence %s" % (row["action"], row["state"], row["fence"])
            model.check_row(op, row)
        time.sleep(run.latest_deadline(settings) + 0.3)
        for shard, conn in enumerate(conns):
            conn.execute("CALL idempotency.cleanup()")
            for principal, key, state, expired, lease_live in conn.execute(
                    "SELECT principal, key, state, expires_at <= now(),"
                    "       state = 'in_progress' AND lease_until > clock_timestamp()"
                    "  FROM idempotency.keys ORDER BY 1, 2").fetchall():
                model.violation("I6", (principal, key),
                                "after every ttl and lease had passed, cleanup on shard %d left a %s row "
                                "(expired: %s, lease live: %s)" % (shard, state, expired, lease_live))
        fresh = settings.fingerprints + 1
        for key in keys:
            run.end_start(conns[topology.owner(key[0])], key, fresh)
    finally:
        for conn in conns:
            conn.close()
