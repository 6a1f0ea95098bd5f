"""Triton's model config helpers for python models (part of `pb_utils`, server/backends/pb_utils.py):
the ModelConfig `auto_complete_config` completes, and the lookups of an input's or output's config.
"""


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((entry for entry in model_config.get("input", ()) if entry["name"] == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((entry for entry in model_config.get("output", ()) if entry["name"] == name), None)


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives: the config to complete."""

    def __init__(self, config: dict) -> None:
        self._config = config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._config.get("max_batch_size", 0)
        if current and current != max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but auto-complete wants {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy: dict) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy)

    def add_input(self, input: dict) -> None:  # noqa: A002 (Triton's argument name)
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, kind: str, entry: dict) -> None:
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"add_{kind} takes a dict with at least 'name'")
        tensors = self._config.setdefault(kind, [])
        for existing in tensors:
            if existing["name"] != entry["name"]:
                continue
            for key, value in entry.items():  # the config given wins; a disagreement is an error
                if key in existing and existing[key] != value:
                    raise ValueError(
                        f"{kind} '{entry['name']}': the configuration has {key} {existing[key]!r}, "
                        f"auto-complete wants {value!r}"
                    )
                existing.setdefault(key, value)
            return
        tensors.append(dict(entry))
