#!/usr/bin/env python3
"""Soak test: mixed HTTP and gRPC load with faults against one kvserve daemon.

Starts `kvserve serve` on stories260K with a KV pool small enough that the
load preempts sequences (scheduler.preemption_mode recompute or swap), then
for --duration seconds runs --clients threads, each sending one of:

  http_complete   /v1/completions, shared-prefix prompt, n 1..3, read whole
  http_chat_sse   /v1/chat/completions streamed, read to [DONE]
  http_sse_drop   streamed completion, the socket closed after a few events
  http_drop       a request sent, the socket closed before the response
  grpc_stream     Generate, n 1..3, read to the end
  grpc_cancel     Generate cancelled after a few responses
  grpc_deadline   Generate with a deadline of 20..300 ms (DEADLINE_EXCEEDED
                  or done)
  grpc_tokenize   Tokenize

Every --interval seconds it prints throughput (requests and generated tokens
per second, from the client and from /metrics), preemptions, KV blocks and
the daemon's RSS. At the end, once the load has stopped, it checks:
  - no HTTP 5xx and no unexpected gRPC status, no client errors;
  - preemption happened (the pool is small enough);
  - 0 active KV blocks, 0 running and 0 queued sequences (from /metrics);
  - RSS growth from the end of the warm-up (a quarter of the run) to the end
    within --max-rss-growth-mb;
  - the greedy golden request (empty prompt, 256 tokens) gives the reference
    text exactly, over gRPC and over HTTP, and leaves 0 active blocks;
  - the daemon exits 0 on SIGTERM (under ASan that includes no leak report).
A JSON summary goes to --json. Exit status 0 when every check passes.

Needs /usr/bin/python3 with grpcio and protobuf (Debian python3-grpcio,
python3-protobuf) and protoc + grpc_python_plugin for the stubs.
"""

import argparse
import http.client
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def generate_stubs(out_dir):
    proto_dir = os.path.join(ROOT, "proto")
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if plugin is None or protoc is None:
        sys.exit("soak: protoc and grpc_python_plugin are needed (protobuf-compiler-grpc)")
    subprocess.run([protoc, "-I", proto_dir, "--python_out", out_dir, "--grpc_python_out",
                    out_dir, "--plugin=protoc-gen-grpc_python=" + plugin,
                    os.path.join(proto_dir, "kvserve.proto")], check=True)
    sys.path.insert(0, out_dir)
    return importlib.import_module("kvserve_pb2"), importlib.import_module("kvserve_pb2_grpc")


class Daemon:
    """`kvserve serve` on free loopback ports, logging to a file."""

    def __init__(self, binary, shared, workdir, sets):
        model_dir = os.path.join(shared, "models", "stories260k")
        self.config = os.path.join(workdir, "soak.yaml")
        with open(self.config, "w") as f:
            f.write("model:\n  path: %s\n  tokenizer: %s\n  name: stories260k\n"
                    "server:\n  host: 127.0.0.1\n  shutdown_timeout: 60\n"
                    "logging:\n  level: warn\n"
                    % (os.path.join(model_dir, "stories260K.bin"),
                       os.path.join(model_dir, "tok512.model")))
        self.log_path = os.path.join(workdir, "kvserve.log")
        for _ in range(3):
            self.http_port, self.grpc_port = free_port(), free_port()
            args = [binary, "serve", "--config", self.config,
                    "--set", "server.http_port=%d" % self.http_port,
                    "--set", "server.grpc_port=%d" % self.grpc_port]
            for s in sets:
                args += ["--set", s]
            self.log = open(self.log_path, "w")
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
            if self._wait_ready():
                return
            if "cannot listen" not in self.read_log():
                break
        sys.exit("soak: kvserve did not become ready; its log:\n" + self.read_log())

    def _wait_ready(self):
        end = time.time() + 120
        while time.time() < end:
            if self.proc.poll() is not None:
                return False
            try:
                status, _ = http_get(self.http_port, "/health", timeout=2)
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        self.proc.wait()
        return False

    def read_log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def rss_mb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def stop(self, timeout=120):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -1


