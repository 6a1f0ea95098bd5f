"""The server's name in its v2 server metadata: `--id` (Triton's server id), set by server/cli.py at startup
in the engine and in each worker, read by the REST and gRPC server metadata answers."""

name = "tensorgate"
