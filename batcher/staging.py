"""Host <-> device staging: gathers the rows of a batch into one array per input, where the model runs.

A Staging turns the per-request arrays of one input into the batch array the backend executes on, and the
backend's outputs back into host arrays that the batcher splits per request (views, no copy).
`HostStaging` is the CPU path: numpy in, numpy out.
"""

from typing import Any, Protocol

import numpy as np


class Staging(Protocol):
    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        """One batch array for input `name`: `parts` concatenated along dimension 0, in order."""
        ...

    def to_host(self, outputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The backend's outputs as host numpy arrays (one device-to-host copy per output)."""
        ...


class HostStaging:
    def gather(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        return outputs