def http_get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


METRIC_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)')


def scrape(port):
    status, body = http_get(port, "/metrics")
    if status != 200:
        raise RuntimeError("/metrics answered %d" % status)
    out = {}
    for line in body.decode().splitlines():
        m = METRIC_RE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric(m, name, labels=None, default=0.0):
    if labels:
        for k, v in m.items():
            if k.startswith(name + "{") and all('%s="%s"' % kv in k for kv in labels.items()):
                return v
        return default
    return m.get(name, default)


def metric_sum(m, name):
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}       # kind -> outcome -> count
        self.failures = []     # first few unexpected outcomes
        self.requests = 0      # finished (any outcome)
        self.tokens = 0        # completion tokens the clients saw (usage)
        self.http_5xx = 0

    def add(self, kind, outcome, tokens=0, failure=None):
        with self.lock:
            self.counts.setdefault(kind, {}).setdefault(outcome, 0)
            self.counts[kind][outcome] += 1
            self.requests += 1
            self.tokens += tokens
            if failure is not None and len(self.failures) < 20:
                self.failures.append("%s: %s" % (kind, failure))


class Load:
    def __init__(self, args, daemon, pb, pb_grpc, prompts, stats):
        self.args, self.daemon, self.pb, self.pb_grpc = args, daemon, pb, pb_grpc
        self.prompts, self.stats = prompts, stats
        self.stop = threading.Event()
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % daemon.grpc_port)
        self.stub = pb_grpc.GenerationStub(self.channel)
        kinds = {"http_complete": 4, "http_chat_sse": 2, "http_sse_drop": 1, "http_drop": 1,
                 "grpc_stream": 3, "grpc_cancel": 1, "grpc_deadline": 1, "grpc_tokenize": 1}
        self.kinds = [k for k, w in kinds.items() for _ in range(w)]

    # A prompt that shares one of a few long prefixes, and a request size that
    # fits the pool on its own (n x (prompt + max_tokens) <= ~700 tokens).
    def request_shape(self, rng):
        prefix = rng.choice(self.prompts["prefixes"])
        suffix = rng.choice(self.prompts["suffixes"])
        n = rng.choice([1, 1, 1, 2, 3])
        max_tokens = rng.randint(8, 120 if n == 1 else 48)
        return prefix + " " + suffix, n, max_tokens

    def http(self, kind, rng):
        port = self.daemon.http_port
        prompt, n, max_tokens = self.request_shape(rng)
        if kind == "http_chat_sse":
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "n": n, "stream": True, "temperature": 0.9, "seed": rng.randint(0, 1 << 30),
                    "stream_options": {"include_usage": True}}
        else:
            path = "/v1/completions"
            body = {"prompt": prompt, "max_tokens": max_tokens, "n": n, "temperature": 0.9,
                    "seed": rng.randint(0, 1 << 30),
                    "stream": kind in ("http_sse_drop",)}
            if rng.random() < 0.2:
                body["stop"] = ["."]
        data = json.dumps(body).encode()
        if kind == "http_drop":
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
            time.sleep(rng.uniform(0, 0.05))
            s.close()
            self.stats.add(kind, "dropped")
            return
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status >= 500:
                with self.stats.lock:
                    self.stats.http_5xx += 1
                self.stats.add(kind, "http_%d" % r.status, failure="HTTP %d: %s" % (
                    r.status, r.read()[:200]))
                return
            if r.status != 200:
                self.stats.add(kind, "http_%d" % r.status, failure="HTTP %d: %s" % (
                    r.status, r.read()[:200]))
                return
            if kind == "http_sse_drop":
                events = rng.randint(1, 4)
                for _ in range(events):
                    if not r.fp.readline():
                        break
                c.sock.shutdown(socket.SHUT_RDWR)
                self.stats.add(kind, "dropped")
                return
            if body.get("stream"):
                tokens, done = 0, False
                for raw in r:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            tokens = chunk["usage"]["completion_tokens"]
                if not done:
                    self.stats.add(kind, "truncated", failure="stream ended without [DONE]")
                    return
                self.stats.add(kind, "ok", tokens)
            else:
                obj = json.loads(r.read())
                if len(obj["choices"]) != n:
                    self.stats.add(kind, "bad", failure="%d choices for n=%d" % (
                        len(obj["choices"]), n))
                    return
                self.stats.add(kind, "ok", obj["usage"]["completion_tokens"])
        finally:
            c.close()

    def grpc_call(self, kind, rng):
        pb = self.pb
        if kind == "grpc_tokenize":
            prompt, _, _ = self.request_shape(rng)
            r = self.stub.Tokenize(pb.TokenizeRequest(text=prompt), timeout=30)
            self.stats.add(kind, "ok" if len(r.token_ids) > 0 else "bad")
            return
        prompt, n, max_tokens = self.request_shape(rng)
        req = pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, n=n,
                                 sampling=pb.SamplingParams(temperature=0.9,
                                                            seed=rng.randint(0, 1 << 30)))
        timeout = 120
        if kind == "grpc_deadline":
            req.max_tokens = 120 if n == 1 else 48
            timeout = rng.uniform(0.02, 0.3)
        call = self.stub.Generate(req, timeout=timeout)
        tokens = 0
        finished = 0
        try:
            for i, resp in enumerate(call):
                if kind == "grpc_cancel" and i >= rng.randint(0, 6):
                    call.cancel()
                    break
                if resp.request_finished:
                    finished += 1
                    tokens += resp.usage.completion_tokens
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.CANCELLED and kind == "grpc_cancel":
                self.stats.add(kind, "cancelled")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED and kind == "grpc_deadline":
                self.stats.add(kind, "deadline")
            else:
                self.stats.add(kind, str(code), failure="%s: %s" % (code, e.details()))
            return
        if kind == "grpc_cancel" and finished == 0:
            self.stats.add(kind, "cancelled")
            return
        self.stats.add(kind, "ok", tokens)

    def worker(self, seed):
        rng = random.Random(seed)
        while not self.stop.is_set():
            kind = rng.choice(self.kinds)
            try:
                if kind.startswith("http"):
                    self.http(kind, rng)
                else:
                    self.grpc_call(kind, rng)
            except Exception as e:  # noqa: BLE001 - every client error is a finding
                self.stats.add(kind, "client_error", failure=repr(e))


