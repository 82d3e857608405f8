"""The PostgreSQL cluster a run talks to: one the checker starts itself with
scripts/pgcluster.sh (PGBIN from the environment), a given cluster folder of
that script, or a plain DSN (then server faults other than backend kills are
off). Every run gets a fresh database with the extension and the effect table.
"""

import os
import subprocess
import tempfile

import psycopg

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The trusted edition's install script (checker.py --install-script), run with
# psql in each fresh database instead of CREATE EXTENSION; None: the extension.
INSTALL_SCRIPT = None
PGBIN_DEFAULT = "/usr/lib/postgresql/15/bin"

EFFECTS_TABLE = """
CREATE TABLE model_effects (
    id bigserial PRIMARY KEY,
    principal text NOT NULL,
    key text NOT NULL,
    fence bigint,
    client integer NOT NULL,
    op_id text NOT NULL,
    kind text NOT NULL,
    writer name NOT NULL DEFAULT current_user,
    at timestamptz NOT NULL DEFAULT clock_timestamp())
"""


def as_postgres(argv):
    """argv run as the postgres user when we are root (initdb and pg_ctl refuse root)."""
    return (["runuser", "-u", "postgres", "--"] + argv) if os.geteuid() == 0 else argv


class Cluster:
    """A server to test: where it listens and, when known, its data folder."""

    def __init__(self, directory=None, port=None, dsn=None, own=False):
        self.directory = directory
        self.port = port
        self.dsn = dsn
        self.own = own
        self.pgbin = os.environ.get("PGBIN", PGBIN_DEFAULT)

    @classmethod
    def start(cls, port, preload=None):
        """Starts a throwaway cluster with scripts/pgcluster.sh in a new temporary folder
        (`preload`: its shared_preload_libraries, default the script's)."""
        parent = tempfile.mkdtemp(prefix="idem-model.")
        directory = os.path.join(parent, "pg")
        env = dict(os.environ, PGBIN=os.environ.get("PGBIN", PGBIN_DEFAULT))
        if preload is not None:
            env["PGCLUSTER_PRELOAD"] = preload
        result = subprocess.run([os.path.join(REPO, "scripts", "pgcluster.sh"), "start", directory, str(port)],
                                env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError("could not start a cluster: %s%s" % (result.stdout, result.stderr))
        return cls(directory=directory, port=port, own=True)

    @classmethod
    def existing(cls, directory):
        """A cluster folder made by scripts/pgcluster.sh (its env file names the port)."""
        port = None
        with open(os.path.join(directory, "env")) as env:
            for line in env:
                if line.startswith("export PGPORT="):
                    port = int(line.split("=", 1)[1].strip().strip("'"))
        return cls(directory=os.path.abspath(directory), port=port)

    def can_restart(self):
        """Whether this run knows the data folder (needed for restarts)."""
        return self.directory is not None

    def conninfo(self, dbname):
        """Connection string for database `dbname`."""
        if self.dsn is not None:
            return psycopg.conninfo.make_conninfo(self.dsn, dbname=dbname)
        return "host=%s port=%d user=postgres dbname=%s" % (self.directory, self.port, dbname)

    def admin_conninfo(self):
        """Connection string for the maintenance database."""
        return self.conninfo("postgres") if self.dsn is None else self.dsn

    def restart(self):
        """pg_ctl -m immediate stop, then start: crash recovery with clients connected."""
        data = os.path.join(self.directory, "data")
        subprocess.run(as_postgres([os.path.join(self.pgbin, "pg_ctl"), "-D", data, "-m", "immediate", "-w",
                                    "stop"]), capture_output=True, check=False)
        result = subprocess.run(as_postgres([os.path.join(self.pgbin, "pg_ctl"), "-D", data, "-l",
                                             os.path.join(self.directory, "server.log"), "-w", "-t", "60",
                                             "start"]), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError("restart failed: %s%s" % (result.stdout, result.stderr))

    def ensure_running(self):
        """Starts the server again if a fault left it stopped."""
        if self.directory is None:
            return
        data = os.path.join(self.directory, "data")
        status = subprocess.run(as_postgres([os.path.join(self.pgbin, "pg_ctl"), "-D", data, "status"]),
                                capture_output=True)
        if status.returncode != 0:
            self.restart()

    def stop(self):
        """Stops a cluster this checker started, and removes it."""
        if self.own and self.directory is not None:
            subprocess.run([os.path.join(REPO, "scripts", "pgcluster.sh"), "stop", self.directory],
                           env=dict(os.environ, PGBIN=self.pgbin), capture_output=True)
            try:
                os.rmdir(os.path.dirname(self.directory))
            except OSError:
                pass

    def fresh_database(self, name):
        """Creates database `name` with the extension and the effect table; returns
        the extension version. With INSTALL_SCRIPT set (--install-script), the
        script is run with psql instead of CREATE EXTENSION (the trusted edition)."""
        with psycopg.connect(self.admin_conninfo(), autocommit=True, connect_timeout=10) as conn:
            conn.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
            conn.execute('CREATE DATABASE "%s"' % name)
        if INSTALL_SCRIPT:
            subprocess.run([os.path.join(self.pgbin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                            "-d", self.conninfo(name), "-f", INSTALL_SCRIPT],
                           check=True, stdout=subprocess.DEVNULL)
            with psycopg.connect(self.conninfo(name), autocommit=True, connect_timeout=10) as conn:
                conn.execute(EFFECTS_TABLE)
                conn.execute("CREATE INDEX ON model_effects (op_id)")
                # 'trusted 0.9.0'
                return conn.execute("SELECT idempotency.edition()").fetchone()[0].split()[-1]
        with psycopg.connect(self.conninfo(name), autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE EXTENSION idempotency")
            conn.execute(EFFECTS_TABLE)
            conn.execute("CREATE INDEX ON model_effects (op_id)")
            return conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]

    def drop_database(self, name):
        """Drops a run's database (best effort)."""
        try:
            with psycopg.connect(self.admin_conninfo(), autocommit=True, connect_timeout=10) as conn:
                conn.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
        except psycopg.Error:
            pass
