"""The model checker's command line: its options, their defaults and the
combinations it refuses."""

import argparse
import random

DEFAULT_OPS = "txn=30,lease=18,save_final=10,claim=4,forget=3,cleanup=6,inspect=8,wait=4"
ALL_FAULTS = "kill,restart,timeout,disconnect"


def parse_weights(text):
    """'txn=30,lease=18' -> [('txn', 30.0), ('lease', 18.0)]."""
    weights = []
    for part in text.split(","):
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in ("txn", "lease", "save_final", "claim", "forget", "cleanup", "inspect", "wait"):
            raise argparse.ArgumentTypeError("unknown operation %r" % name)
        weights.append((name, float(weight or 1)))
    return weights


def parse_args(argv, doc):
    """The command line, checked (doc: the checker's docstring, for --help); draws
    the seed when none is given."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, help="random seed (default: drawn and printed)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--seconds", type=float, help="run this long (default 30 unless --steps)")
    p.add_argument("--steps", type=int, help="run this many operations in all (split among clients)")
    p.add_argument("--dsn", help="use this server (a superuser DSN); no restarts")
    p.add_argument("--cluster-dir", help="use this scripts/pgcluster.sh cluster folder")
    p.add_argument("--port", type=int, help="port of the cluster the checker starts (default random)")
    p.add_argument("--proxy-shards", type=int, default=0,
                   help="the function-call form: start this many shard clusters and a PL/Proxy cluster; every "
                        "operation is one proxy function call routed by hashtext(principal) (a power of two; "
                        "default 0: off)")
    p.add_argument("--proxy-port", type=int, default=26600,
                   help="first port of the proxy form (shards on it and up, the proxy after them; default 26600)")
    p.add_argument("--principals", type=int,
                   help="principals in the key space (default 2; with --proxy-shards, one per shard)")
    p.add_argument("--keys", type=int, default=3, help="keys per principal (default 3)")
    p.add_argument("--fingerprints", type=int, default=3, help="request variants per key (default 3)")
    p.add_argument("--ttl-min", type=int, default=60, help="shortest ttl, ms (default 60)")
    p.add_argument("--ttl-max", type=int, default=700, help="longest ttl, ms (default 700)")
    p.add_argument("--lease-min", type=int, default=100, help="shortest lease, ms (default 100, the 0.6.0 floor)")
    p.add_argument("--lease-max", type=int, default=400, help="longest lease, ms (default 400)")
    p.add_argument("--lease-within-ttl", action="store_true",
                   help="draw every ttl above 6 leases + 100 ms, so that no renewed lease outlives its key (what 0.5.0 needs)")
    p.add_argument("--ops", type=parse_weights, default=parse_weights(DEFAULT_OPS),
                   help="operation weights (default %s)" % DEFAULT_OPS)
    p.add_argument("--faults", default=ALL_FAULTS,
                   help="faults to inject, comma-separated from %s, or 'none' (default all)" % ALL_FAULTS)
    p.add_argument("--no-kill", action="store_true", help="no SIGKILL of backends")
    p.add_argument("--no-restart", action="store_true", help="no immediate restarts")
    p.add_argument("--no-timeout", action="store_true", help="no statement_timeout cancels")
    p.add_argument("--no-disconnect", action="store_true", help="no client disconnects mid-transaction")
    p.add_argument("--fault-interval", type=float, default=6.0,
                   help="mean seconds between server faults (default 6)")
    p.add_argument("--fault-rate", type=float, default=0.05,
                   help="chance of a client fault where one can happen (default 0.05)")
    p.add_argument("--roles", action="store_true",
                   help="the role dimension: clients connect as principal roles bound by "
                        "idempotency.principal_binding = current_user, by random paths; invariant BIND (roles.py)")
    p.add_argument("--hostile", type=float, default=0.25,
                   help="with --roles: share of calls naming another role's principal (default 0.25)")
    p.add_argument("--no-preload", action="store_true",
                   help="start the checker's own cluster without idempotency in shared_preload_libraries")
    p.add_argument("--refuse", type=float, default=0.0,
                   help="share of requests whose action refuses its expired key (set_expiry_policy 'refuse', "
                        "0.8.0; invariant EXP; claims refuse too); default 0: no policy")
    p.add_argument("--grace-min", type=int, default=300, help="shortest grace of a refusing action, ms (default 300)")
    p.add_argument("--grace-max", type=int, default=1500, help="longest grace, ms (default 1500)")
    p.add_argument("--install-script",
                   help="install the extension with this psql script instead of CREATE EXTENSION "
                        "(the trusted edition: build/trusted/idempotency--<version>.sql)")
    p.add_argument("--keep-going", action="store_true", help="do not stop the run at the first violation")
    p.add_argument("--reduce-seconds", type=float, default=150,
                   help="time budget for reducing a failure (default 150; 0: no reduction)")
    p.add_argument("--quiet", action="store_true", help="print less while running")
    p.add_argument("--show", type=int, default=3, help="violations printed with their history (default 3)")
    p.add_argument("--show-only", default="", help="print only violations whose invariant or kind contains this")
    args = p.parse_args(argv)
    faults = set() if args.faults == "none" else {f.strip() for f in args.faults.split(",") if f.strip()}
    for name in ("kill", "restart", "timeout", "disconnect"):
        if getattr(args, "no_" + name):
            faults.discard(name)
    unknown = faults - set(ALL_FAULTS.split(","))
    if unknown:
        p.error("unknown faults: %s" % ", ".join(sorted(unknown)))
    args.faults = sorted(faults)
    if args.proxy_shards and (args.dsn or args.cluster_dir):
        p.error("--proxy-shards starts its own clusters: no --dsn or --cluster-dir")
    if args.roles and args.proxy_shards:
        p.error("--roles runs in the direct form only (the proxy connects to the shards as one role)")
    if args.no_preload and (args.dsn or args.cluster_dir or args.proxy_shards):
        p.error("--no-preload is for the cluster the checker starts itself")
    if args.refuse and (args.proxy_shards or args.roles):
        p.error("--refuse runs in the direct form as the superuser only (set_expiry_policy is the owner's)")
    if not 0 <= args.refuse <= 1 or args.grace_min < 1 or args.grace_max < args.grace_min:
        p.error("bad --refuse share or grace range")
    if args.principals is None:
        args.principals = args.proxy_shards or 2
    if args.seconds is None and args.steps is None:
        args.seconds = 30.0
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10 ** 6)
    if args.lease_min < 1 or args.lease_max < args.lease_min or args.ttl_min < 1 or args.ttl_max < args.ttl_min:
        p.error("bad ttl or lease range")
    return args