def load_prompts(shared, seed):
    with open(os.path.join(shared, "data", "tinystories_valid_dev.txt"), errors="replace") as f:
        text = f.read(400000)
    stories = [s.strip().replace("\n", " ") for s in text.split("<|endoftext|>") if s.strip()]
    rng = random.Random(seed)
    long_ones = [s for s in stories if len(s) > 700]
    prefixes = [s[:600] for s in rng.sample(long_ones, 4)]
    suffixes = [" ".join(rng.choice(stories).split()[:rng.randint(3, 40)]) for _ in range(200)]
    return {"prefixes": prefixes, "suffixes": suffixes}


def golden_checks(daemon, pb, stub, golden):
    """The greedy reference over gRPC and HTTP; returns a list of failures."""
    failures = []
    responses = list(stub.Generate(pb.GenerateRequest(
        prompt="", max_tokens=256, sampling=pb.SamplingParams(temperature=0.0)), timeout=300))
    text = "".join(r.text for r in responses)
    if text != golden:
        failures.append("gRPC golden text differs: %r" % text[:120])
    c = http.client.HTTPConnection("127.0.0.1", daemon.http_port, timeout=300)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "", "max_tokens": 256, "temperature": 0}),
        headers={"Content-Type": "application/json"})
    r = c.getresponse()
    obj = json.loads(r.read())
    c.close()
    if r.status != 200 or obj["choices"][0]["text"] != golden:
        failures.append("HTTP golden text differs (status %d)" % r.status)
    return failures


