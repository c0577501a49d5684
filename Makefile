# qwen38gen: `make test` (what CI runs), `make run` (the main job on the embedded default),
# `make gate` (compile the lane matrix with nvcc), `make device` (GPU checks, on the H200 machine).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUTDIR ?= out

.PHONY: venv test run gate device device-prep clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build on these machines; pinning it keeps pip from pulling CUDA.
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q || { rc=$$?; [ $$rc -eq 5 ] && echo "pytest collected no tests: failing"; exit $$rc; }

run: $(STAMP)
	$(VENV)/bin/qwen38gen info tiny
	$(VENV)/bin/qwen38gen generate --model tiny --prompt 1,2,3,4,5 --steps 8
	$(VENV)/bin/qwen38gen emit --model tiny --batch 16 -o $(OUTDIR)/tiny-b16.cu
	$(VENV)/bin/qwen38gen gate $(OUTDIR)/tiny-b16.cu
	$(VENV)/bin/qwen38gen check --batch 16

gate: $(STAMP)
	$(VENV)/bin/qwen38gen gate --matrix

# Copy PyCUDA's wheels next to the checkout (git-ignored .gpu/) so a device run can carry them.
device-prep:
	mkdir -p .gpu && cp ../shared/device/*.whl .gpu/

# Run on the GPU machine: PyCUDA install, GPU tests, summary table.
device:
	bash scripts/device.sh

clean:
	rm -rf $(OUTDIR) .pytest_cache
