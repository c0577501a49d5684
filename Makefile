# qwen38gen: `make test` (what CI runs), `make run` (the main job on the embedded default),
# `make gate` (compile the lane matrix with nvcc), `make device` (GPU checks, on the H200 machine).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUTDIR ?= out

.PHONY: venv test run gate device clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build on these machines; pinning it keeps pip from pulling CUDA.
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

run: $(STAMP)
	$(VENV)/bin/qwen38gen info tiny
	$(VENV)/bin/qwen38gen generate --model tiny --prompt 1,2,3,4,5 --steps 8
	$(VENV)/bin/qwen38gen emit --model tiny --batch 16 -o $(OUTDIR)/tiny-b16.cu
	$(VENV)/bin/qwen38gen gate $(OUTDIR)/tiny-b16.cu

gate: $(STAMP)
	$(VENV)/bin/qwen38gen gate --matrix

device:
	bash scripts/device.sh

clean:
	rm -rf $(OUTDIR) .pytest_cache
