"""Server faults while a run goes: SIGKILL of a backend (crash recovery of the
whole cluster) and immediate restarts, at random moments from the seed; in the
function-call form on one cluster of the topology at a time. Client faults
(statement_timeout cancels, disconnects) are drawn by the clients themselves.
"""

import os
import random
import signal
import threading
import time

import psycopg

# application_name of the proxy's connections to the shards (the fault thread kills those backends).
SHARD_APP = "model-proxy-conn"


class Faults(threading.Thread):
    """Server faults at random moments: SIGKILL of a client backend (crash
    recovery of the whole cluster) and an immediate restart."""

    def __init__(self, seed, cluster, admin_conninfo, dbname, kinds, mean_interval, stop, stats, log, model):
        super().__init__(name="model-faults", daemon=True)
        self.rng = random.Random("%s:faults" % seed)
        self.cluster = cluster
        self.admin_conninfo = admin_conninfo
        self.dbname = dbname
        self.kinds = [k for k in ("kill", "restart") if k in kinds]
        self.mean = mean_interval
        self.stop = stop
        self.stats = stats
        self.log = log
        self.model = model

    def note(self):
        """Records that a server fault starts now (it lets every key lock go)."""
        with self.model.lock:
            self.model.fault_times.append(time.time())

    def run(self):
        """Injects a fault at random moments until stopped."""
        if not self.kinds:
            return
        while not self.stop.wait(self.rng.uniform(0.3 * self.mean, 1.7 * self.mean)):
            kind = self.rng.choice(self.kinds * 3 if len(self.kinds) == 1 else ["kill", "kill", "kill", "restart"])
            try:
                if kind == "kill" and self.kill_backend():
                    self.count()
                elif kind == "restart":
                    self.note()
                    self.cluster.restart()
                    self.count()
                    self.log("fault: immediate restart")
            except Exception as error:  # keep injecting; the clients notice what happened
                self.log("fault %s failed: %s" % (kind, error))

    def count(self):
        """Counts one injected fault."""
        with self.stats["lock"]:
            self.stats["faults"] += 1

    def kill_backend(self):
        """SIGKILL of a random client backend of this run; false when there was none."""
        with psycopg.connect(self.admin_conninfo, autocommit=True, connect_timeout=5) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'model-c%%'",
                (self.dbname,)).fetchall()]
        if not pids:
            return False
        pid = self.rng.choice(sorted(pids))
        self.note()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.log("fault: SIGKILL backend %d" % pid)
        return True


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


