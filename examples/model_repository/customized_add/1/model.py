import asyncio
import json

import numpy as np
from grps_framework.monitor.monitor import app_monitor


class Model:
    def execute(self, inputs):
        return {"c": inputs["a"] + inputs["b"]}

    async def handle_http(self, http):
        """POST {"a": 1, "b": 2} -> {"c": 3} (numbers or equal-length lists). Streamed (grps streaming
        control, e.g. ?streaming=true): one {"c": ...} line per element, as each is computed."""
        doc = http.json()
        if not isinstance(doc, dict) or "a" not in doc or "b" not in doc:
            return refuse(http, 'send {"a": ..., "b": ...}')
        a, b = np.asarray(doc["a"], dtype=np.float64), np.asarray(doc["b"], dtype=np.float64)
        if a.shape != b.shape:
            return refuse(http, "a and b differ in shape")
        app_monitor.inc("customized_add_calls", 1)  # a metric of the model's own, on the monitor page
        c = a + b
        if not http.streaming:
            http.set_response(json.dumps({"c": c.tolist()}), content_type="application/json")
            return
        for value in c.reshape(-1).tolist():
            await http.send(json.dumps({"c": value}) + "\n")
            await asyncio.sleep(0)


def refuse(http, message):
    http.set_response(json.dumps({"error": message}), 400, content_type="application/json")
