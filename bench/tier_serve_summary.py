#!/usr/bin/python3
"""The table and the goals of bench/tier_serve_bench.sh, from its output folder.

  tier_serve_summary.py OUT_DIR

Reads, per configuration and workload, kvserve_bench's --json and
--requests-json files and the replicas' /metrics before and after
(CONFIG.WORKLOAD.{before,after}.REPLICA.prom), prints the table and the goals,
and writes OUT_DIR/summary.json ("schema": "kvserve-tier-serve-bench/1").

Per configuration and workload:
  ttft_p50/p99   of the returning requests (turn >= 1: a document asked again,
                 a conversation's later turn), milliseconds
  vs_recompute   ttft_p50 over the device-only run's of the same KV format
                 (there the returning prompts are recomputed)
  out_tok_s      output tokens per second of the whole workload
  served         the share of the prompt tokens looked up in the prefix cache
                 that each tier served (kvserve_prefix_cache_queries_tokens_total
                 against kvserve_kv_tier_hit_blocks_total{tier} x block size;
                 device-only: kvserve_prefix_cache_hits_tokens_total), summed
                 over the replicas
  timeouts       disk and remote loads abandoned past cache.tier_load_timeout_ms
                 (kvserve_kv_tier_load_timeouts_total; those prompts are recomputed)
  same_text      every request's greedy output equals the device-only run's of
                 the same format, request by request
Tier capacity: the host tier's bytes per stored token
(kvserve_kv_tier_stored_bytes_total / stored_tokens_total, values as stored:
header, token ids and the page) per format; tokens in the same bytes against
fp16's is the inverse ratio.
"""
import json
import os
import re
import sys

