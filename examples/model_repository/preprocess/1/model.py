import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "FEATURES")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            features = (raw.astype(self.dtype) / 127.5 - 1.0).astype(self.dtype)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("FEATURES", features)]))
        return responses
