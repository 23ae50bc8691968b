#!/usr/bin/env python3
"""Streams a completion from a running kvserve daemon with a Python grpcio client.

Stubs are generated from proto/kvserve.proto at run time into a scratch
directory by scripts/grpc_generate.py's import_stubs.

Environment:
  KVSERVE_GRPC_ADDR    host:port of the daemon's gRPC server (required)
  KVSERVE_PROTO_DIR    directory holding kvserve.proto (default: ../../../proto)
  KVSERVE_GOLDEN_FILE  when set, the greedy text must equal this file's text
                       (without its final newline)
Exit status 0 when every check passes.
"""

import os
import shutil
import sys
import tempfile

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "scripts"))
from grpc_generate import import_stubs  # noqa: E402


def check(condition, message):
    if not condition:
        print("FAILED:", message, file=sys.stderr)
        sys.exit(1)


def main():
    addr = os.environ["KVSERVE_GRPC_ADDR"]
    here = os.path.dirname(os.path.abspath(__file__))
    proto_dir = os.environ.get("KVSERVE_PROTO_DIR", os.path.join(here, "..", "..", "..", "proto"))
    out_dir = tempfile.mkdtemp(prefix="kvserve-pystubs-")
    try:
        pb, pb_grpc = import_stubs(proto_dir, out_dir)

        with grpc.insecure_channel(addr) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)

            # Health, hand-encoded: HealthCheckResponse{status: SERVING} is 08 01.
            health = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            check(health(b"", timeout=30) == b"\x08\x01", "health is not SERVING")

            # Server reflection lists the service: ServerReflectionRequest with
            # list_services "" is 3a 00.
            reflection = channel.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            listed = b"".join(reflection(iter([b"\x3a\x00"]), timeout=30))
            check(b"kvserve.v1.Generation" in listed, "reflection does not list the service")

            stub = pb_grpc.GenerationStub(channel)
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
            check(info.vocab_size > 0 and info.max_model_len > 0, "model info is empty")

            request = pb.GenerateRequest(
                prompt="",
                max_tokens=256,
                sampling=pb.SamplingParams(temperature=0.0),
                request_id="python-1",
            )
            responses = list(stub.Generate(request, timeout=120))
            check(len(responses) > 1, "Generate did not stream")
            text = "".join(r.text for r in responses)
            last = responses[-1]
            check(all(r.request_id == "python-1" for r in responses), "request ids differ")
            check(last.request_finished, "the last response does not finish the request")
            check(last.finish_reason == pb.FINISH_REASON_LENGTH, "finish reason is not LENGTH")
            check(last.usage.completion_tokens == 256, "usage is not 256 completion tokens")
            golden_file = os.environ.get("KVSERVE_GOLDEN_FILE")
            if golden_file:
                with open(golden_file, encoding="utf-8") as f:
                    golden = f.read().rstrip("\n")
                check(text == golden, "the greedy text differs from the reference")

            try:
                list(stub.Generate(pb.GenerateRequest(sampling=pb.SamplingParams(temperature=-1)),
                                   timeout=30))
                check(False, "temperature -1 was accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "wrong code: %s" % e.code())
                check(e.details().startswith("temperature"), "message: " + e.details())

        print("python grpc client: %d responses, %d characters" % (len(responses), len(text)))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
