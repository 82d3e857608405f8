"""The role dimension (--roles): the hostile role in the checker (issue 20, section 3).

A superuser binds every principal role (alice, bob, ...: role name =
principal) with `idempotency.principal_binding = current_user` (ALTER ROLE
... SET, or ALTER ROLE ... IN DATABASE ... SET, drawn per run). Client n
connects as role principals[n % P]; most of its calls name its own principal
("honest"), some another role's ("hostile"), and the `steal` operation uses a
fence of another role's key taken from the model (as if it had leaked) for
renew, complete or release, or reads that key with lookup.

Each connection draws a PATH by which a value of the binding reaches its
session, a combination of: a startup option (`options` keyword, as PGOPTIONS
sends it), a connection-string option (`options='--idempotency...'`), SET
before the first call, SET LOCAL in the first transaction, RESET, DISCARD
ALL, a login as model_gateway followed by SET ROLE to the client's role, and
calls through SECURITY DEFINER wrappers owned by the superuser (schema
model_definer). Every tampering step tries to switch the binding off.

Invariant BIND: a call for a principal that is not its role's (after SET
ROLE: the role set) must fail with 42501 or 22023 (the refusal, or the
documented refusal while the binding is unverified); an answer of any kind
is a violation. Honest calls may be refused (42501/22023) only on a path
with a tampering step (the binding may then be unverified); on a clean path
(plain, SET ROLE, SECURITY DEFINER) a refusal is ERR. At the end every key
row and every effect must belong to its writer's role (checked in model.py
and checker.py).
"""

import psycopg

GATEWAY = "model_gateway"  # logs in, then SET ROLE to the client's role
STEAL_WEIGHT = 4  # weight of the steal operation when roles are on
REFUSALS = ("42501", "22023")
# Calls that read or write a principal's key (inspect, effect and cleanup do not name one).
PROTOCOL = ("txn", "acquire", "renew", "complete", "release", "save_final", "claim", "forget", "lookup")
# Steps that try to switch the binding off; after them a refusal of an honest call is allowed.
TAMPERING = ("startup", "conninfo", "set", "set_local", "reset", "discard")
OFF = "idempotency.principal_binding=off"

DEFINER = """
CREATE SCHEMA model_definer;
CREATE FUNCTION model_definer.begin(principal text, key text, action text, fingerprint bytea,
                                    ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
    RETURNS SETOF idempotency.key_outcome LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT * FROM idempotency.begin($1, $2, $3, $4, $5, $6) $$;
CREATE FUNCTION model_definer.acquire(principal text, key text, action text, fingerprint bytea,
                                      lease interval DEFAULT NULL, ttl interval DEFAULT NULL,
                                      wait interval DEFAULT NULL)
    RETURNS SETOF idempotency.key_outcome LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT * FROM idempotency.acquire($1, $2, $3, $4, $5, $6, $7) $$;
CREATE FUNCTION model_definer.complete(principal text, key text, status integer, body bytea DEFAULT NULL,
                                       headers jsonb DEFAULT NULL, resource_id text DEFAULT NULL,
                                       one_time_secret boolean DEFAULT false, fence bigint DEFAULT NULL)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7, $8) $$;
CREATE FUNCTION model_definer.renew(principal text, key text, fence bigint, lease interval DEFAULT NULL)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.renew($1, $2, $3, $4) $$;
CREATE FUNCTION model_definer.release(principal text, key text, fence bigint)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.release($1, $2, $3) $$;
CREATE FUNCTION model_definer.save_final(principal text, key text, action text, fingerprint bytea,
                                         status integer, body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
                                         ttl interval DEFAULT NULL)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7, $8) $$;
CREATE FUNCTION model_definer.claim(principal text, key text, ttl interval DEFAULT NULL)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.claim($1, $2, $3) $$;
CREATE FUNCTION model_definer.forget(principal text, key text)
    RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT idempotency.forget($1, $2) $$;
CREATE FUNCTION model_definer.lookup(principal text, key text)
    RETURNS TABLE (state text, fence bigint) LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT l.state, l.fence FROM idempotency.lookup($1, $2) AS l $$;
-- The checker's own reader of a key row (inspect): not a protocol call, the roles may not read the table.
CREATE FUNCTION model_definer.key_row(a_principal text, a_key text)
    RETURNS TABLE (action text, fence bigint, state text, status integer, headers jsonb, body bytea,
                   now_at timestamptz, clock_at timestamptz)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT k.action, k.fence, k.state::text, k.response_status, k.response_headers, k.response_body, now(),
           clock_timestamp()
      FROM (SELECT 1) AS one LEFT JOIN idempotency.keys AS k ON k.principal = a_principal AND k.key = a_key
$$;
"""

