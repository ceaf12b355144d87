# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Both install what they need into a project virtual environment (.venv) first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install demo up test lint bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[cpu,dev]'
	# PyPI's torchvision/torchaudio builds fail to load beside torch 2.13.0+cpu (design.md)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

demo: install
	$(VENV)/bin/jitserve demo

up: install
	$(VENV)/bin/jitserve up

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

bench: install
	$(PY) bench/core.py
