"""Ensembles (`platform: "ensemble"`): Triton's `ensemble_scheduling` steps, run by the server itself.

    ensemble_scheduling { step [
      { model_name: "pre"  model_version: -1  input_map { key: "RAW" value: "IMAGE" }
                                              output_map { key: "PIXELS" value: "pixels" } },
      { model_name: "net"  model_version: -1  input_map { key: "INPUT" value: "pixels" }
                                              output_map { key: "SCORES" value: "SCORES" } } ] }

An input_map maps the step model's input (key) to an ensemble tensor (value), an output_map the step
model's output to an ensemble tensor: the ensemble's own inputs and outputs, or intermediate tensors
between steps. Steps form a graph, not only a chain: each runs as soon as all its inputs exist, beside
the others that can. A step is a request to its model through the model's own scheduler and batcher
(so concurrent ensemble requests batch at each step, and each step's statistics are its model's), and
tensors pass between steps as the same arrays, never copied or serialized.

At load, every step's model must be loaded (explicit mode loads them with the ensemble) and the mapping
must hold together: known models, inputs and outputs, datatypes that agree, every ensemble output
produced, every step reachable, no tensor produced twice, no cycle, and the ensemble's max_batch_size
within each step's. A fault fails the load with a message naming the step and tensor.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tensorgate.batcher.execution import parameters_of
from tensorgate.codec.datatypes import BY_CONFIG
from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.codec.tensor import InferRequest, RequestedOutput, Tensor
from tensorgate.server.backends.base import Backend

if TYPE_CHECKING:
    from tensorgate.batcher.scheduler import Job
    from tensorgate.codec.trace import Trace
    from tensorgate.server.backends.base import Host

CONCURRENCY = 1 << 20  # an ensemble waits on its steps, never on itself: no limit of its own


class EnsembleError(ValueError):
    """An ensemble whose steps do not hold together; the message names the step and the tensor."""


class _Step:
    __slots__ = ("index", "model", "version", "inputs", "outputs", "requested")

    def __init__(self, index: int, entry: dict) -> None:
        self.index = index
        self.model: str = entry.get("model_name") or ""
        version = entry.get("model_version", -1)
        self.version = "" if version in (-1, None) else str(version)
        # model input -> (ensemble tensor, datatype), and model output -> ensemble tensor
        self.inputs: dict[str, tuple[str, str]] = {}
        self.outputs: dict[str, str] = dict(entry.get("output_map") or {})
        self.requested = [RequestedOutput(name) for name in self.outputs]

    def label(self) -> str:
        return f"step {self.index} (model '{self.model}')"


class EnsembleBackend(Backend):
    is_async = True
    instances = CONCURRENCY
    # execute(jobs): each request apart, with its trace (its steps' are its children) and its custom
    # parameters (they go on to every step, as in Triton)
    per_request = True

    def __init__(self, config: dict, host: Host | None) -> None:
        self.name: str = config["name"]
        if host is None:
            raise EnsembleError("ensembles need the server's repository: none is bound")
        self.host = host  # the step models, through their own schedulers
        entries = (config.get("ensemble_scheduling") or {}).get("step") or []
        if not entries:
            raise EnsembleError(f"ensemble '{self.name}' must have at least one step in ensemble_scheduling")
        self.steps = [_Step(i, entry) for i, entry in enumerate(entries)]
        self.outputs = [entry["name"] for entry in config["output"]]
        _check(self.name, config, self.steps, entries, host)

    async def execute(self, jobs: list[Job]) -> list[dict[str, Any] | InferError]:
        """Each request's outputs, or the error that answers it alone."""
        if len(jobs) == 1:
            return [await self._answer(jobs[0])]
        return list(await asyncio.gather(*(self._answer(job) for job in jobs)))

    async def _answer(self, job: Job) -> dict[str, Any] | InferError:
        try:
            return await self._run_steps(job.inputs, parameters_of(job), job.trace)
        except InferError as e:
            return e

    async def _run_steps(
        self, inputs: dict[str, Any], parameters: dict[str, Any], trace: Trace | None
    ) -> dict[str, Any]:
        """Runs the steps, each as soon as its inputs exist; a chain runs without a task per step. Each
        step's request carries the ensemble request's custom `parameters`; a traced request's steps are
        traced as its children."""
        tensors = dict(inputs)
        waiting = list(self.steps)
        running: dict[asyncio.Future, _Step] = {}
        try:
            while waiting or running:
                ready = [step for step in waiting if all(name in tensors for name, _ in step.inputs.values())]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:
                    tensors.update(await self._run(ready[0], tensors, parameters, trace))
                    continue
                for step in ready:
                    running[asyncio.ensure_future(self._run(step, tensors, parameters, trace))] = step
                if not running:
                    names = ", ".join(step.label() for step in waiting)
                    raise InferError(
                        ErrorKind.INVALID_ARGUMENT,
                        f"in ensemble '{self.name}', {names} never got all its inputs (an optional input "
                        "of the ensemble was left out)",
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    del running[future]
                    tensors.update(future.result())
        finally:
            for future in running:
                future.cancel()
        return {name: tensors[name] for name in self.outputs}

    async def _run(
        self, step: _Step, tensors: dict[str, Any], parameters: dict[str, Any], trace: Trace | None
    ) -> dict[str, Any]:
        """One step: a request to its model (through its scheduler), its outputs under ensemble names."""
        arrays = [
            Tensor(name, datatype, tensors[source].shape, tensors[source])
            for name, (source, datatype) in step.inputs.items()
        ]
        request = InferRequest(step.model, step.version, None, arrays, step.requested, dict(parameters))
        if trace is not None:
            request.trace = trace.child()
        try:
            version = self.host.resolve(step.model, step.version)
            response = await version.infer(request)
        except InferError as e:
            raise InferError(e.kind, f"in ensemble '{self.name}', {step.label()}: {e.message}") from None
        return {step.outputs[tensor.name]: tensor.data for tensor in response.outputs}

    def close(self) -> None:
        """Nothing of its own to release: the step models are models of their own."""


def _check(name: str, config: dict, steps: list[_Step], entries: list[dict], host: Host) -> None:
    """The load-time checks; fills each step's input datatypes."""
    what = f"ensemble '{name}'"
    batch = config.get("max_batch_size", 0)
    produced: dict[str, tuple[str, str]] = {
        e["name"]: (e["data_type"], "an ensemble input") for e in config["input"]
    }
    for step, entry in zip(steps, entries, strict=True):
        where = f"{what}, {step.label()}"
        if not step.model:
            raise EnsembleError(f"{what}, step {step.index} must name its model_name")
        try:
            model_config = host.resolve(step.model, step.version).config
        except InferError as e:
            raise EnsembleError(f"{where}: the model is not ready ({e.message})") from None
        inputs = {e["name"]: e for e in model_config["input"]}
        outputs = {e["name"]: e for e in model_config["output"]}
        step_batch = model_config.get("max_batch_size", 0)
        if batch and step_batch < batch:
            raise EnsembleError(
                f"{where}: the ensemble's max_batch_size {batch} is over the model's ({step_batch})"
            )
        if not batch and step_batch:
            raise EnsembleError(
                f"{where}: the ensemble has max_batch_size 0 but the model batches ({step_batch}); "
                "give the ensemble a max_batch_size"
            )
        input_map = entry.get("input_map") or {}
        if not input_map or not step.outputs:
            raise EnsembleError(f"{where} must have an input_map and an output_map")
        for model_input, tensor in input_map.items():
            if model_input not in inputs:
                raise EnsembleError(
                    f"{where}: input_map names input '{model_input}', which the model does not have "
                    f"(it has: {', '.join(inputs)})"
                )
            step.inputs[model_input] = (tensor, BY_CONFIG[inputs[model_input]["data_type"]].v2)
        missing = [n for n, e in inputs.items() if n not in input_map and not e.get("optional")]
        if missing:
            raise EnsembleError(f"{where}: input_map leaves out the model's input(s) {', '.join(missing)}")
        for model_output, tensor in step.outputs.items():
            if model_output not in outputs:
                raise EnsembleError(
                    f"{where}: output_map names output '{model_output}', which the model does not have "
                    f"(it has: {', '.join(outputs)})"
                )
            if tensor in produced:
                raise EnsembleError(f"{where}: tensor '{tensor}' is already {produced[tensor][1]}")
            produced[tensor] = (outputs[model_output]["data_type"], f"produced by {step.label()}")
    for step in steps:  # every tensor a step reads exists, with the datatype the step's model expects
        for model_input, (tensor, _) in step.inputs.items():
            if tensor not in produced:
                raise EnsembleError(
                    f"{what}, {step.label()}: input '{model_input}' reads tensor '{tensor}', which is "
                    "neither an ensemble input nor any step's output"
                )
            datatype, origin = produced[tensor]
            if BY_CONFIG[datatype].v2 != step.inputs[model_input][1]:
                raise EnsembleError(
                    f"{what}, {step.label()}: input '{model_input}' is {step.inputs[model_input][1]} but "
                    f"tensor '{tensor}' ({origin}) is {BY_CONFIG[datatype].v2}"
                )
    for entry in config["output"]:
        source = produced.get(entry["name"])
        if source is None or source[1] == "an ensemble input":
            raise EnsembleError(f"{what}: no step produces the ensemble output '{entry['name']}'")
        if source[0] != entry["data_type"]:
            raise EnsembleError(
                f"{what}: output '{entry['name']}' is {entry['data_type']} but it is {source[0]} "
                f"({source[1]})"
            )
    _check_order(what, config, steps)


def _check_order(what: str, config: dict, steps: list[_Step]) -> None:
    """Every step can run: the steps' inputs become available in some order (no cycle)."""
    available = {entry["name"] for entry in config["input"]}
    waiting = list(steps)
    while waiting:
        ready = [s for s in waiting if all(tensor in available for tensor, _ in s.inputs.values())]
        if not ready:
            names = ", ".join(step.label() for step in waiting)
            raise EnsembleError(f"{what}: {names} can never run: their inputs form a cycle")
        for step in ready:
            waiting.remove(step)
            available.update(step.outputs.values())
