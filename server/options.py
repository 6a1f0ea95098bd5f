"""`tensorgate serve`'s command line: the parser, composed of each topic's flags (options_*.py)."""

import argparse

from tensorgate.server.options_models import add_model_flags, add_response_cache_flags
from tensorgate.server.options_observability import add_observability_flags
from tensorgate.server.options_ports import add_grps_flags, add_port_flags
from tensorgate.server.options_security import add_security_flags
from tensorgate.server.options_transport import add_transport_flags
from tensorgate.server.options_workers import add_worker_flags


def build_parser() -> argparse.ArgumentParser:
    """`tensorgate serve`'s arguments (server/cli.py dispatches the subcommands). The tables of
    docs/getting-started/cli.md list their flags in this order, whichever topic adds them."""
    serve = argparse.ArgumentParser(prog="tensorgate serve", description="Serve a model repository.")
    add_model_flags(serve)
    add_port_flags(serve)
    add_grps_flags(serve)
    add_transport_flags(serve)
    add_observability_flags(serve)
    add_security_flags(serve)
    add_response_cache_flags(serve)  # after --allow-client-shm: the CLI reference's row before it
    add_worker_flags(serve)
    return serve
