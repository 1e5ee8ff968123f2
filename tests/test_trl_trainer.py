"""A TRL script on Hone (issue 49): `GRPOConfig`'s fields translated by one table (`hone.config.trl.mapping`),
`hone train/config --trl-config FILE`, and `from hone.trl import GRPOConfig, GRPOTrainer` running a
script written for TRL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hone.cli import main
from hone.config import ConfigError
from hone.config.load import validate_recipe
from hone.config.trl.mapping import translate

trl = pytest.importorskip("trl")

from hone.cli.trl_config import trl_defaults  # noqa: E402  (needs TRL)

SCRIPT = {"model_name_or_path": "tiny", "dataset_name": "train.jsonl", "reward_funcs": ["accuracy_reward"]}


def hone_keys(**fields: Any) -> dict[str, Any]:
    return translate({**SCRIPT, **fields}, trl_defaults(), train_rows=10).tree


def test_trl_defaults_become_trls_run_not_hones() -> None:
    """A script that sets nothing trains as TRL would: TRL's learning rate, clip, loss, std guard, batch
    shape and precision, not Hone's defaults."""
    tree = hone_keys()
    assert tree["trainer"]["lr"] == 1e-6 and tree["trainer"]["schedule"] == "linear"
    assert tree["algorithm"]["clip_low"] == tree["algorithm"]["clip_high"] == 0.2
    assert tree["algorithm"]["loss_agg"] == "token-mean"  # loss_type="dapo"
    assert tree["algorithm"]["kl"] == {"coef": 0.0, "estimator": "k3", "placement": "loss"}
    assert tree["algorithm"]["eps"] == 1e-4 and tree["algorithm"]["norm_by_std"] is True
    assert tree["rollout"]["n"] == 8 and tree["rollout"]["max_new_tokens"] == 512
    assert tree["data"]["prompts_per_step"] == 1  # 8 completions per device and step, 8 per prompt
    assert tree["trainer"]["autocast"] == "bfloat16"  # bf16 defaults to `not fp16`
    assert tree["trainer"]["disable_dropout"] is False and tree["model"]["gradient_checkpointing"] is True
    assert tree["run"]["steps"] == 30  # no max_steps: 3 epochs over 10 rows, one prompt a step
    assert tree["run"]["name"] == "trainer_output" and tree["run"]["seed"] == 42
    assert tree["reward"]["components"] == {
        "accuracy_reward": {"fn": "trl.rewards:accuracy_reward", "contract": "trl"}
    }
    validate_recipe(tree, "test")  # every key it writes is one of Hone's


