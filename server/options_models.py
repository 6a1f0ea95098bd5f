"""`tensorgate serve`'s model flags: the repositories and how models are loaded from them (control mode,
config files and their auto-completion, loading threads and retries, namespacing, errors at startup), where
python models run, the rate limiter, readiness, and the response cache of their answers."""

import argparse

from tensorgate.batcher.rate_limiter import resource_flag
from tensorgate.server.backends.python import EXECUTION_MODES
from tensorgate.server.options_values import boolean, not_negative, positive_int
from tensorgate.server.repository import CONTROL_MODES


def add_model_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--model-repository",
        action="append",
        required=True,
        metavar="PATH|URL",
        help="a model repository: a directory, or s3://bucket/path (s3://host:port/bucket/path: an "
        "S3-compatible endpoint), gs://bucket/path, as://account/container/path (the cloud extra). "
        "Repeatable: the models of every repository are served together",
    )
    serve.add_argument(
        "--model-control-mode",
        type=str.lower,
        choices=CONTROL_MODES,
        default="none",
        help="none: load every model at start, refuse load/unload; explicit: load the --load-model ones, "
        "then obey the repository API; poll: follow the repository's changes (default none)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' loads all)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        help="poll mode: seconds between scans of the repository (default 15)",
    )
    serve.add_argument(
        "--python-execution-mode",
        type=str.lower,
        choices=EXECUTION_MODES,
        default="auto",
        help="where python models whose config sets no EXECUTION_MODE run their instances: process (each in "
        "a process of its own), thread (threads of the server), or auto: process for a model.py written for "
        "Triton's API (triton_python_backend_utils), as Triton runs it, thread for ours (default auto)",
    )
    serve.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=("off", "execution_count"),
        default="off",
        help="execution_count: a model instance whose instance_group gives a rate_limiter executes only "
        "when the resources it lists are free, instances taking turns by priority across models; off: "
        "rate_limiter configs are ignored (default off; docs/scheduling/rate-limiter.md)",
    )
    serve.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        type=resource_flag,
        metavar="NAME:COUNT[:DEVICE]",
        help="the count of a rate limiter resource, on DEVICE or else on every device (repeatable; names "
        "match case-insensitively). Without it, a resource's count is the largest any loaded instance asks "
        "for; with any, a resource not given has count 0",
    )
    serve.add_argument(
        "--strict-readiness",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="ready only when every loaded model is ready (default true); false: ready once serving",
    )
    serve.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="Triton's custom configs: each model loads <model>/configs/NAME.pbtxt where it has one, else "
        "its config.pbtxt (default: config.pbtxt)",
    )
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="Triton's: configs are used as written, not completed (each must name its backend or platform "
        "and its inputs and outputs); by default they are completed from the model files",
    )
    serve.add_argument(
        "--strict-model-config",
        type=boolean,
        default=False,
        metavar="true|false",
        help="Triton's older name: true is --disable-auto-complete-config (default false)",
    )
    serve.add_argument(
        "--model-load-thread-count",
        type=positive_int,
        default=4,
        metavar="N",
        help="models loading at once, at most, each in a thread of its own (default 4, as Triton's)",
    )
    serve.add_argument(
        "--model-load-retry-count",
        type=not_negative(int),
        default=0,
        metavar="N",
        help="Triton's: a model version whose backend fails to load is tried again, up to N more times "
        "(default 0)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]SETTING=VALUE",
        help="Triton's backend settings (repeatable): default-max-batch-size=N (default 4) is the "
        "max_batch_size auto-complete gives an ONNX model whose graph batches; with BACKEND, for that "
        "backend only. Other settings are accepted and ignored, with a warning",
    )
    serve.add_argument(
        "--model-namespacing",
        type=boolean,
        default=False,
        metavar="true|false",
        help="Triton's: each --model-repository is a namespace, so a model name may be in several; a request "
        "naming such a name is refused as ambiguous, an ensemble's steps call the models of its own "
        "repository first (default false: a name in two repositories is served from neither)",
    )
    serve.add_argument(
        "--exit-on-error",
        type=boolean,
        default=False,
        metavar="true|false",
        help="Triton's: true exits (status 1) when anything fails at startup: a model that does not load, a "
        "repository that cannot be read. Default false (Triton's is true): the server starts and serves "
        "the models that loaded, the others UNAVAILABLE with their reason",
    )


def add_response_cache_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="the response cache, Triton's flag: 'local,size=BYTES' keeps up to BYTES of answers of the "
        "models whose config says response_cache { enable: true } (default: no cache)",
    )
    serve.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="Triton's older form of --cache-config local,size=BYTES",
    )
