#!/usr/bin/env python3
"""A kvserve gRPC client in a few lines: streams a completion to stdout.

  /usr/bin/python3 scripts/grpc_generate.py [--addr 127.0.0.1:50051]
      [--max-tokens 64] [--temperature 0] "Once upon a time"

Needs Debian's python3-grpcio and python3-protobuf (scripts/install-deps.sh
installs them with the test dependencies), and protoc with
grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc) or
grpc_tools: the stubs are generated from proto/kvserve.proto into a scratch
directory at each run. generate_stubs() is shared with the tests.
"""

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto")


def generate_stubs(proto_dir, out_dir):
    """Writes kvserve_pb2.py and kvserve_pb2_grpc.py into out_dir."""
    proto = os.path.join(proto_dir, "kvserve.proto")
    try:
        from grpc_tools import protoc  # noqa: F401

        cmd = [sys.executable, "-m", "grpc_tools.protoc"]
        plugin = []
    except ImportError:
        cmd = [shutil.which("protoc") or "protoc"]
        grpc_plugin = shutil.which("grpc_python_plugin")
        if grpc_plugin is None:
            sys.exit("neither grpc_tools nor grpc_python_plugin is installed")
        plugin = ["--plugin=protoc-gen-grpc_python=" + grpc_plugin]
    cmd += ["-I", proto_dir, "--python_out", out_dir, "--grpc_python_out", out_dir] + plugin
    subprocess.run(cmd + [proto], check=True)


def import_stubs(proto_dir, out_dir):
    generate_stubs(proto_dir, out_dir)
    sys.path.insert(0, out_dir)
    return importlib.import_module("kvserve_pb2"), importlib.import_module("kvserve_pb2_grpc")


def main():
    import grpc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompt")
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix="kvserve-pystubs-")
    try:
        pb, pb_grpc = import_stubs(PROTO_DIR, out_dir)
        with grpc.insecure_channel(args.addr) as channel:
            stub = pb_grpc.GenerationStub(channel)
            request = pb.GenerateRequest(prompt=args.prompt, max_tokens=args.max_tokens,
                                         sampling=pb.SamplingParams(temperature=args.temperature))
            for response in stub.Generate(request, timeout=300):
                sys.stdout.write(response.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
    except grpc.RpcError as e:
        sys.exit("kvserve: %s: %s" % (e.code().name, e.details()))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