# The application, support and operator grants of docs/sql-reference.md, to every principal role.
GRANTS = """
GRANT USAGE ON SCHEMA idempotency, model_definer TO {r};
GRANT EXECUTE ON FUNCTION
    idempotency.begin(text, text, text, bytea, interval, interval),
    idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint),
    idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean),
    idempotency.acquire(text, text, text, bytea, interval, interval, interval),
    idempotency.renew(text, text, bigint, interval),
    idempotency.release(text, text, bigint),
    idempotency.claim(text, text, interval),
    idempotency.lookup(text, text), idempotency.forget(text, text),
    idempotency.cleanup_batch(integer, timestamptz)
  TO {r};
GRANT EXECUTE ON PROCEDURE idempotency.cleanup(integer, interval, interval, bigint) TO {r};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA model_definer TO {r};
GRANT SELECT, INSERT ON model_effects TO {r};
GRANT USAGE ON SEQUENCE model_effects_id_seq TO {r};
"""


class Refused(Exception):
    """The server refused a connection whose path tampers with the binding (allowed)."""


def role_of(settings, number):
    """The role client `number` connects as (None without the role dimension)."""
    return settings.principals[number % len(settings.principals)] if settings.roles else None


def prepare(conn, principals, dbname, how):
    """As a superuser in the run's database: the roles, their binding (set `how`:
    'role' or 'role_in_database'), the grants and the SECURITY DEFINER wrappers."""
    for role in principals + [GATEWAY]:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            conn.execute('CREATE ROLE "%s" LOGIN' % role)
        conn.execute('ALTER ROLE "%s" RESET ALL' % role)
        if how == "role":
            conn.execute("ALTER ROLE \"%s\" SET idempotency.principal_binding = 'current_user'" % role)
        else:
            conn.execute("ALTER ROLE \"%s\" IN DATABASE \"%s\" SET idempotency.principal_binding = 'current_user'"
                         % (role, dbname))
    conn.execute('GRANT %s TO "%s"' % (", ".join('"%s"' % p for p in principals), GATEWAY))
    conn.execute(DEFINER)
    for role in principals:
        conn.execute(GRANTS.format(r='"%s"' % role))


def draw_path(rng):
    """The steps by which values of the binding reach one connection."""
    steps = []
    start = rng.random()
    if start < 0.25:
        steps.append("startup")
    elif start < 0.45:
        steps.append("conninfo")
    for step, chance in (("set", 0.2), ("reset", 0.15), ("discard", 0.15), ("set_role", 0.3), ("set_local", 0.2),
                         ("definer", 0.3)):
        if rng.random() < chance:
            steps.append(step)
    return steps


def connect(transport, client):
    """The client's connection: plain without roles; with roles as its role, by a
    freshly drawn path. Raises Refused when the server refuses a tampering path."""
    if client.role is None:
        return psycopg.connect(transport.conninfo, autocommit=True, application_name=client.name,
                               connect_timeout=5)
    steps = draw_path(client.rng)
    client.path = "+".join(steps) or "plain"
    login = GATEWAY if "set_role" in steps else client.role
    conninfo = psycopg.conninfo.make_conninfo(transport.conninfo, user=login)
    if "conninfo" in steps:
        conninfo = psycopg.conninfo.make_conninfo(conninfo, options="--" + OFF)
    extra = {"options": "-c " + OFF} if "startup" in steps else {}
    try:
        conn = psycopg.connect(conninfo, autocommit=True, application_name=client.name, connect_timeout=5, **extra)
    except psycopg.OperationalError as error:
        if extra or "conninfo" in steps:
            if refused_at_connect(error):
                count(client.stats, "connections refused (%s)" % (
                    "startup option" if extra else "connection-string option"))
                raise Refused(str(error)) from None
        raise
    for step, sql in (("set", "SET idempotency.principal_binding = off"),
                      ("reset", "RESET idempotency.principal_binding"), ("discard", "DISCARD ALL")):
        if step in steps:
            try:
                conn.execute(sql)
            except psycopg.Error as error:
                if getattr(error, "sqlstate", None) not in REFUSALS:
                    raise
    if "set_role" in steps:
        conn.execute('SET ROLE "%s"' % client.role)
    transport.first_statements = ["SET LOCAL idempotency.principal_binding = off"] if "set_local" in steps else []
    transport.schema = "model_definer" if "definer" in steps else "idempotency"
    current = conn.execute("SELECT current_user").fetchone()[0]
    if current != client.role:
        raise RuntimeError("path %s left the session as %s, not %s" % (client.path, current, client.role))
    return conn