def test_optimizer_steps_become_rl_steps() -> None:
    """TRL counts optimizer steps; one generation serves steps_per_generation x num_iterations /
    gradient_accumulation_steps of them (here 4 x 2 / 2 = 4)."""
    tree = hone_keys(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_generations=4,
        num_iterations=2,
        max_steps=100,
        save_steps=20,
        warmup_steps=8,
    )
    assert tree["data"]["prompts_per_step"] == 4  # 4 x 4 completions, 4 per prompt
    assert tree["trainer"]["mini_batches"] == 2 and tree["trainer"]["micro_batch_size"] == 4
    assert tree["trainer"]["ppo_epochs"] == 2
    assert tree["run"]["steps"] == 25 and tree["run"]["save_every"] == 5
    assert tree["trainer"]["warmup_steps"] == 2


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"loss_type": "grpo"}, {"algorithm.loss_agg": "seq-mean-token-mean"}),
        ({"loss_type": "dr_grpo"}, {"algorithm.loss_agg": "seq-mean-token-sum-norm"}),
        (
            {"loss_type": "cispo", "epsilon_high": 5.0},
            {"algorithm.policy_loss": "cispo", "algorithm.clip_high": 4.0},
        ),
        ({"epsilon": 0.3}, {"algorithm.clip_low": 0.3, "algorithm.clip_high": 0.3}),
        ({"epsilon_high": 0.28}, {"algorithm.clip_low": 0.2, "algorithm.clip_high": 0.28}),
        ({"importance_sampling_level": "sequence"}, {"algorithm.policy_loss": "gspo"}),
        ({"scale_rewards": "none"}, {"algorithm.norm_by_std": False}),
        ({"scale_rewards": "batch"}, {"algorithm.advantage_args": {"std_over": "batch"}}),
        ({"beta": 0.04}, {"algorithm.kl": {"coef": 0.04, "estimator": "k3", "placement": "loss"}}),
        ({"mask_truncated_completions": True}, {"algorithm.mask_truncated": True}),
        (
            {"use_vllm": True},
            {
                "rollout.engine": "vllm",
                "algorithm.off_policy": {"name": "mis", "level": "sequence", "hi": 3.0},
                "algorithm.old_log_probs": "recompute",
            },
        ),
        ({"use_peft": True, "lora_r": 8}, {"model.lora": {"r": 8, "alpha": 32, "dropout": 0.05}}),
        ({"report_to": ["wandb"]}, {"logging.wandb": True, "logging.tensorboard": False}),
        ({"log_completions": True, "num_completions_to_print": 3}, {"logging.samples": 3}),
        ({"output_dir": "out/my-run"}, {"run.dir": "out", "run.name": "my-run"}),
    ],
)
def test_each_field_maps_to_the_hone_keys_that_do_its_job(fields: dict, expected: dict) -> None:
    tree = hone_keys(**fields)
    for key, value in expected.items():
        node: Any = tree
        for part in key.split("."):
            node = node[part]
        if isinstance(value, dict) and key == "model.lora":
            assert {k: node[k] for k in value} == value
        else:
            assert node == value, key
    validate_recipe(tree, "test")


def test_what_hone_cannot_do_is_refused_by_name_in_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        hone_keys(sync_ref_model=True, loss_type="sapo", top_entropy_quantile=0.2, label_smoothing_factor=0.1)
    line = str(e.value)
    assert "\n" not in line
    for field in ("sync_ref_model=True", "loss_type='sapo'", "top_entropy_quantile=0.2"):
        assert field in line
    assert "label_smoothing_factor=0.1 (no Hone equivalent)" in line  # a field the table does not know


def test_a_field_left_at_trls_default_is_never_refused_and_a_harmless_one_is_noted() -> None:
    translation = translate(
        {**SCRIPT, "sync_ref_model": False, "logging_steps": 1}, trl_defaults(), train_rows=4
    )
    assert translation.refused == []
    assert any(note.startswith("logging_steps=1") for note in translation.notes)


def test_epochs_need_the_datasets_length() -> None:
    with pytest.raises(ConfigError, match=r"max_steps=-1.*set max_steps"):
        translate(SCRIPT, trl_defaults())


# --- a `trl grpo` config file -------------------------------------------------------------------------


def write_config(folder: Path, **extra: Any) -> Path:
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "solution": str(2 * i)} for i in range(20)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = {
        "model_name_or_path": "tiny",
        "dataset_name": "train.jsonl",
        "reward_funcs": ["think_format_reward", "tests.test_trl_trainer.reward_len"],
        "reward_weights": [1.0, 0.5],
        "output_dir": "runs/from-trl",
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "max_steps": 2,
        "bf16": False,
        "gradient_checkpointing": False,
        **extra,
    }
    path = folder / "grpo.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    return path


def reward_len(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL's documentation example: completions near 20 characters score best."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-abs(20 - len(t)) for t in texts]


def test_hone_config_trl_config_prints_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--trl-config", str(write_config(tmp_path))]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# The Hone recipe of a TRL config")
    assert "prompts_per_step: 2" in printed and "fn: tests.test_trl_trainer:reward_len" in printed
    assert "weight: 0.5" in printed
    assert not (tmp_path / "runs").exists()  # shown, not run


