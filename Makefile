# qwen38gen: `make test` (the tests but the slow ones, under about 3 minutes on 2 cores),
# `make test-slow` (the slow ones), `make run` (the main job end to end on the tiny preset, on
# CPU), `make gate` (compile the lane matrix with nvcc), `make install-check` (a wheel in a fresh
# venv runs emit, gate and check from outside the checkout), `make device` (GPU checks, on the
# H200 machine).
# CI (.ci/run) runs test, test-slow, gate and install-check.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUTDIR ?= out

.PHONY: venv test test-slow install-check run gate device device-prep device-commit clean

$(STAMP): setup.cfg setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build on these machines; pinning it keeps pip from pulling CUDA.
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# pytest's exit code 5 means no test ran (none collected, or every one deselected): a failure.
NO_TESTS = { rc=$$?; [ $$rc -eq 5 ] && echo "pytest ran no tests: failing"; exit $$rc; }

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" || $(NO_TESTS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow || $(NO_TESTS)

# Not editable, not this venv: the wheel of the checkout's files in a fresh venv of $(PYTHON),
# its dependencies from the package index.
install-check:
	.ci/install-check $(PYTHON)

# The main job end to end on the tiny preset, on a CPU machine (nvcc for the gate, no GPU): emit
# the B = 2 program, gate it, run the committed requests through its schedule executed in numpy
# (--backend emu: not the CUDA kernels), and check that every request batched gets the tokens it
# gets alone (check --serve: on the GPU where there is one, else on the emulated schedule).
RUN_LANE := --batch 2 --pt 4
run: $(STAMP)
	$(VENV)/bin/qwen38gen info tiny
	$(VENV)/bin/qwen38gen emit --model tiny $(RUN_LANE) -o $(OUTDIR)/tiny-b2.cu
	$(VENV)/bin/qwen38gen gate $(OUTDIR)/tiny-b2.cu
	$(VENV)/bin/qwen38gen run --backend emu --model tiny $(RUN_LANE) \
	  --prompts tests/data/run_requests.jsonl --output $(OUTDIR)/run-tiny-b2.jsonl \
	  --json $(OUTDIR)/run-tiny-b2.json
	cat $(OUTDIR)/run-tiny-b2.jsonl
	$(VENV)/bin/qwen38gen check --serve $(RUN_LANE)

gate: $(STAMP)
	$(VENV)/bin/qwen38gen gate --matrix

# Before a device run, on the CPU machine, from a clean tree (commit first): PyCUDA's wheels into
# the git-ignored .gpu/ (from WHEELS_FROM), the commit's hash (.gpu/COMMIT: the device log's first
# line) and index (.gpu/FILES: the device checks the tree it got against it), and every program
# that `VERIFY=... bash scripts/device.sh` loads compiled into .cache/q38 (no nvcc there). Then
# the device run carries [".gpu", ".cache"]; the size of what travels is printed (limit 64 MiB).
WHEELS_FROM ?= ../shared/device
# bench --peers' Triton peers (GemLite's int4 GEMMs, fla's gated delta rule), pure-Python wheels
# built here into .gpu/peers (the GPU machine has torch and Triton, no network); without them
# those two peers report that they could not be imported.
PEER_WHEELS ?= gemlite==0.6.0.post2 fla-core==0.6.0 einops==0.8.1

device-prep:
	@test -z "$$(git status --porcelain)" || { git status --short; echo "error: the tree has \
	uncommitted or untracked files; commit them first (the device log names the commit it ran)"; \
	exit 2; }
	rm -rf .gpu .cache/q38
	mkdir -p .gpu && cp $(WHEELS_FROM)/*.whl .gpu/
	$(PY) -m pip wheel -q --no-deps -w .gpu/peers $(PEER_WHEELS) 2>/dev/null || echo "note: \
	the peer wheels ($(PEER_WHEELS)) could not be built; bench --peers will say so for them"
	git ls-files -s > .gpu/FILES
	git rev-parse HEAD > .gpu/COMMIT
	QWEN38_CACHE=.cache/q38 $(PY) scripts/precompile.py --verify
	@du -sh .gpu .cache
	@git ls-files -z | xargs -0 du -cb .gpu .cache | tail -1 | \
	  awk '{printf "travels: %.1f MiB (tracked files, .gpu, .cache; limit 64 MiB)\n", $$1 / 1048576}'

# Run on the GPU machine: PyCUDA install, GPU tests, summary table (VERIFY=tests|rest|all: the
# whole verification, scripts/device.sh's header).
device:
	bash scripts/device.sh

# After the device run, on the CPU machine: the verify logs, bench json, png and text of the
# calls' files_at folders under bench/ as version V, replacing the previous ones (staged, not
# committed): make device-commit OUT="DIR_TESTS DIR_REST" V=v23
V ?= v23
device-commit:
	@test -n "$(OUT)" || { echo "error: give OUT=\"DIR...\": the device calls' files_at folders"; exit 2; }
	V=$(V) bash scripts/device_commit.sh $(OUT)

clean:
	rm -rf $(OUTDIR) .pytest_cache
