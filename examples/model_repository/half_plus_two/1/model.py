import numpy as np


class Model:
    def execute(self, inputs):
        return {"y": (0.5 * inputs["x"] + 2.0).astype(np.float32)}
