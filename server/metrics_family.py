"""What the metrics collectors share: a prometheus_client family made from its samples, and the labels
each model version's series carry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from tensorgate.server.model import ModelVersion


def build_family(
    name: str, documentation: str, kind: str, samples: Iterable[tuple[dict[str, str], float]]
) -> Metric:
    """A family of `kind` whose samples are all named `name`."""
    family = Metric(name, documentation, kind)
    for labels, value in samples:
        family.add_sample(name, labels, value)
    return family


def version_labels(version: ModelVersion) -> dict[str, str]:
    """A model version's series' labels: `model` and `version`."""
    return {"model": version.name, "version": version.version_str}
