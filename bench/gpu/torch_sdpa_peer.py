#!/usr/bin/env python3
"""Peer for attention_bench: torch.nn.functional.scaled_dot_product_attention
on contiguous bf16 K/V at the same decode shape (batch 64, one query row per
sequence, 32 query heads over 8 kv heads, head_dim 128, context 4096).

Then prefill: one sequence of --prefill tokens (default 8192; 0 skips),
causal (is_causal, flash SDPA where torch picks it), for attention_bench's
prefill rows: ms and TFLOP/s counted as attention_bench counts them.

Prints one JSON object (also written to --json PATH): the median time over
--iters runs timed with CUDA events, the K/V bytes read and the achieved
GB/s. Distinct K/V copies are rotated so that no run finds its K/V in L2.
Exits 77 with a message when torch or a CUDA device is missing.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--prefill", type=int, default=8192)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_sdpa_peer: skipped, no torch")
        return 77
    if not torch.cuda.is_available():
        print("torch_sdpa_peer: skipped, no CUDA device")
        return 77

    heads, kv_heads, head_dim = 32, 8, 128
    b, ctx = args.batch, args.context
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    kv_bytes = 2 * b * kv_heads * ctx * head_dim * 2  # K and V, bf16
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    copies = max(1, -(-4 * l2 // kv_bytes))
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(b, heads, 1, head_dim, device=dev, dtype=torch.bfloat16, generator=g)
    kvs = [(torch.randn(b, kv_heads, ctx, head_dim, device=dev, dtype=torch.bfloat16, generator=g),
            torch.randn(b, kv_heads, ctx, head_dim, device=dev, dtype=torch.bfloat16, generator=g))
           for _ in range(copies)]

    # enable_gqa (torch >= 2.5) reads each kv head once per group; older
    # versions get K/V expanded to every query head (a view, not a copy).
    def run(i):
        k, v = kvs[i % copies]
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True), "enable_gqa"
        except TypeError:
            rep = heads // kv_heads
            k = k[:, :, None].expand(b, kv_heads, rep, ctx, head_dim).reshape(b, heads, ctx, head_dim)
            v = v[:, :, None].expand(b, kv_heads, rep, ctx, head_dim).reshape(b, heads, ctx, head_dim)
            return F.scaled_dot_product_attention(q, k, v), "expanded"

    def median_ms(fn, iters):
        for i in range(3):
            fn(i)
        torch.cuda.synchronize()
        times = []
        for i in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        times.sort()
        n = len(times)
        return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])

    mode = run(0)[1]
    ms = median_ms(run, args.iters)
    result = {
        "bench": "torch_sdpa_peer",
        "device": props.name,
        "torch": torch.__version__,
        "mode": mode,
        "shape": {"batch": b, "context": ctx, "num_heads": heads, "num_kv_heads": kv_heads,
                  "head_dim": head_dim, "dtype": "bf16", "layout": "contiguous"},
        "ms": round(ms, 4),
        "kv_bytes": kv_bytes,
        "gbps": round(kv_bytes / ms / 1e6, 1),
        "copies": copies,
    }
    if args.prefill > 0:
        n = args.prefill
        pq = torch.randn(1, heads, n, head_dim, device=dev, dtype=torch.bfloat16, generator=g)
        pk = torch.randn(1, kv_heads, n, head_dim, device=dev, dtype=torch.bfloat16, generator=g)
        pv = torch.randn(1, kv_heads, n, head_dim, device=dev, dtype=torch.bfloat16, generator=g)

        def prefill(_):
            if mode == "enable_gqa":
                return F.scaled_dot_product_attention(pq, pk, pv, is_causal=True, enable_gqa=True)
            rep = heads // kv_heads
            k = pk[:, :, None].expand(1, kv_heads, rep, n, head_dim).reshape(1, heads, n, head_dim)
            v = pv[:, :, None].expand(1, kv_heads, rep, n, head_dim).reshape(1, heads, n, head_dim)
            return F.scaled_dot_product_attention(pq, k, v, is_causal=True)

        pms = median_ms(prefill, min(args.iters, 10))
        flop = 4.0 * head_dim * heads * (n * (n + 1) / 2)
        result["prefill"] = {"tokens": n, "ms": round(pms, 4),
                             "tflops": round(flop / (pms * 1e-3) / 1e12, 1)}
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