def wait_idle(port, timeout):
    """Polls /metrics until nothing runs, waits or holds a block."""
    end = time.time() + timeout
    m = scrape(port)
    while time.time() < end:
        m = scrape(port)
        if (metric(m, "kvserve_kv_blocks", {"state": "active"}) == 0 and
                metric(m, "kvserve_running_sequences") == 0 and
                metric(m, "kvserve_queue_length") == 0):
            return m, True
        time.sleep(0.2)
    return m, False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvserve", required=True, help="the kvserve binary")
    p.add_argument("--shared", default=os.environ.get(
        "KVSERVE_SHARED", os.path.join(ROOT, "..", "shared")))
    p.add_argument("--mode", choices=["recompute", "swap"], default="recompute")
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--num-blocks", type=int, default=64, help="KV blocks of 16 tokens")
    p.add_argument("--interval", type=float, default=10)
    p.add_argument("--max-rss-growth-mb", type=float, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--set", action="append", default=[], help="more kvserve --set overrides")
    args = p.parse_args()

    shared = os.path.abspath(args.shared)
    workdir = tempfile.mkdtemp(prefix="kvserve-soak-")
    pb, pb_grpc = generate_stubs(workdir)
    with open(os.path.join(shared, "models", "stories260k", "golden_greedy_256.txt")) as f:
        golden = f.read().rstrip("\n")
    sets = ["scheduler.preemption_mode=" + args.mode, "cache.num_blocks=%d" % args.num_blocks,
            "cache.block_size=16", "cache.prefix_caching=true"]
    if args.mode == "swap":
        sets.append("cache.num_swap_blocks=%d" % (4 * args.num_blocks))
    sets += args.set
    prompts = load_prompts(shared, args.seed)
    daemon = Daemon(args.kvserve, shared, workdir, sets)
    try:
        return run(args, daemon, pb, pb_grpc, prompts, golden, workdir)
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def run(args, daemon, pb, pb_grpc, prompts, golden, workdir):
    stats = Stats()
    load = Load(args, daemon, pb, pb_grpc, prompts, stats)
    print("soak: %s mode, %d blocks, %d clients, %.0f s, daemon pid %d (http %d, grpc %d)" % (
        args.mode, args.num_blocks, args.clients, args.duration, daemon.proc.pid,
        daemon.http_port, daemon.grpc_port), flush=True)

    threads = [threading.Thread(target=load.worker, args=(args.seed * 1000 + i,), daemon=True)
               for i in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    timeline = []
    base_rss = None
    warmup_end = start + args.duration / 4
    last_t, last_m, last_req, last_tok = start, scrape(daemon.http_port), 0, 0
    start_m = last_m
    while True:
        now = time.time()
        if now - start >= args.duration:
            break
        time.sleep(min(args.interval, args.duration - (now - start)))
        now = time.time()
        m = scrape(daemon.http_port)
        rss = daemon.rss_mb()
        if base_rss is None and now >= warmup_end:
            base_rss = rss
        dt = now - last_t
        with stats.lock:
            req, tok = stats.requests, stats.tokens
        row = {
            "t": round(now - start, 1),
            "client_req_per_s": round((req - last_req) / dt, 2),
            "client_tokens_per_s": round((tok - last_tok) / dt, 1),
            "server_tokens_per_s": round((metric(m, "kvserve_generation_tokens_total") -
                                          metric(last_m, "kvserve_generation_tokens_total")) / dt,
                                         1),
            "preemptions": metric(m, "kvserve_preemptions_total"),
            "swap_out_blocks": metric(m, "kvserve_swap_out_blocks_total"),
            "active_blocks": metric(m, "kvserve_kv_blocks", {"state": "active"}),
            "running": metric(m, "kvserve_running_sequences"),
            "queued": metric(m, "kvserve_queue_length"),
            "rss_mb": round(rss, 1),
        }
        timeline.append(row)
        print("  t=%(t)6.1fs  %(client_req_per_s)6.2f req/s  %(server_tokens_per_s)7.1f tok/s  "
              "preempt %(preemptions)6.0f  swap-out %(swap_out_blocks)6.0f  active %(active_blocks)3.0f"
              "  run %(running)3.0f  queue %(queued)3.0f  rss %(rss_mb)7.1f MB" % row, flush=True)
        last_t, last_m, last_req, last_tok = now, m, req, tok
    load.stop.set()
    for t in threads:
        t.join(timeout=300)
    elapsed = time.time() - start
    end_m, idle = wait_idle(daemon.http_port, 60)
    end_rss = daemon.rss_mb()
    if base_rss is None:
        base_rss = end_rss

    failures = list(stats.failures)
    if any(t.is_alive() for t in threads):
        failures.append("client threads did not finish")
    if not idle:
        failures.append("not idle after the load: active blocks %.0f, running %.0f, queued %.0f"
                        % (metric(end_m, "kvserve_kv_blocks", {"state": "active"}),
                           metric(end_m, "kvserve_running_sequences"),
                           metric(end_m, "kvserve_queue_length")))
    preemptions = metric(end_m, "kvserve_preemptions_total") - metric(
        start_m, "kvserve_preemptions_total")
    if preemptions == 0:
        failures.append("no preemption: the pool is not small enough for the load")
    if args.mode == "swap" and metric(end_m, "kvserve_swap_out_blocks_total") == 0:
        failures.append("swap mode swapped nothing out")
    if stats.http_5xx:
        failures.append("%d HTTP 5xx answers" % stats.http_5xx)
    growth = end_rss - base_rss
    if growth > args.max_rss_growth_mb:
        failures.append("RSS grew %.1f MB after the warm-up (limit %.0f)" % (
            growth, args.max_rss_growth_mb))
    failures += golden_checks(daemon, pb, load.stub, golden)
    after_golden, idle2 = wait_idle(daemon.http_port, 30)
    if not idle2:
        failures.append("active blocks after the golden request")
    load.channel.close()
    exit_code = daemon.stop()
    if exit_code != 0:
        failures.append("kvserve exited %d on SIGTERM; log tail:\n%s" % (
            exit_code, daemon.read_log()[-3000:]))

    ok_total = sum(c.get("ok", 0) for c in stats.counts.values())
    summary = {
        "mode": args.mode, "num_blocks": args.num_blocks, "clients": args.clients,
        "seconds": round(elapsed, 1), "requests": stats.requests, "ok_requests": ok_total,
        "completion_tokens": stats.tokens,
        "requests_per_s": round(stats.requests / elapsed, 2),
        "tokens_per_s": round(stats.tokens / elapsed, 1),
        "outcomes": stats.counts, "preemptions": preemptions,
        "swap_out_blocks": metric(end_m, "kvserve_swap_out_blocks_total"),
        "http_5xx": stats.http_5xx,
        "active_blocks_end": metric(after_golden, "kvserve_kv_blocks", {"state": "active"}),
        "rss_mb": {"warm": round(base_rss, 1), "end": round(end_rss, 1),
                   "growth": round(growth, 1)},
        "timeline": timeline, "failures": failures,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    print("soak %s: %d requests (%d ok) in %.0f s, %.2f req/s, %.1f completion tok/s, "
          "%d preemptions, %d swapped-out blocks, %d HTTP 5xx, active blocks at end %d, "
          "RSS %.1f -> %.1f MB (%+.1f)" % (
              args.mode, stats.requests, ok_total, elapsed, summary["requests_per_s"],
              summary["tokens_per_s"], preemptions, summary["swap_out_blocks"], stats.http_5xx,
              summary["active_blocks_end"], base_rss, end_rss, growth))
    for kind in sorted(stats.counts):
        print("  %-14s %s" % (kind, ", ".join("%s %d" % kv for kv in sorted(
            stats.counts[kind].items()))))
    if failures:
        print("soak FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
