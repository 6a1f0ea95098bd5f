"""`tensorgate perf`: a load generator for any KServe v2 / Triton, TF Serving or grps server.

- model.py: the model as the server describes it, and the input data;
- protocols.py: each protocol's request bytes, and how answers are checked;
- clients.py: the connections (HTTP/1.1, HTTP/2, gRPC on raw frames);
- load.py: one process's load, closed or open loop, in windows;
- hdr.py: the latency histogram;
- run.py: levels, windows, stability, load processes, the server's statistics;
- report.py and cli.py: what it prints and writes, and its command line.
"""
