"""Shared fixtures and builders: tiny models built locally (no hub), and the tests' tiers.

Tiers. Every test is in exactly one of three, a marker `collection` adds from the table `TIERS` below (one
line per test module, so a reviewer sees every module's tier in one place; a module missing from it fails
collection, so a new test file must choose):

- `unit`: pure functions and small objects in this process: no model run, no other process, no server;
- `integration`: Hone's parts run in this process (a tiny model trained, a run through `main`/`train`,
  threads, a signal the run raises in itself at a chosen step);
- `system`: other processes and what lives in them: subprocesses, learner ranks, Ray, the code sandbox,
  servers (HTTP, MCP, OpenEnv, the agent endpoint), async vector environments, a kill from outside.

A module's tier is its heaviest test's, unless a test says its own (`@pytest.mark.system` on the one test
of an integration module that starts a subprocess): then that test has that tier, and no other. Select
with `-m`: `pytest -m unit` (seconds), `-m "unit or integration"`; plain `pytest`/`make test` selects
all three tiers, as before (and not `slow`, `vllm`, `ray_cluster`). `-m` replaces the default `-m` of
pyproject's addopts: add `and not slow and not vllm and not ray_cluster` to keep those out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from hone.models import build_tiny_model
from hone.verifiers import sandbox

LETTERS = "abcdefghijklmnopqrstuvwxyz"

TIER_NAMES = ("unit", "integration", "system")

# Each test module's tier, by its path under tests/ (see the docstring). Sorted; one line a module.
TIERS: dict[str, str] = {
    "sdk/test_openai_agents.py": "system",  # the agent endpoint's server, an SDK program on it
    "test_advantage_args.py": "integration",
    "test_agent_endpoint.py": "system",  # the endpoint's server, agent programs in subprocesses
    "test_aio.py": "unit",
    "test_algorithms.py": "unit",
    "test_algorithms_control.py": "unit",
    "test_algorithms_offline.py": "unit",
    "test_algorithms_properties.py": "unit",
    "test_algorithms_step_credit.py": "integration",
    "test_algorithms_turns.py": "unit",
    "test_algorithms_value.py": "unit",
    "test_architecture_doc.py": "unit",
    "test_async.py": "system",  # killed_and_resumed: CLI subprocesses, SIGKILL
    "test_backends.py": "unit",
    "test_batcher.py": "unit",
    "test_checkpoint.py": "integration",
    "test_cli.py": "system",  # `hone` in subprocesses, SIGINT
    "test_cli_flags.py": "unit",  # `main` in this process, stopping at the command line or the recipe
    "test_config.py": "unit",
    "test_control.py": "integration",
    "test_control_backends.py": "system",  # gymnasium's async vector env: worker processes
    "test_control_images.py": "integration",
    "test_control_marl.py": "integration",
    "test_control_offline.py": "integration",
    "test_control_offpolicy.py": "integration",
    "test_control_resume.py": "integration",
    "test_critic.py": "system",  # killed_and_resumed
    "test_curriculum.py": "system",  # killed_and_resumed
    "test_data.py": "unit",
    "test_data_images.py": "unit",
    "test_data_tasks.py": "unit",
    "test_distill.py": "integration",
    "test_distributed.py": "system",  # ranks in processes (gloo)
    "test_docs.py": "system",  # the docs' scripts and mkdocs in subprocesses
    "test_dpo.py": "integration",
    "test_engines.py": "integration",
    "test_envs.py": "unit",
    "test_envs_parser.py": "unit",
    "test_envs_tools.py": "system",  # the code sandbox
    "test_first_hour.py": "integration",
    "test_gym.py": "integration",
    "test_layering.py": "unit",
    "test_learner_ranks.py": "system",  # learner ranks launched as processes
    "test_lifecycle.py": "unit",
    "test_mcp.py": "system",  # MCP servers in subprocesses
    "test_models.py": "integration",
    "test_models_hub.py": "system",  # a local socket as the hub, a run in a subprocess
    "test_models_packaged.py": "integration",
    "test_multiturn.py": "integration",
    "test_offpolicy.py": "unit",
    "test_openenv.py": "system",  # OpenEnv servers in subprocesses
    "test_openenv_mcp.py": "system",  # an OpenEnv MCP server (uvicorn)
    "test_optim.py": "integration",
    "test_orchestration.py": "system",  # killed_and_resumed
    "test_pairs.py": "integration",
    "test_plot.py": "integration",
    "test_policy.py": "integration",
    "test_preference_data.py": "unit",
    "test_preference_losses.py": "unit",
    "test_presets.py": "unit",
    "test_progress.py": "unit",
    "test_prompts.py": "integration",
    "test_ray.py": "system",  # a Ray cluster
    "test_reward_model_training.py": "integration",
    "test_reward_recipes.py": "unit",
    "test_rewards.py": "unit",
    "test_rewards_code.py": "system",  # the code sandbox
    "test_rewards_judge.py": "system",  # a judge's HTTP server
    "test_rewards_math.py": "unit",
    "test_rewards_model.py": "integration",
    "test_rewards_shaping.py": "unit",
    "test_run_families.py": "system",  # runs in subprocesses, SIGTERM from outside
    "test_run_preference_families.py": "integration",
    "test_run_summary.py": "integration",
    "test_sampler.py": "integration",
    "test_sampling.py": "system",  # killed_and_resumed, a Ray back-end
    "test_sandbox.py": "system",  # the code sandbox's process trees
    "test_sft.py": "integration",
    "test_staleness.py": "integration",
    "test_structure.py": "unit",
    "test_tiers.py": "unit",
    "test_tinker.py": "system",  # `hone serve tinker` (a thread, and a subprocess) driven by the tinker SDK
    "test_tinker_cookbook.py": "system",  # tinker-cookbook's RL loop on `hone serve tinker` (threads)
    "test_tinker_losses.py": "unit",  # the served losses on hand-computed values
    "test_tinker_rl.py": "system",  # an RL loop on `hone serve tinker` (threads), driven by the tinker SDK
    "test_tracking.py": "unit",
    "test_trainer.py": "integration",
    "test_trainer_offpolicy.py": "integration",
    "test_trl_advantages.py": "unit",
    "test_trl_datasets.py": "integration",  # one tiny-model run on a prompt-only dataset
    "test_trl_env.py": "unit",  # its episode and its tiny-model run: marked integration
    "test_trl_rewards.py": "integration",  # one short run with a TRL-contract reward
    "test_trl_trainer.py": "unit",  # the runs are marked integration
    "test_verifiers_env.py": "integration",
    "test_verifiers_heldout.py": "integration",
    "test_verify_weights.py": "integration",
    "test_vision.py": "integration",
    "test_vision_agents.py": "integration",
    "test_vision_tasks.py": "unit",
    "test_vllm.py": "system",  # the vLLM engine in its own process
    "test_vllm_vision.py": "system",  # the vLLM engine in its own process
    "test_weights.py": "integration",
}


def tier_of(module: str, own: list[str]) -> str:
    """The tier of a test in `module` (its path under tests/) whose own tier markers are `own`: its own if
    it has one, else its module's from `TIERS`. Raises `pytest.UsageError`, which names the fix, on a
    module missing from `TIERS` or on a test with two tiers."""
    if len(own) > 1:
        raise pytest.UsageError(f"{module}: a test has tiers {own}; give it one of {', '.join(TIER_NAMES)}")
    if own:
        return own[0]
    if module not in TIERS:
        raise pytest.UsageError(
            f"{module} has no tier: add it to TIERS in tests/conftest.py, as one of {', '.join(TIER_NAMES)} "
            "(the docstring there says which)"
        )
    return TIERS[module]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (`tier_of`), before `-m` selects: `-m unit` sees the mark."""
    tests = Path(__file__).parent
    for item in items:
        inside = item.path.is_relative_to(tests)
        module = item.path.relative_to(tests).as_posix() if inside else item.path.name
        own = [m.name for m in item.iter_markers() if m.name in TIER_NAMES]
        if not own:
            item.add_marker(getattr(pytest.mark, tier_of(module, own)))
        tiers = [m.name for m in item.iter_markers() if m.name in TIER_NAMES]
        if len(tiers) != 1:  # a class or module mark beside the test's own
            raise pytest.UsageError(f"{item.nodeid}: tiers {tiers}; a test has exactly one")


