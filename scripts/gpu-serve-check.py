#!/usr/bin/env python3
"""Starts `kvserve serve` with a shipped config on the GPU machine, as is
(only the ports are changed), waits until it is ready, asks for one
completion over HTTP, reads /metrics and stops it with SIGTERM.

Used by gpu-bundle/run.sh for configs/llama3-8b-h200.yaml (dummy:llama-3-8b
unless KVSERVE_MODEL names an HF directory). The binary is $KVSERVE_BIN.

  gpu-serve-check.py --config FILE [--json OUT] [--timeout 180]
Exit 0 when the daemon became ready, answered 200 with tokens and drained.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--json")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    binary = os.environ.get("KVSERVE_BIN", "kvserve")
    http, grpc = free_port(), free_port()
    cmd = [binary, "serve", "--config", args.config,
           "--set", "server.host=127.0.0.1",
           "--set", f"server.http_port={http}", "--set", f"server.grpc_port={grpc}",
           "--set", "logging.format=text"]
    result = {"config": args.config, "ready": False, "completion": None}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    try:
        base = f"http://127.0.0.1:{http}"
        while time.time() - t0 < args.timeout:
            if proc.poll() is not None:
                print(f"serve-check: kvserve exited with {proc.returncode} before it was ready")
                return 1
            try:
                if get(base + "/health", timeout=1)[0] == 200:
                    result["ready"] = True
                    break
            except Exception:
                pass
            time.sleep(0.2)
        result["ready_s"] = round(time.time() - t0, 2)
        if not result["ready"]:
            print("serve-check: not ready in time")
            return 1
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 32,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t1 = time.time()
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read().decode())
        result["completion_s"] = round(time.time() - t1, 3)
        result["completion"] = answer.get("usage")
        _, metrics = get(base + "/metrics")
        for line in metrics.splitlines():
            for name in ("kvserve_kv_pool_tokens", "kvserve_kv_blocks_capacity",
                         "kvserve_kv_block_bytes", "kvserve_model_weight_bytes",
                         "kvserve_activation_bytes"):
                if line.startswith(name + " "):
                    result[name] = float(line.split()[1])
        print("serve-check:", json.dumps(result))
        ok = (answer.get("usage") or {}).get("completion_tokens") == 32
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        result["exit_code"] = proc.returncode
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    return 0 if ok and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
