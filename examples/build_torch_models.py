"""Build the example TorchScript models into examples/model_repository: `mlp` and `convnet`.

    python examples/build_torch_models.py [--repository DIR]

Weights are drawn from a seeded numpy generator (nothing is downloaded), and the script runs with
PYTHONHASHSEED=0 (TorchScript's archive depends on it), so running it again writes the same bytes.
Each model gets `config.pbtxt` and `1/model.pt`, with dynamic batching on and an instance group of
KIND_AUTO: on the GPU when CUDA is present, else on the CPU.

- mlp: FP32 INPUT0[64] -> Linear 128, ReLU, Linear 128, ReLU, Linear 10 -> FP32 OUTPUT0[10]. The config
  names are not forward's argument names: the input goes in positionally.
- convnet: FP32 image[3, 32, 32] -> two conv/ReLU/max-pool stages, global average pool, Linear 10 ->
  FP32 logits[10] and probabilities[10] (softmax). The input is named after forward's argument; the
  tuple returned maps to the outputs in config order.
"""

import os
import sys

if __name__ == "__main__" and os.environ.get("PYTHONHASHSEED") != "0":
    # The order of set iteration shows in TorchScript archives: run again with it fixed, before torch loads.
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})

import argparse  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
SEED = 20260522


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(32, 10)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.classifier(self.features(image))
        return logits, torch.softmax(logits, dim=1)


MLP_CONFIG = """\
# Built by examples/build_torch_models.py (seeded random weights).
name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { kind: KIND_AUTO count: 1 } ]
"""

CONVNET_CONFIG = """\
# Built by examples/build_torch_models.py (seeded random weights).
name: "convnet"
platform: "pytorch_libtorch"
max_batch_size: 32
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
output [
  { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] },
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { kind: KIND_AUTO count: 1 } ]
"""


def seeded(module: nn.Module, seed: int) -> nn.Module:
    """`module` with every parameter drawn uniformly in +-1/sqrt(fan_in), from numpy's seeded PCG64."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for param in module.parameters():
            fan_in = param.shape[1:].numel() if param.dim() > 1 else param.shape[0]
            bound = 1.0 / np.sqrt(fan_in)
            values = rng.uniform(-bound, bound, size=tuple(param.shape)).astype(np.float32)
            param.copy_(torch.from_numpy(values))
    return module.eval()


def build(repository: Path) -> list[Path]:
    written = []
    for name, module, config, seed in (
        ("mlp", MLP(), MLP_CONFIG, SEED),
        ("convnet", ConvNet(), CONVNET_CONFIG, SEED + 1),
    ):
        directory = repository / name
        (directory / "1").mkdir(parents=True, exist_ok=True)
        (directory / "config.pbtxt").write_text(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.10+ nudges to torch.export
            scripted = torch.jit.script(seeded(module, seed))
            torch.jit.save(scripted, str(directory / "1" / "model.pt"))
        written += [directory / "config.pbtxt", directory / "1" / "model.pt"]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repository", type=Path, default=REPOSITORY, help="default examples/model_repository"
    )
    args = parser.parse_args()
    for path in build(args.repository):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