def test_a_key_trl_does_not_have_is_named_with_the_closest_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--trl-config", str(write_config(tmp_path, num_generation=4))]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_generation (did you mean num_generations" in err and len(err.splitlines()) == 1


@pytest.mark.integration
def test_hone_train_trl_config_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--trl-config", str(write_config(tmp_path))]) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs/from-trl/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rewards/reward_len/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("rewards/think_format_reward/mean" in r for r in steps)


# --- the one-line switch: from hone.trl import GRPOConfig, GRPOTrainer -------------------------------


def test_grpo_config_is_trls_and_builds_without_a_gpu() -> None:
    from hone.trl import GRPOConfig

    args = GRPOConfig(output_dir="x", learning_rate=1e-5, num_generations=4)
    assert isinstance(args, trl.GRPOConfig)
    assert args.hone_fields["learning_rate"] == 1e-5 and args.hone_fields["bf16"] is None
    assert args.generation_batch_size == 8  # TRL's own __post_init__ ran


TRL_SCRIPT = """
from datasets import Dataset
from hone.trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Say {i}:", "level": i % 3} for i in range(12)])


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


training_args = GRPOConfig(
    output_dir="runs/Tiny-GRPO",
    max_steps=2,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    learning_rate=1e-3,
    bf16=False,
    gradient_checkpointing=False,
    logging_steps=1,
)
trainer = GRPOTrainer(model="tiny", reward_funcs=reward_len, args=training_args, train_dataset=dataset)
output = trainer.train()
trainer.save_model("final-model")
"""


@pytest.mark.integration
def test_a_trl_script_trains_with_the_import_line_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's documented GRPO example (its `reward_len`), run as a script's `__main__`: the reward is this
    program's own function (`script:reward_len`), the dataset an in-memory `Dataset`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(TRL_SCRIPT, "train_grpo.py", "exec"), scope)
    trainer, output = scope["trainer"], scope["output"]
    assert output.global_step == 2 and trainer.state.global_step == 2
    rows = [r for r in trainer.state.log_history if "rewards/reward_len/mean" in r]
    assert len(rows) == 2 and all(r["rewards/reward_len/mean"] <= 0 for r in rows)
    assert (tmp_path / "final-model" / "model.safetensors").is_file()
    recipe = (tmp_path / "runs" / "Tiny-GRPO.hone.yaml").read_text()
    assert "fn: script:reward_len" in recipe and "lr: 0.001" in recipe
    with pytest.raises(ConfigError, match="resume_from_checkpoint=True"):
        trainer.train()  # TRL would overwrite output_dir; a Hone run is continued, not overwritten


def test_constructor_arguments_hone_cannot_honour_are_refused_by_name() -> None:
    from hone.trl import GRPOTrainer

    with pytest.raises(ConfigError, match=r"tools \(.*rollout_func \("):
        GRPOTrainer(
            model="tiny", reward_funcs=reward_len, train_dataset="x.jsonl", rollout_func=print, tools=[print]
        )


QUICKSTART = """
from trl import GRPOTrainer
from datasets import load_dataset
from trl.rewards import accuracy_reward
trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    train_dataset=load_dataset("trl-lib/DeepMath-103K", split="train"),
    reward_funcs=accuracy_reward,
)
trainer.train()
"""


@pytest.mark.slow
def test_trls_quickstart_runs_with_the_import_line_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's quick start (docs/trl quickstart, GRPO), with the import line changed and, offline, a local
    model and a DeepMath-shaped local file in place of the hub names: TRL's defaults throughout (3 epochs,
    8 completions of up to 512 tokens per prompt): ~9 minutes on 2 CPU cores."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}], "solution": str(2 * i + 1)}
        for i in range(10)
    ]
    (tmp_path / "deepmath.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = (
        QUICKSTART.replace("from trl import GRPOTrainer", "from hone.trl import GRPOTrainer")
        .replace('"Qwen/Qwen2.5-0.5B-Instruct"', '"tiny"')
        .replace(
            'load_dataset("trl-lib/DeepMath-103K", split="train")',
            'load_dataset("json", data_files="deepmath.jsonl", split="train")',
        )
    )
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(script, "quickstart.py", "exec"), scope)
    state = scope["trainer"].state
    assert state.global_step == 30  # 3 epochs x 10 rows, one prompt (8 completions) a step
    assert all(
        "rewards/accuracy_reward/mean" in r
        for r in state.log_history
        if r.get("step", 0) > 0 and "reward/mean" in r
    )