def sandbox_unavailable(isolation: sandbox.Isolation = "auto") -> str | None:
    """Why the code sandbox cannot run here in `isolation` mode (what to install), or None."""
    try:
        sandbox._interpreter(None, sandbox.resolve_isolation(isolation))
    except RuntimeError as e:
        return str(e)
    return None


# For tests that run programs in the sandbox: skipped, with what to install, on a machine without one.
needs_sandbox = pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))


def tiny_qwen2(*, train_mode: bool = False, **config: Any) -> transformers.Qwen2ForCausalLM:
    """A random 2-layer Qwen2 over a 32-token vocabulary; `config` overrides Qwen2Config fields.

    Weights come from torch's global RNG, so seed it first. In eval mode unless `train_mode`.
    """
    defaults: dict[str, Any] = {
        "vocab_size": 32,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "tie_word_embeddings": True,
    }
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**(defaults | config)))
    return model if train_mode else model.eval()


def char_tokenizer(
    chars: str = LETTERS + "=>", unk_token: str | None = "<unk>"
) -> transformers.PreTrainedTokenizerFast:
    """One token per character: <pad>=0, <eos>=1, then `unk_token` (if any), then `chars` in order."""
    specials = ["<pad>", "<eos>"] + ([unk_token] if unk_token is not None else [])
    vocab = {s: i for i, s in enumerate(specials)} | {c: i + len(specials) for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    unk = {"unk_token": unk_token} if unk_token is not None else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", **unk
    )


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~100k-parameter Qwen2 with the byte-level tokenizer, saved as an ordinary HF directory."""
    return build_tiny_model(
        tmp_path_factory.mktemp("micro-model"), hidden_size=64, num_layers=2, num_heads=2, head_dim=32
    )
