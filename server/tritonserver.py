"""`tritonserver`: Triton's command line, run as `tensorgate serve`.

A Triton deployment's manifests (a Helm chart's args, KServe's Triton runtime) start `tritonserver` with
Triton's flags, spelled as Triton's parser takes them (getopt_long: `--flag=value` or `--flag value`, an
unambiguous prefix of a name, booleans as true/false, on/off, 1/0). FLAGS is the one table of every flag of
Triton's parser and what we do with it: the same `tensorgate serve` flag, a renamed one, its value
converted, or accepted with a one-line warning that names what we do instead. A tuning flag never stops
startup; a flag Triton's parser does not know does, as in Triton (usage on stderr, exit status 1).
docs/operations/triton-flags.md's table is written from FLAGS (docs/hooks/triton_flags.py;
tests/test_tritonserver_cli.py checks the page).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from tensorgate.server import cli

NONE, BOOL, INT, FLOAT, TEXT = "none", "boolean", "integer", "float", "string"  # Triton's value kinds

# Where Triton's defaults differ from `tensorgate serve`'s: given first, so that the command line overrides.
TRITON_DEFAULTS = ("--id=triton", "--exit-on-error=true")
SAME = "="  # Flag.serve: the `tensorgate serve` flag of the same name


@dataclass(frozen=True)
class Flag:
    """What `tritonserver --NAME` does here."""

    value: str = TEXT  # the kind of value Triton's parser takes (NONE: the flag takes none)
    serve: str = ""  # the `tensorgate serve` flag it becomes (SAME: its own name); "": none (a warning)
    convert: Callable[[str], str] | None = None  # the value as `serve` takes it, where it differs
    instead: str = ""  # with no `serve` flag: what we do instead (the warning); else where we differ

    def serve_flag(self, name: str) -> str:
        """The `tensorgate serve` flag `--NAME` becomes ("": none, a warning)."""
        return f"--{name}" if self.serve == SAME else self.serve

    def action(self, name: str) -> str:
        """For the docs: the kind of translation."""
        if name == "help":
            return "usage"
        if not self.serve:
            return "warning"
        if self.convert is not None:
            return "converted"
        return "same" if self.serve_flag(name) == f"--{name}" else "renamed"


class ParseError(Exception):
    """What Triton's parser refuses; the message is Triton's."""


def _int_bool(value: str) -> str:
    """--log-verbose: true and false are 1 and 0, as Triton parses them."""
    return {"true": "1", "false": "0"}.get(value.lower(), value)


def _same(value: str = TEXT, instead: str = "") -> Flag:
    return Flag(value, SAME, instead=instead)


def _warn(value: str, instead: str) -> Flag:
    return Flag(value, instead=instead)


def _trace(setting: str, value: str = INT) -> Flag:
    """Triton's older trace flags: one --trace-config setting each."""
    return Flag(
        value, "--trace-config", lambda given: f"{setting}={given}", f"--trace-config {setting}=VALUE"
    )


_ONE_PROCESS = "requests run on each front-end process's event loop; --workers N sets the processes"
_NO_GPU_POOL = "CUDA memory comes from the framework's own allocator (CuPy, PyTorch) as it is needed"

