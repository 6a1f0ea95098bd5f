"""A running total per sequence: the state lives in the model, keyed by the request's correlation ID.

Each request of a sequence adds its INPUT to its sequence's total and answers the total. The START flag
resets the total and the END flag forgets it (a sequence the server releases for idling is never seen
again; a real model would also bound what it keeps).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if ready.all():  # an empty batch slot has READY false: nothing to add to
                key, flags = request.correlation_id(), request.flags()
                total = value + (
                    0
                    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                    else self.totals.get(key, 0)
                )
                if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                    self.totals.pop(key, None)
                else:
                    self.totals[key] = total
            else:
                total = np.zeros_like(value)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total.astype(np.int64))]))
        return responses
