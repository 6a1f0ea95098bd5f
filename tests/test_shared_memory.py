"""server/shared_memory.py's read path in-process: an input that names a system shared-memory region is
given to the model as a numpy view of the server's mapping of the client's segment, not a copy
(docs/protocols/shared-memory.md: "An input is read as a numpy view of the mapped region: no copy"). End
to end, the address a model sees is checked against the kernel's map of the server's memory in
tests/test_e2e_shared_memory.py."""

from __future__ import annotations

import asyncio

import numpy as np
from e2e_helpers import A, B
from shm_helpers import segments

from tensorgate.codec.tensor import SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION, InferRequest, InferResponse, Tensor
from tensorgate.server.shared_memory import SharedMemory


class Recorder:
    """Stands in for a model version: keeps the input arrays it is asked to infer on."""

    executor = None  # a model on the host

    def __init__(self) -> None:
        self.inputs: dict[str, np.ndarray] = {}

    async def infer(self, request: InferRequest) -> InferResponse:
        self.inputs = {tensor.name: tensor.data for tensor in request.inputs}
        return InferResponse(request.model_name, "1", [])


def test_an_input_in_a_region_is_a_view_of_the_mapping_not_a_copy() -> None:
    manager = SharedMemory(allowed=True)
    with segments(256) as (segment,):
        segment.write(32 + 64, A)  # the region starts at 32; the input at 64 in it
        manager.register_system("r", segment.key, 32, 192)
        region = manager.regions["r"]
        parameters = {SHM_REGION: "r", SHM_BYTE_SIZE: 64, SHM_OFFSET: 64}
        request = InferRequest("m", inputs=[Tensor("INPUT0", "INT32", (16,), None, parameters)])
        model = Recorder()
        asyncio.run(manager.infer(model, request))
        seen = model.inputs["INPUT0"]
        assert seen.dtype == np.int32 and seen.shape == (16,) and seen.tolist() == A
        # the same memory as the server's mapping of the region, at the input's place in it
        mapping = np.frombuffer(region.memory, np.uint8)
        assert np.shares_memory(seen, mapping)
        assert seen.ctypes.data == mapping.ctypes.data + 64
        # and a write by the client into its segment afterwards shows through what the model holds
        segment.write(32 + 64, B)
        assert seen.tolist() == B
