"""The hypercorn settings every HTTP listener of ours (and bench's bare ceiling app) runs with."""

import logging

from hypercorn.config import Config


def hypercorn_config(host: str, port: int, *, log_level: str = "info") -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.keep_alive_max_requests = 2**31  # hypercorn's default of 1000 makes load tests reconnect
    config.keep_alive_timeout = 75
    config.h2_max_concurrent_streams = 256
    config.h11_max_incomplete_size = 64 * 1024  # request line + headers
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through the process's own logging setup
    config.loglevel = log_level.upper()
    config.graceful_timeout = 30
    return config