FLAGS: dict[str, Flag] = {
    "help": Flag(NONE, instead="prints this table's flags and exits 0 (Triton prints its usage and exits 1)"),
    # Server
    "id": _same(instead="default 'triton' under tritonserver, 'tensorgate' under tensorgate serve"),
    "exit-timeout-secs": _same(INT),
    # Logging
    "log-verbose": Flag(INT, "--log-verbose", _int_bool, "true and false are 1 and 0, as Triton reads them"),
    "log-info": _same(BOOL),
    "log-warning": _same(BOOL),
    "log-error": _same(BOOL),
    "log-format": _same(),
    "log-file": _same(),
    # Model repository
    "model-store": Flag(TEXT, "--model-repository"),
    "model-repository": _same(),
    "exit-on-error": _same(BOOL, "default true under tritonserver, as Triton's"),
    "disable-auto-complete-config": _same(NONE),
    "strict-model-config": _same(BOOL),
    "strict-readiness": _same(BOOL),
    "model-control-mode": _same(),
    "repository-poll-secs": _same(INT),
    "load-model": _same(),
    "model-config-name": _same(),
    "model-load-thread-count": _same(INT),
    "model-load-retry-count": _same(INT),
    "model-namespacing": _same(BOOL),
    "enable-peer-access": _warn(BOOL, "GPU peer access is left as the CUDA driver sets it"),
    # HTTP
    "allow-http": _same(BOOL),
    "http-address": _same(),
    "http-port": _same(INT),
    "reuse-http-port": _warn(BOOL, "one server holds the HTTP port; --workers N shares it among N processes"),
    "http-header-forward-pattern": _same(),
    "http-thread-count": _warn(INT, _ONE_PROCESS),
    "http-max-input-size": _same(INT),
    "http-restricted-api": _same(),
    # gRPC
    "allow-grpc": _same(BOOL),
    "grpc-address": _same(),
    "grpc-port": _same(INT),
    "reuse-grpc-port": _warn(BOOL, "one server holds the gRPC port; --workers N shares it among N processes"),
    "grpc-header-forward-pattern": _same(),
    "grpc-infer-thread-count": _warn(INT, _ONE_PROCESS),
    "grpc-infer-allocation-pool-size": _warn(INT, "gRPC calls keep no pool of request objects"),
    "grpc-max-response-pool-size": _warn(INT, "gRPC responses are written as they are made, with no pool"),
    "grpc-use-ssl": _same(BOOL),
    "grpc-use-ssl-mutual": _same(BOOL),
    "grpc-server-cert": _same(),
    "grpc-server-key": _same(),
    "grpc-root-cert": _same(),
    "grpc-infer-response-compression-level": _same(),
    "grpc-keepalive-time": _same(INT),
    "grpc-keepalive-timeout": _same(INT),
    "grpc-keepalive-permit-without-calls": _same(BOOL),
    "grpc-http2-max-pings-without-data": _same(INT),
    "grpc-http2-min-recv-ping-interval-without-data": _same(INT),
    "grpc-http2-max-ping-strikes": _same(INT),
    "grpc-max-connection-age": _same(INT),
    "grpc-max-connection-age-grace": _same(INT),
    "grpc-restricted-protocol": _same(),
    # SageMaker and Vertex AI
    "allow-sagemaker": _warn(BOOL, "no SageMaker endpoint: the v2 HTTP port serves"),
    "sagemaker-port": _warn(INT, "no SageMaker endpoint: the v2 HTTP port serves"),
    "sagemaker-safe-port-range": _warn(TEXT, "no SageMaker endpoint: the v2 HTTP port serves"),
    "sagemaker-thread-count": _warn(INT, "no SageMaker endpoint: the v2 HTTP port serves"),
    "allow-vertex-ai": _warn(BOOL, "no Vertex AI endpoint: the v2 HTTP port serves"),
    "vertex-ai-port": _warn(INT, "no Vertex AI endpoint: the v2 HTTP port serves"),
    "vertex-ai-thread-count": _warn(INT, "no Vertex AI endpoint: the v2 HTTP port serves"),
    "vertex-ai-default-model": _warn(TEXT, "no Vertex AI endpoint: the v2 HTTP port serves"),
    # Metrics
    "allow-metrics": _same(BOOL),
    "allow-gpu-metrics": _same(BOOL),
    "allow-cpu-metrics": _same(BOOL),
    "metrics-address": _same(),
    "metrics-port": _same(INT),
    "metrics-interval-ms": _same(FLOAT),
    "metrics-config": _same(),
    # Tracing, the cache, the rate limiter
    "trace-config": _same(),
    "trace-file": _trace("triton,file", TEXT),
    "trace-level": _trace("level", TEXT),
    "trace-rate": _trace("rate"),
    "trace-count": _trace("count"),
    "trace-log-frequency": _trace("triton,log-frequency"),
    "cache-config": _same(),
    "cache-directory": _warn(TEXT, "the one cache is in memory ('local'); no cache library is loaded"),
    "response-cache-byte-size": _same(INT),
    "rate-limit": _same(),
    "rate-limit-resource": _same(),
    # Memory, devices and backends
    "pinned-memory-pool-byte-size": _warn(INT, "host tensors are numpy arrays, not pinned memory"),
    "cuda-memory-pool-byte-size": _warn(TEXT, _NO_GPU_POOL),
    "cuda-virtual-address-size": _warn(TEXT, _NO_GPU_POOL),
    "min-supported-compute-capability": _warn(FLOAT, "any GPU the framework supports is used"),
    "buffer-manager-thread-count": _warn(INT, "tensors are copied by the thread that needs them"),
    "host-policy": _warn(TEXT, "no host policy: NUMA placement is left to the operating system"),
    "model-load-gpu-limit": _warn(TEXT, "models load whatever GPU memory is free"),
    "allow-client-shm": _same(BOOL),
    "backend-directory": _warn(TEXT, "the backends are built in (python, onnxruntime, pytorch, ensemble)"),
    "backend-config": _same(instead="default-max-batch-size is used; other settings warn"),
    "repoagent-directory": _warn(TEXT, "no repository agents: models load as they are on disk"),
}