TIERS = ["device", "host", "disk", "remote"]
WORKLOADS = ["long_document", "multi_turn"]
CONFIGS = [  # name, KV format, label
    ("fp16-device", "fp16", "device-only"),
    ("fp16-host", "fp16", "+host"),
    ("fp16-disk", "fp16", "+disk"),
    ("fp16-remote", "fp16", "+remote"),
    ("fp16-2rep-remote", "fp16", "2 replicas +remote (nginx round-robin)"),
    ("int8-device", "int8", "device-only"),
    ("int8-host", "int8", "+host"),
    ("int4_kc-device", "int4_kc", "device-only"),
    ("int4_kc-host", "int4_kc", "+host"),
]
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def read_prom(path):
    values = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                values[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return values


def metric(values, name, tier=None):
    labels = '{tier="%s"}' % tier if tier else ""
    return values.get((name, labels), 0.0)


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def served(out, config, workload, block_size):
    """Per tier, the share of looked-up prompt tokens it served; and the
    host tier's stored bytes and tokens (summed over replicas)."""
    names = sorted(p for p in os.listdir(out) if p.startswith(f"{config}.{workload}.before."))
    replicas = [p[len(f"{config}.{workload}.before."):-len(".prom")] for p in names]
    queried = 0.0
    hits = dict.fromkeys(TIERS, 0.0)
    stored = {"bytes": 0.0, "tokens": 0.0}
    timeouts = 0.0
    for r in replicas:
        before = read_prom(os.path.join(out, f"{config}.{workload}.before.{r}.prom"))
        after = read_prom(os.path.join(out, f"{config}.{workload}.after.{r}.prom"))

        def delta(name, tier=None):
            return metric(after, name, tier) - metric(before, name, tier)

        queried += delta("kvserve_prefix_cache_queries_tokens_total")
        tiered = any(k[0] == "kvserve_kv_tier_hit_blocks_total" for k in after)
        for t in TIERS:
            if t == "device" and not tiered:
                hits[t] += delta("kvserve_prefix_cache_hits_tokens_total")
            else:
                hits[t] += delta("kvserve_kv_tier_hit_blocks_total", t) * block_size
        timeouts += sum(delta("kvserve_kv_tier_load_timeouts_total", t) for t in ("disk", "remote"))
        stored["bytes"] += delta("kvserve_kv_tier_stored_bytes_total", "host")
        stored["tokens"] += delta("kvserve_kv_tier_stored_tokens_total", "host")
    shares = {t: (hits[t] / queried if queried > 0 else 0.0) for t in TIERS}
    return shares, stored, timeouts, len(replicas)


def main():
    out = sys.argv[1]
    block_size = 16
    rows = []
    outputs = {}
    for config, fmt, label in CONFIGS:
        for w in WORKLOADS:
            bench_path = os.path.join(out, f"{config}.{w}.json")
            done = any(p.startswith(f"{config}.{w}.after.") for p in os.listdir(out))
            if not os.path.exists(bench_path) or not done:
                continue  # not run (or cut short)
            run = json.load(open(bench_path))["runs"][0]
            reqs = json.load(open(os.path.join(out, f"{config}.{w}.requests.json")))
            outputs[(config, w)] = [r["text"] for r in reqs]
            returning = [r["ttft_ms"] for r in reqs if r["ok"] and (r["turn"] or 0) >= 1]
            first = [r["ttft_ms"] for r in reqs if r["ok"] and (r["turn"] or 0) == 0]
            shares, stored, timeouts, replicas = served(out, config, w, block_size)
            rows.append({
                "config": config, "kv_dtype": fmt, "label": label, "workload": w,
                "replicas": replicas, "requests": len(reqs),
                "failed": sum(1 for r in reqs if not r["ok"]),
                "returning_requests": len(returning),
                "ttft_ms_returning": {"p50": percentile(returning, 0.5),
                                      "p99": percentile(returning, 0.99)},
                "ttft_ms_first": {"p50": percentile(first, 0.5)},
                "output_tokens_per_s": run["throughput"]["output_tokens_per_s"],
                "served": shares, "served_any_tier": sum(shares.values()),
                "load_timeouts": timeouts,
                "host_stored_bytes": stored["bytes"], "host_stored_tokens": stored["tokens"],
            })
    by = {(r["config"], r["workload"]): r for r in rows}
    for r in rows:
        base = by.get((f"{r['kv_dtype']}-device", r["workload"]))
        p50 = r["ttft_ms_returning"]["p50"]
        base_p50 = base["ttft_ms_returning"]["p50"] if base else None
        r["vs_recompute"] = p50 / base_p50 if p50 is not None and base_p50 else None
        ref = outputs.get((f"{r['kv_dtype']}-device", r["workload"]))
        r["same_text"] = ref is not None and outputs[(r["config"], r["workload"])] == ref

    lines = []
    head = "%-17s %-13s %9s %9s %7s %9s %7s %7s %7s %7s %8s %5s" % (
        "config", "workload", "ttft_p50", "ttft_p99", "vs_rec", "out_tok/s", "device", "host",
        "disk", "remote", "timeouts", "same")
    lines.append("TTFT of the returning requests (ms); served: share of looked-up prompt tokens")
    lines.append(head)
    for r in rows:
        t = r["ttft_ms_returning"]
        lines.append("%-17s %-13s %9.1f %9.1f %7s %9.1f %6.1f%% %6.1f%% %6.1f%% %6.1f%% %8d %5s" % (
            r["config"], r["workload"], t["p50"] or 0, t["p99"] or 0,
            "%.3fx" % r["vs_recompute"] if r["vs_recompute"] is not None else "-",
            r["output_tokens_per_s"], *(100 * r["served"][k] for k in TIERS),
            r["load_timeouts"], "yes" if r["same_text"] else "NO"))

    # Tier capacity per format: host bytes per stored token (over both workloads).
    capacity = {}
    for fmt in ["fp16", "int8", "int4_kc"]:
        b = sum(r["host_stored_bytes"] for r in rows if r["config"] == f"{fmt}-host")
        n = sum(r["host_stored_tokens"] for r in rows if r["config"] == f"{fmt}-host")
        capacity[fmt] = {"bytes_per_token": b / n if n > 0 else None}
    fp16_bpt = capacity["fp16"]["bytes_per_token"]
    for fmt, c in capacity.items():
        c["tokens_vs_fp16"] = fp16_bpt / c["bytes_per_token"] if fp16_bpt and c["bytes_per_token"] else None
    lines.append("")
    lines.append("host tier, bytes per stored token (value as stored) and tokens in the same bytes:")
    for fmt, c in capacity.items():
        lines.append("  %-8s %9.1f B/token  %5.3fx fp16" % (
            fmt, c["bytes_per_token"] or 0, c["tokens_vs_fp16"] or 0))

    def ld(config, key="vs_recompute"):
        r = by.get((config, "long_document"))
        return r[key] if r else None

    goals = []

    def goal(name, value, op, target):
        met = value is not None and (value <= target if op == "<=" else value >= target)
        goals.append({"goal": name, "value": value, "op": op, "target": target, "met": met})

    goal("TTFT of a 3,000-token prompt found in the host tier / recomputing it",
         ld("fp16-host"), "<=", 0.1)
    goal("TTFT of a 3,000-token prompt found in the remote tier / recomputing it",
         ld("fp16-remote"), "<=", 0.25)
    for w in WORKLOADS:
        one, two = by.get(("fp16-remote", w)), by.get(("fp16-2rep-remote", w))
        ratio = (two["served_any_tier"] / one["served_any_tier"]
                 if one and two and one["served_any_tier"] > 0 else None)
        goal(f"{w}: hit rate of 2 replicas round-robin +remote / one replica +remote",
             ratio, ">=", 0.9)
    goal("int8 tier tokens in the same bytes / fp16", capacity["int8"]["tokens_vs_fp16"], ">=", 1.9)
    goal("int4_kc tier tokens in the same bytes / fp16", capacity["int4_kc"]["tokens_vs_fp16"],
         ">=", 3.3)
    lines.append("")
    lines.append("goals:")
    for g in goals:
        lines.append("  %-4s %-72s %s %s %s" % (
            "met" if g["met"] else "MISS", g["goal"],
            "%.3f" % g["value"] if g["value"] is not None else "-", g["op"], g["target"]))
    all_same = all(r["same_text"] for r in rows)
    lines.append("")
    lines.append("greedy outputs equal the device-only run's of the same format in every "
                 "configuration: " + ("yes" if all_same else "NO"))
    print("\n".join(lines))

    machine = {}
    if os.path.exists(os.path.join(out, "machine.txt")):
        for line in open(os.path.join(out, "machine.txt")):
            k, _, v = line.partition(":")
            machine[k.strip()] = v.strip()
    json.dump({"schema": "kvserve-tier-serve-bench/1", "machine": machine, "rows": rows,
               "tier_capacity": capacity, "goals": goals, "same_text_everywhere": all_same},
              open(os.path.join(out, "summary.json"), "w"), indent=2)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