def refused_at_connect(error):
    """Whether a failed connection was the server refusing its options (a
    FATAL with SQLSTATE 42501 or 22023), not the server being away."""
    state = getattr(error, "sqlstate", None)
    text = str(error)
    return state in REFUSALS or any(("SQLSTATE %s" % s) in text for s in REFUSALS) or \
        "permission denied to set parameter" in text


def guarded(transport, sql):
    """A statement of the path inside the open transaction: a refusal (42501)
    rolls back to a savepoint and the transaction goes on."""
    transport.q("SAVEPOINT model_path")
    try:
        transport.q(sql)
    except Exception as error:
        if getattr(error, "sqlstate", None) not in REFUSALS:
            raise
        transport.q("ROLLBACK TO SAVEPOINT model_path")
    transport.q("RELEASE SAVEPOINT model_path")


def key_row_sql(transport):
    """How inspect reads a key row with roles (None: directly, as a superuser)."""
    if transport.client.role is None:
        return None
    return "SELECT * FROM model_definer.key_row(%s, %s)"


def is_foreign(op):
    """Whether `op` is a protocol call for a principal that is not its role's."""
    return op.role is not None and op.kind in PROTOCOL and op.principal is not None and op.principal != op.role


def refusal_is_right(op, sqlstate):
    """Whether SQLSTATE `sqlstate` is a correct refusal of `op`: any call for
    another role's principal, or any call on a tampering path (a session whose
    binding could not be verified refuses every call of the extension,
    cleanup included)."""
    if op.role is None or sqlstate not in REFUSALS:
        return False
    if any(step in TAMPERING for step in (op.path or "").split("+")):
        return True
    return op.kind in PROTOCOL and is_foreign(op)


def count(stats, what):
    """Counts one event of the role dimension for the summary."""
    with stats["lock"]:
        found = stats.setdefault("roles", {})
        found[what] = found.get(what, 0) + 1


def count_refusal(stats, op):
    """Counts a correct refusal (foreign, or honest on a tampering path)."""
    count(stats, "%s refused" % ("foreign calls" if is_foreign(op) else "honest calls on tampering paths"))


def foreign_answered(model, op):
    """BIND: a call for another role's principal got an answer."""
    model.violation("BIND", op.key_id(), "%s: %s by role %s (path %s) for principal %s got an answer: a role acted "
                    "for a principal it is not bound to" % (op.id, op.kind, op.role, op.path, op.principal), [op],
                    "call for another role's principal answered (%s)" % op.path)


def steal(client):
    """A call for another role's key with the latest fence handed out for it."""
    others = [p for p in client.settings.principals if p != client.role]
    if not others:
        return
    principal, key = client.rng.choice(others), client.rng.choice(client.settings.keys)
    kind = client.pick({"renew": 1, "complete": 1, "release": 1, "lookup": 1})
    with client.model.lock:
        fences = [o.fence for o in client.model.by_key.get((principal, key), []) if o.fence is not None]
    fence = max(fences) if fences else client.rng.randint(1, 50)
    op = client.new_op(kind, principal, key, "steal")
    op.fence, op.note = fence, "fence of another role's key"
    iso = client.draw_isolation()
    if kind == "renew":
        op.params = {"lease_s": 0.3}
        row = client.send(op, "renew", principal, key, fence, 0.3, iso)
    elif kind == "complete":
        status, headers, body = client.response(op, [200])
        op.response = (status, headers, body)
        row = client.send(op, "complete_fenced", principal, key, fence, status, headers, body, False, iso)
    elif kind == "release":
        row = client.send(op, "release", principal, key, fence, iso)
    else:
        row = client.send(op, "lookup", principal, key, iso)
    if row is not None:
        op.outcome = row[1] if kind == "renew" else row[0]
        client.settle(op)
