# One entry point for people and CI. `make run` and `make test` work on a fresh machine
# with python3 (venv + pip) and network access to PyPI.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin

.PHONY: install tools run dry-run test test-fast test-cluster cluster cluster-down lint bench bench-scale bench-envelope bench-instructions fuzz clean

# Quiet, and on stderr: `make dry-run` prints only YAML on stdout, even on its first run.
$(BIN)/.installed: pyproject.toml
	@echo "Installing the package and its test extra into $(VENV) ..." >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip >&2
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]' >&2
	@touch $@

install: $(BIN)/.installed

tools: install
	PYTHON=$(BIN)/python .ci/get-k8s-tools

## Run the webhook locally, for this machine only: HTTPS on 127.0.0.1:8443 with generated
## dev certificates (certs/), Prometheus metrics on plain HTTP, 127.0.0.1:9090.
run: install
	@echo "Serving https://127.0.0.1:8443 (/mutate, /validate; this machine only; CA: certs/ca.crt)"
	@echo "Metrics on http://127.0.0.1:9090/metrics (plain HTTP). Ctrl-C stops."
	$(BIN)/retry-webhook serve --cert-dir certs --host 127.0.0.1 --port 8443

## Show what the webhook does to a shipped example, offline: the admitted object as YAML on
## stdout (nothing else), the warnings kubectl would print on stderr.
dry-run: install
	@$(BIN)/retry-webhook dry-run -f examples/job.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## The test suite CI runs: lint, then every test (real TLS server, kubectl, helm), a test
## file per CPU at once (servers still start a few at a time: testkit/servers.py).
## tests/controlplane (the real control plane's tier, make test-cluster) is left out whole,
## not only deselected: nothing of it is imported.
test: install tools lint
	PATH="$(CURDIR)/.tools/bin:$$PATH" RPW_REQUIRE_TOOLS=1 $(BIN)/pytest -q -n auto --dist loadfile -m "not cluster" --ignore=tests/controlplane

## A real control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager,
## kube-scheduler built from upstream with Go; fake Nodes and a played kubelet) with our
## webhook and controller served beside it; writes .cluster/kubeconfig (docs/CLUSTER.md).
cluster: install tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/python -m testkit.controlplane up

cluster-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m testkit.controlplane down; fi

## The cluster tier: every test against the real control plane (builds it first if needed).
test-cluster: install tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" RPW_REQUIRE_TOOLS=1 $(BIN)/pytest -q -m cluster tests/controlplane

## A contributor's loop: the tests that start no server, run no program and wait on no
## clock, with fewer hypothesis examples, on every CPU (docs/DEVELOPMENT.md, "How it
## is tested").
test-fast: install tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" HYPOTHESIS_PROFILE=dev $(BIN)/pytest -q -n auto -m "not slow and not cluster" --ignore=tests/controlplane

## Benchmarks (not part of `make test`), the controller's cost included: needs wrk and hey
## (apt-get install wrk hey); the gunicorn floor is installed from the `bench` extra.
bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks.run

## The scale envelope (docs/SCALE.md): each line's benchmark once, results in
## benchmarks/results/scale.{json,md}, checked against benchmarks/envelope.yaml (fails when a
## value is outside its threshold). About 10 minutes on 2 cores; needs wrk.
bench-scale: install
	$(BIN)/python -m benchmarks.envelope

## The envelope anew: each benchmark RUNS times (5), thresholds at mean +/- 20%, written to
## benchmarks/envelope.yaml (about 45 minutes on 2 cores).
RUNS ?= 5
bench-envelope: install
	$(BIN)/python -m benchmarks.envelope --runs $(RUNS) --write

## Instructions a request, webhook against floor, counted by callgrind (deterministic; about
## 10 minutes): needs valgrind (apt-get install valgrind).
bench-instructions: install
	$(BIN)/python -m benchmarks.instructions

## Coverage-guided fuzzing of the review decoder and data path (bounded; grows fuzz/corpus).
FUZZ_SECONDS ?= 60
fuzz: install
	$(BIN)/python -m pip install -q atheris
	$(BIN)/python fuzz/fuzz_review.py fuzz/corpus/review -max_total_time=$(FUZZ_SECONDS) -max_len=8192
	# Keep the committed corpus minimal: merge what was found into a fresh directory.
	rm -rf .fuzz-merge && mkdir .fuzz-merge
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python fuzz/fuzz_review.py -merge=1 .fuzz-merge fuzz/corpus/review
	rm -rf fuzz/corpus/review && mv .fuzz-merge fuzz/corpus/review

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache build
