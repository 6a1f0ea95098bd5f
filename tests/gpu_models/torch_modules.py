"""TorchScript modules served by tests/test_e2e_gpu.py (scripted there, so their source lives in a file)."""

import numpy as np
import torch
from torch import nn


class LinearWithDevice(nn.Module):
    """`y` = x W^T + b with fixed weights (seeded), and `device`: per row, the CUDA index of the device
    forward ran on (`Tensor.get_device()`: -1 on the CPU), so a test can tell where the server ran it."""

    def __init__(self, features_in: int, features_out: int, seed: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)
        rng = np.random.default_rng(seed)
        bound = features_in**-0.5
        weight = rng.uniform(-bound, bound, (features_out, features_in)).astype(np.float32)
        bias = rng.uniform(-1, 1, features_out).astype(np.float32)
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(weight))
            self.linear.bias.copy_(torch.from_numpy(bias))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = torch.full([x.size(0), 1], x.get_device(), dtype=torch.int64, device=x.device)
        return self.linear(x), device


def save_linear(path: str, features_in: int, features_out: int, seed: int) -> None:
    """LinearWithDevice, scripted and saved as TorchScript at `path`."""
    torch.jit.save(torch.jit.script(LinearWithDevice(features_in, features_out, seed).eval()), path)
