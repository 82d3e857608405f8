"""Summary of bench/growth/run.sh: summary.py RESULTS CLK_TCK (reads raw.tsv and sizes.tsv)."""
import csv
import os
import statistics
import sys

res, hz = sys.argv[1], int(sys.argv[2])
rows = [r for r in csv.DictReader(open(os.path.join(res, "raw.tsv")), delimiter="\t")]
sizes = list(csv.DictReader(open(os.path.join(res, "sizes.tsv")), delimiter="\t"))
print(open(os.path.join(res, "setup.txt")).read())


def statio(text):
    f = text.strip(":").split(":")
    return {f[i]: (int(f[i + 1]), int(f[i + 2])) for i in range(0, len(f) - 2, 3)}


def per_round(r):
    tx = int(r["tx"]) or 1
    s0, s1 = statio(r["statio_before"]), statio(r["statio_after"])
    io = {k: ((s1[k][0] - s0[k][0]) / tx, (s1[k][1] - s0[k][1]) / tx) for k in s1 if k in s0}
    f = (r.get("wal_by_rmgr") or "").split(":")
    rm = {f[i]: (int(f[i + 1]) / tx, int(f[i + 2]) / tx, int(f[i + 3]) / tx)
          for i in range(0, len(f) - 3, 4)}
    return dict(rm=rm, tps=float(r["tps"]), cpu=int(r["cpu_ticks"]) * 1e6 / hz / tx,
                wal=int(r["wal_bytes"]) / tx, fpi=int(r["wal_fpi"]) / tx,
                load=float(r["load1"]), io=io)


runs = {}
for r in rows:
    runs.setdefault((int(r["size"]), r["variant"]), []).append((int(r["round"]), per_round(r)))


def med(size, v, f):
    xs = [f(x) for _, x in runs.get((size, v), [])]
    return statistics.median(xs) if xs else None


def paired(size):
    """Median over rounds of keyed TPS / unkeyed TPS in the same round."""
    k = dict(runs.get((size, "extension"), []))
    b = dict(runs.get((size, "base"), []))
    return statistics.median(k[i]["tps"] / b[i]["tps"] for i in k if i in b)


order = sorted({s for s, _ in runs})
if order:
    k0 = med(order[0], "extension", lambda x: x["tps"])
    r0 = paired(order[0])
fmt = lambda x, f="{:.0f}": "-" if x is None else f.format(x)
print("Medians of the rounds (keyed = bench/protocol/extension.sql, unkeyed = base.sql, "
      "lookup = begin of a stored key, a replay):\n")
print("| live keys | keyed TPS | unkeyed TPS | keyed/unkeyed | keyed vs 0 keys (TPS) |"
      " keyed/unkeyed vs 0 keys | server CPU us/keyed req | us/unkeyed | WAL B/keyed req |"
      " WAL B/unkeyed | FPI/keyed req | lookup TPS | lookup CPU us | load 1 min |")
print("|---:|" + "---:|" * 13)
for s in order:
    kt, bt = med(s, "extension", lambda x: x["tps"]), med(s, "base", lambda x: x["tps"])
    loads = [x["load"] for v in ("extension", "base", "lookup") for _, x in runs.get((s, v), [])]
    print(f"| {s:,} | {fmt(kt)} | {fmt(bt)} | {paired(s):.3f} | {kt / k0:.3f} | "
          f"{paired(s) / r0:.3f} | "
          f"{fmt(med(s, 'extension', lambda x: x['cpu']), '{:.1f}')} | "
          f"{fmt(med(s, 'base', lambda x: x['cpu']), '{:.1f}')} | "
          f"{fmt(med(s, 'extension', lambda x: x['wal']))} | "
          f"{fmt(med(s, 'base', lambda x: x['wal']))} | "
          f"{fmt(med(s, 'extension', lambda x: x['fpi']), '{:.2f}')} | "
          f"{fmt(med(s, 'lookup', lambda x: x['tps']))} | "
          f"{fmt(med(s, 'lookup', lambda x: x['cpu']), '{:.1f}')} | "
          f"{min(loads):.1f}-{max(loads):.1f} |")

print("\nKey-table buffers per request (median of the rounds; "
      "hits / reads from outside shared_buffers):\n")
rels = sorted({k for (_, v), xs in runs.items() for _, x in xs for k in x["io"]})
print("| live keys | request | " + " | ".join(rels) + " |")
print("|---:|---|" + "---:|" * len(rels))
for s in order:
    for v in ("extension", "lookup"):
        if (s, v) in runs:
            cells = [f"{med(s, v, lambda x: x['io'].get(k, (0, 0))[0]):.2f} / "
                     f"{med(s, v, lambda x: x['io'].get(k, (0, 0))[1]):.3f}" for k in rels]
            print(f"| {s:,} | {v} | " + " | ".join(cells) + " |")

rms = sorted({k for (_, v), xs in runs.items() if v == "extension" for _, x in xs for k in x["rm"]})
if rms:
    print("\nWAL per keyed request by resource manager (pg_walinspect; median of the rounds): "
          "records / bytes of full-page images / all bytes:\n")
    print("| live keys | " + " | ".join(rms) + " |")
    print("|---:|" + "---:|" * len(rms))
    for s in order:
        cells = [" / ".join(f.format(med(s, "extension", lambda x: x["rm"].get(k, (0, 0, 0))[j]))
                            for j, f in enumerate(("{:.2f}", "{:.0f}", "{:.0f}"))) for k in rms]
        print(f"| {s:,} | " + " | ".join(cells) + " |")

print("\nStored bytes per key (after VACUUM ANALYZE; rows = every key in the table):\n")
names = sorted({kv.split("=")[0] for z in sizes for kv in z["indexes"].split(",")})
print("| live keys | rows | heap | TOAST | " + " | ".join(names) + " | total |")
print("|---:|---:|---:|---:|" + "---:|" * (len(names) + 1))
for z in sizes:
    n = int(z["rows"])
    if n == 0:
        continue
    idx = dict(kv.split("=") for kv in z["indexes"].split(","))
    parts = [int(z["heap"]), int(z["toast"])] + [int(idx.get(k, 0)) for k in names]
    print(f"| {int(z['size']):,} | {n:,} | " + " | ".join(f"{p / n:.0f}" for p in parts)
          + f" | {sum(parts) / n:.0f} |")

cl = os.path.join(res, "cleanup.tsv")
if os.path.exists(cl):
    print("\nCleanup at the last size (expired keys among the live ones; per deleted key):\n")
    print("| step | rows | seconds | rows/s | server CPU us/row | WAL B/row | FPI/row | "
          "load 1 min |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in csv.DictReader(open(cl), delimiter="\t"):
        n, t = int(c["rows"]), float(c["seconds"])
        cpu = int(c["cpu_ticks"]) * 1e6 / hz / n
        print(f"| {c['step']} | {n:,} | {t:.1f} | {n / t:,.0f} | {cpu:.1f} | "
              f"{int(c['wal_bytes']) / n:.0f} | {int(c['wal_fpi']) / n:.3f} | {c['load1']} |")
