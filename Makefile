# Two commands that work on a fresh CPU-only Linux machine with Python 3.11:
#   make demo   set up .venv and SGLang 0.5.13.post1's environment, then show the padded-batch
#               bug there and the plugin's fix, next to the release in .venv (on the CPU)
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

.PHONY: venv demo test ci-releases test-gpu compat bench bench-docs lint format clean gpu-wheels server-wheels server-docs amd-compile

$(VENV)/.ready: pyproject.toml setup.py tools/compat/build_env.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PINS) packaging
	$(PY) tools/compat/build_env.py --version $(SGLANG_MAIN) --into $(VENV)
	$(PIP) install -q -e '.[test]'
	touch $@

venv: $(VENV)/.ready

# The real-server test (tests/server) needs the server's own extras; they live in a
# layer on .venv, never in .venv itself (pins: the versions SGLang 0.5.23 resolves to).
SERVER_EXTRAS := uvicorn==0.54.0 fastapi==0.165.0 uvloop==0.23.0 setproctitle==1.3.8 \
	python-multipart==0.0.34 jsonschema==4.26.0 xgrammar==0.2.7 soundfile==0.13.1
$(COMPAT)/server/layer.json: $(VENV)/.ready
	$(PY) tools/compat/build_env.py --dest $(COMPAT)/server --shared $(VENV) --layer $(SERVER_EXTRAS)

# The demo's setup (.venv, then the DEMO_RELEASE environment exactly as `make test` builds
# it) goes to a log: pip's resolver prints an "ERROR: ... requires" line for every package
# an SGLang release declares and the environments leave out on purpose (--no-deps), which
# reads as a failure on screen. A failing step prints the log's tail and stops.
DEMO_RELEASE := 0.5.13.post1
DEMO_OUT := .cache/demo
DEMO_LOG := $(DEMO_OUT)/setup.log
demo:
	@mkdir -p $(DEMO_OUT)
	@echo "make demo: setting up .venv and $(COMPAT)/$(DEMO_RELEASE) (SGLang $(DEMO_RELEASE); minutes the first time); pip's output: $(DEMO_LOG)"
	@{ $(MAKE) --no-print-directory venv && $(PY) tools/compat/releases.py build $(DEMO_RELEASE) \
		&& $(PY) tools/compat/releases.py install-wheel; } \
		> $(DEMO_LOG) 2>&1 || { tail -n 20 $(DEMO_LOG); echo "make demo: setup failed (whole log: $(DEMO_LOG))"; exit 1; }
	@$(PY) -m sglang_amd_moe demo --python $(COMPAT)/$(DEMO_RELEASE)/bin/python --out-dir $(DEMO_OUT)
	@echo "  set up by: make venv; $(PY) tools/compat/releases.py build $(DEMO_RELEASE); $(PY) tools/compat/releases.py install-wheel (log: $(DEMO_LOG))"

