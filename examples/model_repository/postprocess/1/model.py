import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            if not np.isfinite(logits).all():
                error = pb_utils.TritonError("logits are not finite", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probabilities = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
            winner = logits.argmax(axis=-1).astype(np.int64).reshape(-1, 1)
            outputs = [pb_utils.Tensor("CLASS", winner), pb_utils.Tensor("PROBABILITIES", probabilities)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
