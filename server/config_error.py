"""ConfigError, the one error of a model configuration: its reader (server/pbtxt.py) and its checks
(server/model_config.py) raise it, and the server catches it as a model that cannot load."""


class ConfigError(ValueError):
    """A model configuration that cannot be read or is invalid; the message names the model and the fault."""
