"""The function-call form of the checker (--proxy-shards N): N shard clusters
and one PL/Proxy cluster, each a scripts/pgcluster.sh cluster the checker
starts and stops itself. Clients talk only to the proxy; every operation is
one function call of tests/model/proxy_functions.sql, routed to the shard that
owns the principal (hashtext(principal) & (N - 1)).

The topology offers what a run needs from a Cluster (fresh databases, the
clients' connection string, restarts) plus the shards' own connection
strings for the fault thread and the end phase. The clients' calls go out
through transport_proxy.py; the faults on shards and proxy are in faults.py.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time

import psycopg

from cluster import PGBIN_DEFAULT, REPO, Cluster
from faults import SHARD_APP

FUNCTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proxy_functions.sql")
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
