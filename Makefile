# The README's commands. `make demo` runs the main job, `make test` the test suite.
PY      := .venv/bin/python
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?= -n 2

.PHONY: setup test demo lint bench clean

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve pulls a multi-GB CUDA build.
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: .venv/.installed

test: setup
	$(PY) -m ruff check hone tests bench
	$(PY) -m pytest $(PYTEST_ARGS)

# A fresh run directory each time, so `make demo` can be run again (runs/ refuses to overwrite a run).
demo: setup
	.venv/bin/hone train run.name=demo-$$(date +%Y%m%d-%H%M%S)

bench: setup
	$(PY) bench/sampler_bench.py
	$(PY) bench/reward_bench.py

clean:
	rm -rf .venv runs .pytest_cache
