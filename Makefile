# Quick start: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REPO ?= examples/model_repository
ARGS ?=

.PHONY: serve test compile docs browser peers lint format bench fuzz proto clean

# The editable install leaves the compiling to `compile` (in place, beside the sources).
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	TENSORGATE_COMPILE=0 $(BIN)/python -m pip install -q -e '.[build,test,torch,onnx,otel,plot,docs,cloud]'
	touch $(STAMP)

# The request path compiled with Cython (setup.py; the modules: pyproject.toml [tool.tensorgate]), each
# beside its .py: ~2 minutes on 2 cores the first time, then only what changed. TENSORGATE_COMPILE=0
# removes the build instead, for a pure-Python tree.
compile: $(STAMP)
ifeq ($(TENSORGATE_COMPILE),0)
	find server codec batcher -name '*.so' -delete
else
	$(BIN)/python setup.py -q build_ext --inplace
endif

serve: compile
	$(BIN)/tensorgate serve --model-repository $(REPO) $(ARGS)

# The whole suite on our transport, then the HTTP end-to-end tests again on the reference transport
# (hypercorn): a difference between the two is a failing test; then the end-to-end tests again with
# `--workers 2` (front-end workers beside the engine). Tests marked `ours` cover our transport's own
# limits (counted per process) and are not run in those two passes.
# Neither pass repeats what runs behind the transport alone (the backends, model processes, warmup, the
# repositories and their config fields, the rate limiter and ragged batches, the metrics), nor the gRPC
# port's connection management (our transport in both).
BACKEND_ONLY = python_process triton_python triton_python_api triton_examples pytorch gpu warmup \
  cloud_repository exit_on_error config_fields rate_limiter ragged_optional metrics_triton metrics_dashboards \
  grpc_connection
HTTP_E2E = $(filter-out %grpc.py %grpc_stream.py $(BACKEND_ONLY:%=tests/test_e2e_%.py),$(wildcard tests/test_e2e_*.py))
# With --workers 2 --engine-front-end false: every protocol and API through a worker, python models in
# processes of their own included; not the transport's own parsing (the same code in every process), nor
# what runs behind the engine alone (the repository's load flags; the monitor page, forwarded whole as every
# other route is).
ENGINE_ONLY = malformed security scale_out repository_flags monitor \
  $(filter-out python_process triton_python triton_python_api metrics_triton,$(BACKEND_ONLY))
WORKERS_E2E = $(filter-out $(ENGINE_ONLY:%=tests/test_e2e_%.py),$(wildcard tests/test_e2e_*.py))

# Then the unit tests and the v2 end-to-end tests once more on the pure-Python sources
# (TENSORGATE_PURE_PYTHON=1: the compiled modules' .py files, in the tests and in the servers they start),
# less the tests of what no compiled module changes: the perf tool, the soak, the wheel, the docs, the
# deployment files, the tritonserver CLI, the GPU guard and the proto generator (2.5 of the pass's 5.7
# minutes).
NOT_COMPILED = perf soak wheel docs deploy deploy_kserve tritonserver_cli gpu_guard proto
UNIT = $(filter-out tests/test_e2e_% $(NOT_COMPILED:%=tests/test_%.py),$(wildcard tests/test_*.py))
PURE_E2E = tests/test_e2e_v2_http.py tests/test_e2e_v2_grpc.py tests/test_e2e_v2_errors.py tests/test_e2e_malformed.py

# Every pass requires the outside peers and optional packages its tests need (TENSORGATE_REQUIRE_PEERS=1:
# missing, they fail instead of skipping; only the GPU tests skip without a GPU), and -rs prints the
# reason of every skip.
test: export TENSORGATE_REQUIRE_PEERS = 1
test: lint browser peers compile
	TENSORGATE_REQUIRE_FUZZ=1 TENSORGATE_REQUIRE_COMPILED=$(if $(filter 0,$(TENSORGATE_COMPILE)),0,1) \
	  $(BIN)/python -m pytest -q -rs $(ARGS)
	TENSORGATE_TEST_HTTP_SERVER=hypercorn $(BIN)/python -m pytest -q -rs -m "not ours" $(HTTP_E2E) $(ARGS)
	TENSORGATE_TEST_WORKERS=2 $(BIN)/python -m pytest -q -rs -m "not ours" $(WORKERS_E2E) $(ARGS)
	TENSORGATE_PURE_PYTHON=1 $(BIN)/python -m pytest -q -rs $(UNIT) $(PURE_E2E) $(ARGS) \
	  --deselect tests/test_compiled.py::test_every_listed_module_runs_compiled_when_built