# Per-release SGLang environments layered on .venv (share its torch): the CI subset
# covers one release of each form (`make compat` builds and runs them all). They and the
# server layer only read .venv, so they are built side by side. The suite runs one worker
# more than there are cores, up to 4 (pytest-xdist; tests/conftest.py keeps the tests that
# share a fixture on one worker): a worker often waits on the interpreters its tests start,
# and on 2 cores three workers ran the suite in 499 s where two took 588-612 s.
WORKERS := $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
PYTEST_WORKERS := -n $(WORKERS) --durations=15
# The release environments run this package's wheel, built from the working tree and
# installed by releases.py install-wheel (tests/conftest.py repeats it, a no-op when nothing
# changed); tests/installed/ is the installed-wheel stage: the wheel in environments that
# cannot see the tree, run from outside it, as users run it.
test: venv
	$(MAKE) --no-print-directory -j2 $(COMPAT)/server/layer.json ci-releases
	$(PY) tools/compat/releases.py install-wheel
	SGLANG_AMD_MOE_TEST_SERVER_PYTHON=$(abspath $(COMPAT)/server/bin/python) $(PY) -m pytest -q $(PYTEST_WORKERS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

ci-releases: venv
	$(PY) tools/compat/releases.py build-ci

# Compile every kernel launch the package makes for gfx942, gfx950 and sm_90 (on the CPU,
# with the installed Triton) and rewrite tools/amd_compile/results.json and docs/amd.md.
# `make test` runs the same gate (tests/test_amd_compile.py) from the committed results,
# compiling only what they lack: run this after changing a kernel or its launch planning.
amd-compile: venv
	$(PY) -m tools.amd_compile sweep

# On a GPU machine with this package installed (benchmarks/device.sh does it there).
test-gpu:
	bash benchmarks/device.sh tests

# When SGLang releases: `ledger.py add` fingerprints each registry release the ledger lacks
# (pre-releases included), records its form, plan and coverage rows; commit what it changes.
# coverage_table.py write regenerates every release's coverage rows with the current reader.
compat: venv
	$(PY) tools/compat/ledger.py add
	$(PY) tools/compat/coverage_table.py write
	$(PY) tools/compat/releases.py build-all
	$(PY) tools/compat/releases.py matrix --out docs/compat.md

bench:
	bash benchmarks/device.sh bench

# Here: regenerate docs/benchmarks.md from the committed results and their notes.
bench-docs: venv
	$(PY) benchmarks/report.py --notes-file benchmarks/results/h200-notes.md

# The GPU machine has no registry: carry wheels for Python 3.12 (its interpreter). SGLang
# 0.5.13.post1 pins torch 2.11, the device's torch; the closure lists what its import needs
# beyond what the device image already has (benchmarks/device.sh installs them).
GPU_SGLANG := sglang==0.5.13.post1
GPU_CLOSURE := transformers==5.8.1 tokenizers==0.22.2 annotated_types==0.8.0 apache_tvm_ffi==0.1.9 asttokens==3.0.2 compressed_tensors==0.20.1 \
	dill==0.4.1 distro==1.9.0 executing==2.3.0 gguf==0.19.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 \
	jedi==0.20.1 jiter==0.19.0 loguru==0.7.3 matplotlib_inline==0.2.2 msgspec==0.23.0 openai==2.6.1 \
	orjson==3.13.0 parso==0.8.7 partial_json_parser==0.2.1.1.post7 pexpect==4.9.0 prompt_toolkit==3.0.53 \
	ptyprocess==0.7.0 pure_eval==0.2.4 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 pyzmq==27.3.0 \
	sniffio==1.3.1 stack_data==0.6.3 starlette==1.10.0 traitlets==5.16.1 typing_inspection==0.4.5 wcwidth==0.9.4
GPU_PLATFORMS := --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
	--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	--platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64

# sgl_kernel (sglang-kernel 0.4.3, which SGLang 0.5.13.post1 pins) travels trimmed and
# packed (benchmarks/trim_sgl_kernel.py): SGLang's topk imports it on a GPU, and the
# benchmarks time its C++ moe_align_block_size.
gpu-wheels: venv
	rm -f .whl/sglang_amd_moe-*.whl
	$(PIP) wheel -q --no-deps -w .whl .
	$(PY) benchmarks/extract_peers.py
	$(PIP) download -q --no-deps --only-binary=:all: $(GPU_PLATFORMS) -d .whl $(GPU_SGLANG) $(GPU_CLOSURE)
	$(PY) benchmarks/trim_sgl_kernel.py

# The real-server run (benchmarks/server/README.md): build this package's wheel from this
# tree and gather SGLang 0.5.13.post1's server closure for the GPU machine's Python 3.12
# into .carry-server/ (git-ignored), then on the GPU machine, with carry [".carry-server"]:
#   bash .carry-server/server/device.sh
server-wheels: venv
	$(PY) benchmarks/server/bundle.py --dest .carry-server

# Here: regenerate docs/server.md from the committed results.
server-docs:
	$(PY) benchmarks/server/report.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Rewrites files in place: ruff's formatter (pyproject.toml [tool.ruff], line length 100).
format: venv
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) $(COMPAT) .cache build dist *.egg-info