def needs_tests(completions: list[Any], tests: list[Any], **kwargs: Any) -> list[float]:
    """A TRL reward for rows with a `tests` column, which the rows of `write_config` lack."""
    return [0.0 for _ in completions]


def test_the_dry_run_calls_each_reward_once_on_a_real_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reward that cannot run on the data fails the dry run in one line, not step 0 of the run."""
    monkeypatch.chdir(tmp_path)
    config = write_config(
        tmp_path, reward_funcs=["think_format_reward", "tests.test_trl_trainer.needs_tests"]
    )
    assert main(["train", "--trl-config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "reward 'needs_tests' failed on training prompt 1" in err
    assert "missing 1 required positional argument: 'tests'" in err
    assert not (tmp_path / "runs").exists()
    good = write_config(tmp_path, reward_funcs=["think_format_reward"], reward_weights=[1.0])
    assert main(["train", "--trl-config", str(good), "--dry-run"]) == 0


ENV_SCRIPT = '''
from datasets import Dataset
from hone.trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"Go to {i % 4 + 1}."}], "target": i % 4 + 1} for i in range(12)]
)


class CounterEnv:
    def reset(self, target, **kwargs):
        self.counter, self.target = 0, target
        return f" Reach {target}."

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return -abs(self.target - self.counter)


def visited(environments, **kwargs):
    return [float(env.counter > 0) for env in environments]


args = GRPOConfig(
    output_dir="runs/counter",
    max_steps=2,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_tool_calling_iterations=1,
    bf16=False,
    gradient_checkpointing=False,
)
trainer = GRPOTrainer(
    model="tiny", reward_funcs=visited, args=args, train_dataset=dataset, environment_factory=CounterEnv
)
trainer.train()
'''


@pytest.mark.integration
def test_a_trl_script_with_an_environment_factory_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's `environment_factory`: the script's own class (`script:CounterEnv`), its `get_reward` a reward
    beside the script's function reading `environments=`; `max_tool_calling_iterations` bounds the turns."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(ENV_SCRIPT, "train_env.py", "exec"), scope)
    trainer = scope["trainer"]
    assert trainer.recipe["env"] == {"name": "script:CounterEnv", "max_turns": 2}
    rows = [r for r in trainer.state.log_history if "rewards/CounterEnv/mean" in r]
    assert len(rows) == 2 and all("rewards/visited/mean" in r for r in rows)
    assert all(r["rewards/CounterEnv/mean"] <= 0 for r in rows)


def test_a_reward_models_name_is_a_reward_model_component_first_as_trl_orders_them() -> None:
    """TRL's string form of `reward_funcs` (a sequence-classification model) is Hone's `reward_model`
    reward; `trl grpo` puts the model before the functions, and the weights follow that order."""
    tree = hone_keys(reward_model_name_or_path="org/tiny-rm", reward_weights=[0.3, 1.0])
    components = tree["reward"]["components"]
    assert list(components) == ["tiny-rm", "accuracy_reward"]
    assert components["tiny-rm"] == {"fn": "reward_model", "args": {"path": "org/tiny-rm"}, "weight": 0.3}
    with pytest.raises(ConfigError, match=r"reward_weights=\[0.3\] \(1 weights for 2 reward functions\)"):
        hone_keys(reward_model_name_or_path="org/tiny-rm", reward_weights=[0.3])
