#!/usr/bin/env python3
"""Peer for attention_bench: torch.nn.functional.scaled_dot_product_attention
on contiguous bf16 K/V at the same decode shape (batch 64, one query row per
sequence, 32 query heads over 8 kv heads, head_dim 128, context 4096).

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

    mode = ""
    for i in range(3):
        _, mode = run(i)
    torch.cuda.synchronize()
    times = []
    for i in range(args.iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        run(i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    n = len(times)
    ms = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
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
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
