#!/usr/bin/env python3
"""Summarizes a `make bench` output folder (bench/run.sh) as Markdown tables.

  python3 bench/summarize.py OUT_DIR

Reads the kvserve_bench JSON files (schema bench/kvserve_bench_schema.json),
generate.txt (stderr of `kvserve generate`) and machine.txt that run.sh
wrote, and prints the side-by-side numbers with their ratios. Standard
library only.
"""
import json
import os
import re
import statistics
import sys


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def run_at(doc, concurrency):
    for r in doc["runs"]:
        if r["load"]["concurrency"] == concurrency:
            return r
    return None


def fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.{digits}f}"
    return f"{int(v):,}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def per_cpu(run):
    """Output tokens per CPU-second of the server (None when unknown)."""
    cpu = run["server"].get("cpu_seconds")
    if not cpu:
        return None
    return run["tokens"]["output"] / cpu


def main():
    out = sys.argv[1]
    lines = []
    machine = os.path.join(out, "machine.txt")
    if os.path.exists(machine):
        lines.append("```")
        lines.extend(open(machine).read().rstrip().splitlines())
        lines.append("```")
        lines.append("")

    probe = load(out, "probe.json")
    if probe and probe["connection_probe"]:
        n = probe["connection_probe"]["requests_each"]
        lines.append(f"**Kept-alive vs fresh connection**, 1-token completion, p50 over {n} "
                     "requests each (interleaved); goal: kept-alive p50 at most 1.5x fresh")
        lines.append("")
        lines.append("| case | fresh p50 ms | kept-alive p50 ms | kept / fresh | fresh p90 ms | "
                     "kept-alive p90 ms | kept <= 1.5x fresh |")
        lines.append("|---|---:|---:|---:|---:|---:|---|")
        for c in probe["connection_probe"]["cases"]:
            f, k = c["fresh_ms"], c["kept_alive_ms"]
            ok = c["failed"] == 0 and c["ratio_p50"] <= 1.5
            lines.append(f"| {c['name']} | {fmt(f['p50'], 3)} | {fmt(k['p50'], 3)} | "
                         f"{c['ratio_p50']:.2f}x | {fmt(f['p90'], 3)} | {fmt(k['p90'], 3)} | "
                         f"{'yes' if ok else 'NO'} |")
        lines.append("")

    single = load(out, "single_client.json")
    gen_path = os.path.join(out, "generate.txt")
    if single and os.path.exists(gen_path):
        rates, decode = [], []
        for line in open(gen_path):
            m = re.search(r"(\d+) tokens in [\d.]+ ms, (\d+) tokens/s .*decode: (\d+) tokens/s",
                          line)
            if m:
                rates.append(float(m.group(2)))
                decode.append(float(m.group(3)))
        r = single["runs"][0]
        daemon = r["throughput"]["output_tokens_per_s"]
        tpot = r["latency_ms"]["tpot"]["p50"]
        in_daemon = 1000.0 / tpot if tpot else None
        gen_decode = statistics.median(decode) if decode else None
        gen_all = statistics.median(rates) if rates else None
        lines.append("**One client, back-to-back 128-token requests** (prompt: BOS + 4 tokens, "
                     f"greedy) against `kvserve generate` (median of {len(decode)} runs); goal: within 1.5x of "
                     "generate's decode rate")
        lines.append("")
        lines.append("| | tokens/s | generate decode / this |")
        lines.append("|---|---:|---:|")
        lines.append(f"| `kvserve generate`, decode only | {fmt(gen_decode, 0)} | 1.00x |")
        lines.append(f"| `kvserve generate`, prefill + decode | {fmt(gen_all, 0)} | "
                     f"{ratio(gen_decode, gen_all)} |")
        per_request = r["tokens"]["output"] / r["requests"]["completed"]
        e2e_p50 = r["latency_ms"]["e2e"]["p50"]
        median_rate = per_request / (e2e_p50 / 1000.0) if e2e_p50 else None
        lines.append(f"| daemon over HTTP/SSE, median request: {per_request:.0f} tokens / E2E p50 "
                     f"({fmt(e2e_p50, 2)} ms, TTFT p50 {fmt(r['latency_ms']['ttft']['p50'], 2)} ms) | "
                     f"{fmt(median_rate, 0)} | {ratio(gen_decode, median_rate)} |")
        lines.append(f"| daemon over HTTP/SSE, whole run: output tokens / duration "
                     f"({r['requests']['completed']} requests, E2E mean "
                     f"{fmt(r['latency_ms']['e2e']['mean'], 2)} ms) | "
                     f"{fmt(daemon, 0)} | {ratio(gen_decode, daemon)} |")
        lines.append(f"| daemon decode, 1 / TPOT p50 | {fmt(in_daemon, 0)} | "
                     f"{ratio(gen_decode, in_daemon)} |")
        lines.append("")

    on, off = load(out, "prefix_on.json"), load(out, "prefix_off.json")
    if on and off:
        w = on["workload"]
        lines.append(f"**Shared prefix** ({w['groups']} groups, {w['prefix_len']}-token prefix + "
                     f"{w['suffix_len']}-token suffix, {w['output_len']} output tokens), prefix "
                     "caching on vs off")
        lines.append("")
        lines.append("| clients | TTFT p50 on / off ms | on / off | output tok/s on / off | "
                     "on / off | tok per daemon CPU-s on / off | on / off | prefix hit rate on |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r_on in on["runs"]:
            c = r_on["load"]["concurrency"]
            r_off = run_at(off, c)
            if r_off is None:
                continue
            t_on, t_off = r_on["latency_ms"]["ttft"]["p50"], r_off["latency_ms"]["ttft"]["p50"]
            x_on = r_on["throughput"]["output_tokens_per_s"]
            x_off = r_off["throughput"]["output_tokens_per_s"]
            hit = r_on["server"]["prefix_hit_rate"]
            c_on, c_off = per_cpu(r_on), per_cpu(r_off)
            lines.append(f"| {c} | {fmt(t_on)} / {fmt(t_off)} | {ratio(t_on, t_off)} | "
                         f"{fmt(x_on, 0)} / {fmt(x_off, 0)} | {ratio(x_on, x_off)} | "
                         f"{fmt(c_on, 0)} / {fmt(c_off, 0)} | {ratio(c_on, c_off)} | "
                         f"{'-' if hit is None else f'{hit:.0%}'} |")
        lines.append("")

    kv = []
    for name, label in [("kv-fp32-b16.json", "fp32"), ("kv-int8-b16.json", "int8"),
                        ("kv-k8v4-b16.json", "k8v4"), ("kv-int4-b16.json", "int4"),
                        ("kv-fp32-b32.json", "fp32, block 32")]:
        doc = load(out, name)
        if doc:
            kv.append((label, doc))
    if kv:
        top = max(r["load"]["concurrency"] for r in kv[0][1]["runs"])
        w = kv[0][1]["workload"]
        lines.append(f"**KV formats with the same pool bytes** ({w['input_len']} + "
                     f"{w['output_len']} tokens per request, {top} clients, prefix caching off)")
        lines.append("")
        lines.append("| KV | blocks | running at once (peak) | running vs fp32 | preemptions | "
                     "output tok/s | vs fp32 | tok per daemon CPU-s | vs fp32 | TPOT p99 ms |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        base = run_at(kv[0][1], top)
        for label, doc in kv:
            r = run_at(doc, top)
            s = r["server"]
            x = r["throughput"]["output_tokens_per_s"]
            lines.append(f"| {label} | {fmt(s['kv_blocks'])} | {fmt(s['running_peak'])} | "
                         f"{ratio(s['running_peak'], base['server']['running_peak'])} | "
                         f"{fmt(s['preemptions'])} | {fmt(x, 0)} | "
                         f"{ratio(x, base['throughput']['output_tokens_per_s'])} | "
                         f"{fmt(per_cpu(r), 0)} | {ratio(per_cpu(r), per_cpu(base))} | "
                         f"{fmt(r['latency_ms']['tpot']['p99'])} |")
        lines.append("")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
