"""TensorFlow Serving's view of the repository, shared by its REST API (server/endpoints/tfserving.py) and its
gRPC services (server/grpc/tfserving.py): models by name, version or version label, their signatures, and
their versions' states.

Two things a Triton config does not say are read from its `parameters`:
- `version_labels`: "stable=1,canary=2" names versions (REST: `/v1/models/{m}/labels/{label}`; gRPC:
  ModelSpec.version_label).
- `signature:<name>`: "out1,out2" declares a signature answering those outputs (all inputs). The model
  itself is `serving_default` (every output); TF's method names (tensorflow/serving/predict, ...) and ""
  name it too.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from tensorgate.codec import tfserving
from tensorgate.codec.errors import ErrorKind, InferError, invalid
from tensorgate.codec.tfserving import TensorInfo
from tensorgate.server.model import UNLOADED, ModelState

if TYPE_CHECKING:
    from tensorgate.server.engine_client import EngineClient
    from tensorgate.server.model import ModelVersion, TensorSpec

LABELS_PARAMETER = "version_labels"
SIGNATURE_PREFIX = "signature:"
METHOD_NAMES = ("tensorflow/serving/predict", "tensorflow/serving/classify", "tensorflow/serving/regress")
_STATES = {ModelState.READY: "AVAILABLE", ModelState.LOADING: "LOADING", ModelState.UNLOADING: "UNLOADING"}


def _info(spec: TensorSpec) -> TensorInfo:
    own = spec.model_dims if spec.model_dims is not None else spec.dims
    shape = ((-1,) if spec.batched else ()) + own
    return TensorInfo(spec.name, spec.dtype.v2, shape, spec.shape, spec.optional)


def _config_error(model: str, message: str) -> InferError:
    return InferError(ErrorKind.INTERNAL, f"model '{model}': config parameter {message}")


def _parameter(config: dict | None, key: str) -> str:
    value = ((config or {}).get("parameters") or {}).get(key) or {}
    return value.get("string_value", "") if isinstance(value, dict) else ""


def version_labels(config: dict | None, model: str) -> dict[str, int]:
    """The `version_labels` parameter, "label=version,...", as a dict."""
    raw, labels = _parameter(config, LABELS_PARAMETER), {}
    for entry in raw.split(","):
        if not entry.strip():
            continue
        label, sep, number = (part.strip() for part in entry.partition("="))
        if not (sep and label and number.isascii() and number.isdigit()):
            raise _config_error(model, f"'{LABELS_PARAMETER}' must read 'label=version,...', not {raw!r}")
        labels[label] = int(number)
    return labels


def signatures(config: dict, outputs: list[str], model: str) -> dict[str, list[str] | None]:
    """Signature name -> the outputs it answers (None: all). `serving_default` is always there."""
    found: dict[str, list[str] | None] = {tfserving.DEFAULT_SIGNATURE: None}
    for key in config.get("parameters") or {}:
        if not key.startswith(SIGNATURE_PREFIX):
            continue
        raw = _parameter(config, key)
        names = [name.strip() for name in raw.split(",") if name.strip()]
        unknown = [name for name in names if name not in outputs]
        if not key[len(SIGNATURE_PREFIX) :]:
            raise _config_error(model, f"'{key}' names no signature")
        if not names or unknown:
            raise _config_error(
                model, f"'{key}' must list some of the outputs {', '.join(outputs)}, not {raw!r}"
            )
        found[key[len(SIGNATURE_PREFIX) :]] = names
    return found


class View:
    """A model version as TF Serving shows it; built once per version."""

    def __init__(self, version: ModelVersion) -> None:
        self.inputs = [_info(spec) for spec in version.inputs.values()]
        self.outputs = {name: _info(spec) for name, spec in version.outputs.items()}
        self.signatures = signatures(version.config, list(self.outputs), version.name)
        self.model = version.name

    def outputs_for(self, signature: str) -> list[str] | None:
        if signature in self.signatures:
            return self.signatures[signature]
        if not signature or signature in METHOD_NAMES:
            return None
        raise invalid(
            f"Serving signature name: \"{signature}\" not found in signature def of model '{self.model}' "
            f"(it has: {', '.join(self.signatures)})"
        )


class TFServing:
    """The models as TF Serving shows them (the engine client's table: server/engine_client.py); a View per
    model version, built once."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self._views: weakref.WeakKeyDictionary[ModelVersion, View] = weakref.WeakKeyDictionary()

    def view(self, version: ModelVersion) -> View:
        found = self._views.get(version)
        if found is None:
            found = self._views[version] = View(version)
        return found

    def labeled(self, name: str, label: str) -> str:
        """The version a label names, as a string."""
        labels = version_labels(self.engine.table.model(name).config, name)
        if label not in labels:
            raise invalid(f"Unrecognized servable version label: {label}")
        return str(labels[label])

    def resolve(self, name: str, version: str) -> tuple[ModelVersion, View]:
        """The model version (`version` "": the latest ready one) and its view."""
        model_version = self.engine.resolve(name, version)
        return model_version, self.view(model_version)

    def statuses(self, name: str, version: str) -> list[tuple[int, str, str]]:
        """(version, state, error message) of the version named, or of every version newest first."""
        model = self.engine.table.model(name)
        if version:
            found = model.versions.get(int(version))
            if found is None:
                raise InferError(ErrorKind.NOT_FOUND, f"Could not find version {version} of model {name}")
            versions = [found]
        else:
            versions = model.newest_first
            if not versions:
                reason = f": {model.reason}" if model.reason else ""
                raise InferError(ErrorKind.NOT_FOUND, f"Could not find any versions of model {name}{reason}")
        return [(v.version, *state_of(v)) for v in versions]

    @staticmethod
    def signature_defs(view: View) -> dict[str, tuple[list[TensorInfo], list[TensorInfo]]]:
        """Each signature's (inputs, outputs)."""
        everything = list(view.outputs.values())
        return {
            name: (view.inputs, everything if outputs is None else [view.outputs[o] for o in outputs])
            for name, outputs in view.signatures.items()
        }


def state_of(version: ModelVersion) -> tuple[str, str]:
    """TF Serving's ModelVersionStatus state and error message for a version."""
    if version.state in _STATES:
        return _STATES[version.state], ""
    if not version.reason:
        return "START", ""  # not loaded yet
    if version.reason == UNLOADED:  # a clean end
        return "END", ""
    return "END", version.reason
