"""python -m bench.tfserving_grpc: TF Serving's gRPC Predict beside KServe v2's ModelInfer and TF Serving's
REST predict, on the same model and tensor, in one server (issue 40).

The same three values of `half_plus_two` (FP32 [3]) go in three ways, each driven by h2load -c8 -m4 on
one server in `--rounds` rounds whose order alternates:

    tf-grpc     tensorflow.serving.PredictionService/Predict, the tensor in tensor_content
    v2-grpc     inference.GRPCInferenceService/ModelInfer, the tensor in raw_input_contents
    tf-rest     POST /v1/models/half_plus_two:predict {"instances": [1.0, 2.0, 5.0]} over h2c

Server CPU per request and req/s per scenario, and the ratio tf-grpc / v2-grpc of the CPU a request
(issue 40's goal: within 1.2x). Each answer is checked once by grpcio before the rounds; h2load counts
HTTP 200s, so the model's failure count is read after the runs and must not have grown.

    python -m bench.tfserving_grpc [--duration 4] [--rounds 5] [--out bench/results]
"""

import argparse
import os
import statistics
import tempfile

import httpx
import numpy as np

import tensorgate.proto.inference as v2
import tensorgate.proto.tensorflow as tf
import tensorgate.proto.tensorflow.serving as tfs
from bench.grpc_bench import grpc_body
from bench.grpc_bench import h2load as grpc_h2load
from bench.procs import ServerProcess, serve_argv
from bench.transport import alternating_rounds, h2load, measure, save

X = np.array([1.0, 2.0, 5.0], dtype=np.float32)
PREDICT_PATH = "/tensorflow.serving.PredictionService/Predict"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
REST_PATH = "/v1/models/half_plus_two:predict"
SCENARIOS = ("tf-grpc", "v2-grpc", "tf-rest")
CLIENTS = "-c8 -m4"
GOAL = 1.2  # tf-grpc / v2-grpc, server CPU a request


def predict_request() -> bytes:
    shape = tf.TensorShapeProto(dim=[tf.TensorShapeProtoDim(size=3)])
    x = tf.TensorProto(dtype=tf.DataType.DT_FLOAT, tensor_shape=shape, tensor_content=X.tobytes())
    return bytes(tfs.PredictRequest(model_spec=tfs.ModelSpec(name="half_plus_two"), inputs={"x": x}))


def infer_request() -> bytes:
    x = v2.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[3, 1])
    return bytes(
        v2.ModelInferRequest(model_name="half_plus_two", inputs=[x], raw_input_contents=[X.tobytes()])
    )


def check(server: ServerProcess) -> None:
    """One answer of each, read back: y = x / 2 + 2."""
    import grpc

    want = (X / 2 + 2).tolist()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        predict = channel.unary_unary(PREDICT_PATH, response_deserializer=tfs.PredictResponse.parse)
        answer = predict(predict_request(), timeout=30)
        assert np.frombuffer(answer.outputs["y"].tensor_content, np.float32).tolist() == want, answer
        infer = channel.unary_unary(INFER_PATH, response_deserializer=v2.ModelInferResponse.parse)
        answer = infer(infer_request(), timeout=30)
        assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == want, answer
    rest = httpx.post(
        f"http://127.0.0.1:{server.port}{REST_PATH}", json={"instances": X.tolist()}, timeout=30
    )
    assert rest.json() == {"predictions": want}, rest.text


def driver(name: str, server: ServerProcess, files: dict, duration: float):
    """The timed run of scenario `name`, sized to `duration` by an untimed warm-up."""

    def run(requests: int) -> tuple[int, float, str]:
        if name == "tf-rest":
            return h2load(server.port, files[name], requests, CLIENTS, REST_PATH)
        path = PREDICT_PATH if name == "tf-grpc" else INFER_PATH
        return grpc_h2load(server.grpc_port, path, files[name], requests, CLIENTS)

    warm = run(2000)
    count = max(2000, int(warm[0] / warm[1] * duration)) if warm[1] else 2000
    return lambda: run(count)


def failures(server: ServerProcess) -> int:
    stats = httpx.get(f"http://127.0.0.1:{server.port}/v2/models/half_plus_two/stats", timeout=10).json()
    return stats["model_stats"][0]["inference_stats"]["fail"]["count"]


def report(results: dict, args: argparse.Namespace) -> str:
    lines = [
        "# TF Serving's gRPC Predict beside KServe v2 ModelInfer and TF Serving REST (`half_plus_two`)",
        "",
        f"`python -m bench.tfserving_grpc --duration {args.duration} --rounds {args.rounds}`: one server, "
        f"h2load {CLIENTS}, {args.rounds} alternating rounds; CPU per request is the server's, the median "
        "of the rounds.",
        "",
        "| scenario | req/s | server µs/req | cores |",
        "|---|---|---|---|",
    ]
    for name in SCENARIOS:
        r = results[name]
        lines.append(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.1f} | {r['cores']:.2f} |")
    ratio = results["ratio_cpu"]
    lines += [
        "",
        f"tf-grpc / v2-grpc, server CPU a request (median of the per-round ratios): **{ratio:.3f}x** "
        f"(goal <= {GOAL}x: {'met' if ratio <= GOAL else 'not met'}).",
        f"Failed inferences counted by the model during the runs: {results['failed']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory, ServerProcess(serve_argv()) as server:
        files = {name: os.path.join(directory, name) for name in SCENARIOS}
        for name, body in (
            ("tf-grpc", grpc_body([predict_request()])),
            ("v2-grpc", grpc_body([infer_request()])),
        ):
            with open(files[name], "wb") as f:
                f.write(body)
        with open(files["tf-rest"], "wb") as f:
            f.write(b'{"instances": [1.0, 2.0, 5.0]}')
        check(server)
        before = failures(server)
        rounds = alternating_rounds(  # every scenario in each round, their order alternating
            "tfserving-grpc",
            list(SCENARIOS),
            args.rounds,
            lambda name: measure(server, driver(name, server, files, args.duration)),
        )
        results = {name: rounds[name] for name in SCENARIOS}
        pairs = zip(rounds["rounds"]["tf-grpc"], rounds["rounds"]["v2-grpc"], strict=True)
        results["ratio_cpu"] = statistics.median(a["cpu_us"] / b["cpu_us"] for a, b in pairs)
        results["failed"] = failures(server) - before
        results["rounds"] = rounds["rounds"]
    save(report(results, args), results, args, "tfserving-grpc")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
