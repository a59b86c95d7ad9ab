# Two commands that work on a fresh CPU-only Linux machine with Python 3.11:
#   make demo   set up .venv, then run the audit and the padded-batch check on the CPU
#   make test   set up .venv (and the per-release SGLang environments), then run the suite
# Everything is installed from the package registries by these rules.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The SGLang release installed in .venv itself (the newest we test; form `fixed`).
SGLANG_MAIN := 0.5.23
# torch and torchvision as one pair; triton comes with torch. CPU tests run Triton
# kernels through its interpreter (TRITON_INTERPRET=1).
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
COMPAT := .compat

.PHONY: venv demo test test-gpu compat bench lint clean compat-envs

$(VENV)/.ready: pyproject.toml tests/compat/build_env.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PINS) packaging
	$(PY) tests/compat/build_env.py --version $(SGLANG_MAIN) --into $(VENV)
	$(PIP) install -q -e '.[test]'
	touch $@

venv: $(VENV)/.ready

# Per-release SGLang environments layered on .venv (share its torch). The CI subset
# covers one release of each form; `make compat` builds and runs them all.
$(COMPAT)/%/sglang_release.json: $(VENV)/.ready tests/compat/releases.py
	$(PY) tests/compat/releases.py build $*

demo: venv
	$(PY) -m sglang_amd_moe demo

test: venv
	$(PY) tests/compat/releases.py build-ci
	$(PY) -m pytest -q
	$(VENV)/bin/ruff check .

test-gpu: venv
	$(PY) -m pytest -q tests/gpu

compat: venv
	$(PY) tests/compat/releases.py build-all
	$(PY) tests/compat/releases.py matrix --out docs/compat.md

bench: venv
	$(PY) benchmarks/run.py

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(COMPAT) .cache build dist *.egg-info
