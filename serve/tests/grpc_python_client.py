#!/usr/bin/python3
"""A Python grpcio client of gradwire's inference endpoint, made from the .proto alone.

  grpc_python_client.py SERVE_TEST_BINARY PROTO_DIR

Starts SERVE_TEST_BINARY in its "endpoint" role (a job of two workers serving "mnist"
behind an InferenceEndpoint), then
  1. generates Python stubs from PROTO_DIR/gradwire/proto/inference.proto (grpc_tools)
     and calls Health, ModelStatus and Predict (float_data and raw_data inputs, several
     rows), and checks the errors of malformed requests;
  2. like grpcurl without a .proto: asks the endpoint's server reflection for its
     services and the schema of gradwire.serve.Inference, builds the messages from that
     schema alone and calls Predict.
Exit status 0 when every check passed, 1 otherwise, 77 (skipped) when python3-grpcio or
python3-grpc-tools is missing (scripts/setup-deps installs them).
"""
import atexit
import json
import os
import struct
import shutil
import subprocess
import sys
import tempfile

try:
    import grpc
    from grpc_tools import protoc
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as e:
    print(f"skipped: {e}: install python3-grpcio and python3-grpc-tools (scripts/setup-deps does)")
    sys.exit(77)

failures = []


def check(ok, what):
    print(("ok      " if ok else "FAILED  ") + what, flush=True)
    if not ok:
        failures.append(what)


def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


def generate(out, proto_dir, *files):
    for f in files:
        include = os.path.dirname(f) if os.path.isabs(f) else proto_dir
        name = os.path.basename(f) if os.path.isabs(f) else f
        rc = protoc.main(["protoc", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", name])
        if rc != 0:
            sys.exit(f"protoc failed on {f}")
    sys.path.insert(0, out)


def main():
    server_bin, proto_dir = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="gradwire_pyclient_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # the generated stubs: nothing left in /tmp
    here = os.path.dirname(os.path.abspath(__file__))
    generate(out, proto_dir, "gradwire/proto/inference.proto", os.path.join(here, "reflection.proto"))
    from gradwire.proto import inference_pb2 as pb
    from gradwire.proto import inference_pb2_grpc as pb_grpc
    import reflection_pb2
    import reflection_pb2_grpc

    server = subprocess.Popen([server_bin], env=dict(os.environ, GW_TEST_ROLE="endpoint"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if not line:
            sys.exit("the endpoint process printed nothing (see its errors above)")
        info = json.loads(line)
        address, expected = info["address"], info["expected"]
        x = [(i % 17) / 100.0 for i in range(784)]
        channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(channel).result(timeout=30)

        # 1. Stubs generated from inference.proto.
        stub = pb_grpc.InferenceStub(channel)
        check(stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING", "Health says SERVING")
        status = stub.ModelStatus(pb.ModelStatusRequest(model="mnist"), timeout=10)
        check(status.ready and [r.worker for r in status.replicas] == ["worker1"], "ModelStatus: ready on worker1")
        check(not stub.ModelStatus(pb.ModelStatusRequest(model="nope"), timeout=10).ready, "an unknown model is not ready")

        answer = stub.Predict(pb.PredictRequest(model="mnist", input=pb.Tensor(
            dtype=pb.Tensor.FLOAT32, shape=[1, 784], float_data=x)), timeout=10)
        check(list(answer.output.shape) == [1, 10], f"Predict answers shape [1, 10] (got {list(answer.output.shape)})")
        check(answer.version == "v7" and answer.replica == "worker1", "Predict names version v7 and replica worker1")
        out_values = list(answer.output.float_data) or list(struct.unpack("<10f", answer.output.raw_data))
        check(close(out_values, expected), "Predict's output equals the C++ model's")

        raw = pb.Tensor(dtype=pb.Tensor.FLOAT32, shape=[3, 784], raw_data=struct.pack("<2352f", *(x * 3)))
        answer3 = stub.Predict(pb.PredictRequest(model="mnist", input=raw), timeout=10)
        rows = list(answer3.output.float_data) or list(struct.unpack("<30f", answer3.output.raw_data))
        check(list(answer3.output.shape) == [3, 10] and all(close(rows[10 * r:10 * r + 10], expected) for r in range(3)),
              "three rows as raw little-endian bytes: three equal answers")

        def error_of(request):
            try:
                stub.Predict(request, timeout=10)
                return None
            except grpc.RpcError as e:
                return e.code(), e.details()

        err = error_of(pb.PredictRequest(model="mnist", input=pb.Tensor(shape=[1, 5], float_data=[0] * 5)))
        check(err is not None and err[0] == grpc.StatusCode.INVALID_ARGUMENT and "expects input [N, 784]" in err[1],
              f"a wrong shape: INVALID_ARGUMENT naming the expected one ({err})")
        err = error_of(pb.PredictRequest(model="mnist", input=pb.Tensor(shape=[1, 784], float_data=[0] * 3)))
        check(err is not None and err[0] == grpc.StatusCode.INVALID_ARGUMENT, f"data that does not fill its shape ({err})")
        err = error_of(pb.PredictRequest(model="nope", input=pb.Tensor(shape=[1, 784], float_data=x)))
        check(err is not None and err[0] == grpc.StatusCode.UNAVAILABLE and "nope" in err[1], f"an unknown model ({err})")
        check(stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING", "still SERVING after bad requests")

        # 2. No .proto: the schema from server reflection, as grpcurl gets it.
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

        def ask(**request):
            return next(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(**request)]),
                                                        timeout=10))

        services = [s.name for s in ask(list_services="").list_services_response.service]
        check("gradwire.serve.Inference" in services, f"reflection lists gradwire.serve.Inference ({services})")
        files = ask(file_containing_symbol="gradwire.serve.Inference").file_descriptor_response.file_descriptor_proto
        pool = descriptor_pool.DescriptorPool()
        for blob in files:
            pool.Add(descriptor_pb2.FileDescriptorProto.FromString(blob))
        method = pool.FindServiceByName("gradwire.serve.Inference").methods_by_name["Predict"]
        factory = message_factory.MessageFactory(pool)
        Request = factory.GetPrototype(method.input_type)
        Response = factory.GetPrototype(method.output_type)
        request = Request(model="mnist")
        request.input.shape.extend([1, 784])
        request.input.float_data.extend(x)
        predict = channel.unary_unary("/gradwire.serve.Inference/Predict",
                                      request_serializer=Request.SerializeToString,
                                      response_deserializer=Response.FromString)
        reflected = predict(request, timeout=10)
        values = list(reflected.output.float_data) or list(struct.unpack("<10f", reflected.output.raw_data))
        check(close(values, expected), "Predict from the reflected schema alone equals the C++ model's output")
        channel.close()
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            failures.append("the endpoint process did not stop when its stdin closed")
    check(server.returncode == 0, f"the endpoint process exited cleanly (status {server.returncode})")
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