def _check(name: str, flag: Flag, value: str) -> None:
    """The value as Triton's parser checks it (ParseOption), with its texts."""
    try:
        if flag.value == BOOL and value.lower() not in ("true", "on", "1", "false", "off", "0"):
            raise ParseError(f"invalid value for bool option: {value}")
        if flag.value == INT:
            int(_int_bool(value) if name == "log-verbose" else value)
        elif flag.value == FLOAT:
            float(value)
    except ValueError:
        raise ParseError(f'Bad option: "--{name}".\nInvalid option value. Got {value}') from None
    except ParseError as e:
        raise ParseError(f'Bad option: "--{name}".\n{e}') from None


def _find(given: str) -> str:
    """A flag's name from what was typed: the name, or an unambiguous prefix of one (getopt_long's rule)."""
    if given in FLAGS:
        return given
    matches = [name for name in FLAGS if name.startswith(given)] if given else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ParseError(f"tritonserver: option '--{given}' is ambiguous")
    raise ParseError(f"tritonserver: unrecognized option '--{given}'")  # getopt's words


def translate(argv: list[str]) -> tuple[list[str], list[str]]:
    """Triton's arguments (after the program's name) as `tensorgate serve` arguments, and one warning line
    for each flag accepted without effect. ParseError: what Triton's parser refuses; ["--help"] alone for
    --help."""
    serve = list(TRITON_DEFAULTS)
    warnings: list[str] = []
    warned: set[str] = set()
    rest = iter(argv)
    for argument in rest:
        if argument == "--":
            extra = next(rest, None)
            if extra is not None:
                raise ParseError(f"Unexpected argument: {extra}")
            break
        if not argument.startswith("--"):
            if argument.startswith("-") and argument != "-":
                raise ParseError(f"tritonserver: invalid option -- '{argument[1:2]}'")
            raise ParseError(f"Unexpected argument: {argument}")
        given, equals, value = argument[2:].partition("=")
        try:
            name = _find(given)
        except ParseError as e:
            raise ParseError(str(e).replace(f"'--{given}'", f"'{argument}'")) from None
        flag = FLAGS[name]
        if flag.value == NONE:
            if equals:
                raise ParseError(f"tritonserver: option '--{name}' doesn't allow an argument")
        elif not equals:
            following = next(rest, None)
            if following is None:
                raise ParseError(f"tritonserver: option '--{name}' requires an argument")
            value = following
        if name == "help":
            return ["--help"], []
        if flag.value != NONE:
            _check(name, flag, value)
        if flag.serve:
            if flag.value == NONE:
                serve.append(flag.serve_flag(name))
            else:
                serve.append(f"{flag.serve_flag(name)}={flag.convert(value) if flag.convert else value}")
        elif name not in warned:
            warned.add(name)
            warnings.append(f"tritonserver: --{name} is accepted and has no effect here: {flag.instead}")
    return serve, warnings


def _usage() -> int:
    print("Usage: tritonserver [options]\n")
    print("Triton's flags, run as `tensorgate serve` (docs/operations/triton-flags.md):\n")
    for name in list(FLAGS)[1:]:  # --help's own line aside
        flag = FLAGS[name]
        what = flag.serve_flag(name) or f"accepted, no effect: {flag.instead}"
        print(f"  --{name}{'' if flag.value == NONE else '=<' + flag.value + '>'}  ->  {what}")
    return 0


def markdown_table() -> str:
    """The table of docs/operations/triton-flags.md, one row a flag."""
    rows = [
        "| Triton's flag | Value | What tensorgate does | `tensorgate serve` flag | Notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, flag in FLAGS.items():
        serve = f"`{flag.serve_flag(name)}`" if flag.serve else ""
        rows.append(f"| `--{name}` | {flag.value} | {flag.action(name)} | {serve} | {flag.instead} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    try:
        serve, warnings = translate(arguments)
    except ParseError as e:
        usage = "Usage: tritonserver [options]\n(tritonserver --help lists them)\n"
        # getopt's own complaints come before the usage, Triton's after it (as Triton writes them)
        text = f"{e}\n{usage}" if str(e).startswith("tritonserver: ") else f"{usage}{e}\n"
        sys.stderr.write(text)
        return 1
    if serve == ["--help"]:
        return _usage()
    for line in warnings:
        sys.stderr.write(line + "\n")
    if not any(argument.startswith("--model-repository=") for argument in serve):
        sys.stderr.write("error: creating server: Invalid argument - --model-repository must be specified\n")
        return 1
    return cli.serve(serve)


if __name__ == "__main__":
    raise SystemExit(main())