# The monitor page's browser test drives Debian's chromium through chromium-driver. Installed here where
# apt-get can (root, a Debian machine); otherwise that one test fails under make test, and says why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { echo "installing chromium and chromium-driver (apt-get) for the monitor page's browser test"; \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	      chromium chromium-driver >/dev/null; } || \
	    echo "could not install chromium: tests/test_e2e_monitor.py's browser test will fail"; }

# The outside peers the real-client tests and the bench drive the server with: h2load and wrk (Debian's
# nghttp2-client and wrk) and Triton's perf_analyzer (the tritonclient 2.51.0 wheel in .peers/, with
# Debian's libb64-0d; bench/perf_analyzer.py), and curl and openssl. Installed where apt-get and pip can;
# otherwise the tests that need them fail under make test (skip elsewhere), and say why.
peers: $(STAMP)
	@command -v h2load >/dev/null && command -v wrk >/dev/null && command -v curl >/dev/null && \
	  command -v openssl >/dev/null && test -e /usr/lib/x86_64-linux-gnu/libb64.so.0d || \
	  { echo "installing nghttp2-client, wrk, curl, openssl and libb64-0d (apt-get) for the real-client tests"; \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	      nghttp2-client wrk curl openssl libb64-0d >/dev/null; } || echo "could not install them: those tests will fail"; }
	@$(BIN)/python -m bench.perf_analyzer --install || echo "could not install perf_analyzer: its tests will fail"

# mypy checks the compiled modules' types (the list: pyproject.toml [tool.tensorgate] compiled), by their
# installed names: from a tree of links, build/mypy/tensorgate/<folder> -> the folder (mypy does not run the
# editable install's import hook, so `tensorgate.server...` would not resolve from the folders themselves).
COMPILED_SOURCES = $(BIN)/python -c 'import tomllib; print(*("tensorgate/" + n.replace(".", "/") + ".py" for n in \
  tomllib.load(open("pyproject.toml", "rb"))["tool"]["tensorgate"]["compiled"]))'
MYPY_TREE := build/mypy

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)/tensorgate
	for package in server codec batcher proto perf; do ln -s ../../../$$package $(MYPY_TREE)/tensorgate/$$package; done
	files="$$($(COMPILED_SOURCES))" && cd $(MYPY_TREE) && \
	  MYPYPATH=. ../../$(BIN)/python -m mypy --config-file ../../pyproject.toml --explicit-package-bases $$files

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Starts servers on ephemeral ports, drives them, and prints the side-by-side tables (see bench/README.md):
# the transport bench (wrk, h2load, curl: apt-get install wrk nghttp2-client curl), the gRPC bench
# (h2load), the ensemble bench (wrk), then the harness.
bench: peers
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench.transport $(ARGS)
	$(BIN)/python -m bench.perf_analyzer $(ARGS)
	$(BIN)/python -m bench.grpc_bench $(ARGS)
	$(BIN)/python -m bench.ensemble $(ARGS)
	$(BIN)/python -m bench.workers $(ARGS)
	$(BIN)/python -m bench $(ARGS)

# Every parser's fuzz target under atheris, FUZZ_SECONDS each (see fuzz/__main__.py; findings land in
# fuzz/crashes/). `make test` runs each for a few seconds.
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(BIN)/python -m fuzz --seconds $(FUZZ_SECONDS) $(ARGS)

# The documentation site (mkdocs.yml, docs/) into site/: the CLI reference regenerated from the argument
# parsers first (docs/hooks/cli_reference.py; commit the page). `make test` builds it with --strict
# (tests/test_docs.py): a broken link, a missing page or a dead anchor fails the suite.
docs: $(STAMP)
	$(BIN)/python docs/hooks/cli_reference.py
	$(BIN)/python docs/hooks/triton_flags.py
	$(BIN)/mkdocs build --strict

# Regenerates the betterproto2 modules in proto/ from proto/*.proto (commit the result; a test checks it).
proto: $(STAMP)
	$(BIN)/python -m tensorgate.proto.generate

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info site
	find server codec batcher -name '*.so' -delete
