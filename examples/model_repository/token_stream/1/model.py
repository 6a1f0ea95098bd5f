import asyncio

import numpy as np


class Model:
    def initialize(self, config):
        self.delay = float(config["parameters"]["delay_ms"]["string_value"]) / 1000

    def execute(self, inputs):
        return {"TOKEN": np.array(inputs["TEXT"][0].split(), dtype=object)}

    async def execute_stream(self, inputs):
        for word in inputs["TEXT"][0].split():
            await asyncio.sleep(self.delay)  # stands in for the time a real model takes per token
            yield {"TOKEN": np.array([word], dtype=object)}
