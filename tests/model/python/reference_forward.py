#!/usr/bin/env python3
"""An independent reference forward pass for the model-variant tests.

Reads an HF directory (config.json + one F32 model.safetensors) and token
ids, and prints the logits of every position as JSON ([T][vocab]). Written
from the published transformers modeling code (LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) with numpy in
float64, sharing nothing with kvserve but the file formats:

  x = embed[ids]
  per layer:
    h = rmsnorm(x) * input_layernorm
    q, k, v = h @ Wq.T (+ bq), h @ Wk.T (+ bk), h @ Wv.T (+ bv)
    Qwen3: q, k = rmsnorm per head * q_norm / k_norm
    q, k = rotate-half RoPE with inv_freq from rope_theta and rope_scaling
    causal softmax(q k^T / sqrt(head_dim)) v, kv heads repeated for GQA
    x += attn @ Wo.T (+ bo)
    h = rmsnorm(x) * post_attention_layernorm
    x += (silu(h @ Wg.T) * (h @ Wu.T)) @ Wd.T
  logits = (rmsnorm(x) * norm) @ lm_head.T (embed when tied)

Usage: reference_forward.py MODEL_DIR IDS_JSON   (IDS_JSON: [1, 2, 3])
"""
import json
import math
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            raise SystemExit(f"{name}: only F32 is read here, got {meta['dtype']}")
        begin, end = meta["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype="<f4").astype(np.float64)
        tensors[name] = arr.reshape(meta["shape"])
    return tensors


def inv_freq(cfg, head_dim):
    """transformers' modeling_rope_utils: default, linear, dynamic, llama3."""
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        factor = rs["factor"]
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        old_len = rs["original_max_position_embeddings"]
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    elif kind == "dynamic":
        # Within max_position_embeddings transformers' dynamic NTK is plain RoPE.
        pass
    elif kind != "default":
        raise SystemExit(f"rope_scaling type {kind} not modelled")
    return inv


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(model_dir, ids):
    cfg = json.load(open(f"{model_dir}/config.json"))
    t = load_safetensors(f"{model_dir}/model.safetensors")
    arch = cfg["architectures"][0]
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or dim // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    qkv_bias = arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
    o_bias = arch != "Qwen2ForCausalLM" and cfg.get("attention_bias", False)
    qk_norm = arch == "Qwen3ForCausalLM"

    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    freqs = np.outer(pos, inv_freq(cfg, hd))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), k=1)

    x = t["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        q = h @ t[p + "self_attn.q_proj.weight"].T
        k = h @ t[p + "self_attn.k_proj.weight"].T
        v = h @ t[p + "self_attn.v_proj.weight"].T
        if qkv_bias:
            q = q + t[p + "self_attn.q_proj.bias"]
            k = k + t[p + "self_attn.k_proj.bias"]
            v = v + t[p + "self_attn.v_proj.bias"]
        q = q.reshape(T, heads, hd)
        k = k.reshape(T, kv_heads, hd)
        v = v.reshape(T, kv_heads, hd)
        if qk_norm:
            q = rmsnorm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, t[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(T, heads * hd)
        o = attn @ t[p + "self_attn.o_proj.weight"].T
        if o_bias:
            o = o + t[p + "self_attn.o_proj.bias"]
        x = x + o
        h = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        up = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else t["lm_head.weight"]
    return x @ head.T


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    ids = json.loads(open(sys.argv[2]).read())
    logits = forward(sys.argv[1], ids)
    json.dump(logits.tolist(), sys.stdout)


if __name__ == "__main__":
    main()
