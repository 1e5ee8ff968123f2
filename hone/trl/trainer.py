"""`GRPOTrainer` and `GRPOConfig` with TRL's constructor, driving Hone's run: a TRL script trains on Hone
with one line changed (`from hone.trl import GRPOConfig, GRPOTrainer`).

`GRPOConfig` is TRL's own class (every field, default and check of TRL's), except that on a machine
without a GPU it sets `use_cpu` as TRL asks instead of refusing. `GRPOTrainer(...).train()` translates the
config (`hone.config.trl.mapping`: every field that changes training mapped, or refused by name), hands the
script's objects to the run (reward functions and environment classes as `script:<name>`, datasets saved
with `save_to_disk` under `~/.cache/hone/trl`, a model object saved with `save_pretrained`), writes the
recipe to `<output_dir>.hone.yaml` and runs `hone train` on it in this process.

What it departs from: a Hone run directory is never overwritten (TRL writes into `output_dir` again);
`train(resume_from_checkpoint=True)` continues it. Without `eval_dataset`, Hone holds out up to a tenth of
the rows (at most `data.eval_size`) for its before/after eval, where TRL trains on every row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import trl

from hone.cli.trl_config import class_defaults, recipe_yaml, trl_defaults
from hone.config import ConfigError
from hone.config.trl.args import Translation
from hone.config.trl.mapping import translate
from hone.plugins import register_script_object, spec_for

log = logging.getLogger("hone")

CACHE = Path(os.environ.get("HONE_CACHE", "~/.cache/hone")).expanduser() / "trl"


@dataclasses.dataclass
class GRPOConfig(trl.GRPOConfig):
    """TRL's `GRPOConfig`; on a machine without a GPU `use_cpu` is set (TRL refuses bf16 there otherwise)."""

    def __post_init__(self) -> None:
        # What the script set, before TRL fills in derived fields (bf16 from fp16, the batch shape, ...).
        self.hone_fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(trl.GRPOConfig)}
        if not self.use_cpu and not _has_accelerator():
            self.use_cpu = True
        super().__post_init__()


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


class GRPOTrainer:
    """TRL's `GRPOTrainer` constructor; `.train()` runs Hone's GRPO on it (see the module's docstring)."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: trl.GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list[Any] | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ) -> None:
        unsupported = {
            "reward_processing_classes": (reward_processing_classes, "a reward model uses its own tokenizer"),
            "optimizers": (None if optimizers == (None, None) else optimizers, "Hone's optimizer is AdamW"),
            "quantization_config": (quantization_config, "Hone has no quantised (QLoRA) training"),
            "tools": (tools or None, "give tools as methods of an environment_factory class"),
            "rollout_func": (rollout_func, "Hone's custom rollouts are rollout.agent or an environment"),
        }
        refused = [f"{name} ({why})" for name, (value, why) in unsupported.items() if value is not None]
        if refused:
            raise ConfigError("GRPOTrainer arguments Hone cannot honour: " + "; ".join(refused))
        model_name = model if isinstance(model, str) else getattr(model, "name_or_path", "model")
        self.args = args if args is not None else GRPOConfig(f"{str(model_name).split('/')[-1]}-GRPO")
        self.model_arg, self.processing_class = model, processing_class
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        self.reward_funcs = [f for f in self.reward_funcs if f is not None]
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.peft_config, self.environment_factory = peft_config, environment_factory
        self.callbacks = list(callbacks or [])
        self.state = _State()
        self.run_dir: Path | None = None
        self.translation = self._translate()  # every refusal happens here, at construction, as TRL's do
        self.recipe = self.translation.tree

    # --- translation -------------------------------------------------------------------------------

    def _values(self) -> dict[str, Any]:
        """The config's fields as the script set them, plus the constructor's model, data and rewards in
        the `trl grpo` script's field names."""
        values = dict(getattr(self.args, "hone_fields", None) or _fields(self.args))
        values["model_name_or_path"] = self._model_path()
        values["dataset_name"] = _saved_dataset(self.train_dataset, "train_dataset")
        specs, models = [], []
        for fn in self.reward_funcs:
            if isinstance(fn, str):
                models.append(fn)  # TRL: a string is a reward model's name
            else:
                specs.append(_reward_spec(fn))
        values["reward_funcs"], values["reward_model_name_or_path"] = specs, models
        if self.peft_config is not None:
            values.update(_lora_fields(self.peft_config))
        return values

    def _translate(self) -> Translation:
        env_rewards = False
        if self.environment_factory is not None:
            from hone.trl.environments import environment_section

            env, env_rewards = environment_section(self.environment_factory)
        dataset = self.train_dataset
        rows = len(dataset) if hasattr(dataset, "__len__") and not isinstance(dataset, str) else None
        translation = translate(self._values(), trl_defaults(), train_rows=rows, env_rewards=env_rewards)
        tree = translation.tree
        if self.environment_factory is not None:
            tree.setdefault("env", {}).update(env)  # beside max_tool_calling_iterations' env.max_turns
        if self.eval_dataset is not None:
            if isinstance(self.eval_dataset, dict):
                raise ConfigError("eval_dataset: a dict of eval datasets (Hone evaluates one held-out set)")
            tree.setdefault("data", {})["eval_source"] = _saved_dataset(self.eval_dataset, "eval_dataset")
        if self.callbacks:
            tree.setdefault("run", {})["callbacks"] = [_callback_spec(cb, self) for cb in self.callbacks]
        return translation

    def _model_path(self) -> str:
        model, tokenizer = self.model_arg, self.processing_class
        if isinstance(model, str):
            if tokenizer is not None and getattr(tokenizer, "name_or_path", model) != model:
                raise ConfigError(
                    f"processing_class: a tokenizer from {tokenizer.name_or_path!r} for model {model!r}; "
                    "pass the model object too, or save both with save_pretrained and pass the folder"
                )
            return model
        if not hasattr(model, "save_pretrained"):
            raise ConfigError(f"model: a model name, folder or PreTrainedModel, got {type(model).__name__}")
        if getattr(model, "peft_config", None):
            raise ConfigError("model: a PeftModel; pass the base model and peft_config=LoraConfig(...)")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
        digest = hashlib.sha256(
            json.dumps([model.name_or_path, _weights_digest(model)]).encode()
        ).hexdigest()[:16]
        folder = CACHE / "models" / digest
        if not (folder / "config.json").is_file():
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return str(folder)

    # --- running -----------------------------------------------------------------------------------

    def recipe_file(self) -> Path:
        """Where the translated recipe is written: beside the run directory, `<output_dir>.hone.yaml`."""
        run = self.recipe.get("run", {})
        return Path(run.get("dir", "runs")) / f"{run.get('name', 'demo')}.hone.yaml"

    def train(self, resume_from_checkpoint: bool | str | None = None, **_: Any) -> Any:
        """Run Hone's `hone train` on the translated recipe in this process; `resume_from_checkpoint`
        (True, or the run directory) continues the run in `output_dir`. Returns transformers'
        `TrainOutput(global_step, training_loss, metrics)`, the metrics the run's `summary.json`."""
        from hone.cli import main

        path = self.recipe_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(recipe_yaml(self.translation, "GRPOTrainer"))
        run = self.recipe.get("run", {})
        self.run_dir = Path(run.get("dir", "runs")) / str(run.get("name", "demo"))
        if resume_from_checkpoint:
            argv = ["train", "--resume", str(self.run_dir)]
        elif self.run_dir.exists():
            raise ConfigError(
                f"output_dir {self.run_dir} holds a Hone run already: trainer.train(resume_from_checkpoint="
                "True) continues it; or choose another output_dir"
            )
        else:
            argv = ["train", str(path)]
        code = main(argv)
        if code != 0:
            raise RuntimeError(
                f"hone train {' '.join(argv[1:])} stopped (exit code {code}): its line above says why"
            )
        self.state.load(self.run_dir)
        return trl_train_output(self.state)

    def save_model(self, output_dir: str | None = None) -> None:
        """Copy the final model (the last checkpoint's) to `output_dir` (default `args.output_dir`)."""
        import shutil

        source = self._final_model()
        target = Path(output_dir or self.args.output_dir or "trainer_output")
        target.mkdir(parents=True, exist_ok=True)
        for item in source.iterdir():
            shutil.copy2(item, target / item.name)

    @property
    def model(self) -> Any:
        """The trained model, loaded from the run's last checkpoint."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self._final_model())

    def _final_model(self) -> Path:
        if self.run_dir is None:
            raise RuntimeError("no model yet: call trainer.train() first")
        steps = sorted(
            (self.run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name.partition("-")[2])
        )
        if not steps:
            raise RuntimeError(f"{self.run_dir}: no checkpoint to take the model from")
        return steps[-1] / "model"


@dataclasses.dataclass
class _State:
    """TRL's `trainer.state`, as far as a script reads it after training."""

    global_step: int = 0
    max_steps: int = 0
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    def load(self, run_dir: Path) -> None:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file():
            self.log_history = [json.loads(line) for line in metrics.read_text().splitlines() if line]
        summary = run_dir / "summary.json"
        if summary.is_file():
            self.summary = json.loads(summary.read_text())
        self.global_step = max((int(row.get("step", 0)) for row in self.log_history), default=0)


def trl_train_output(state: _State) -> Any:
    from transformers.trainer_utils import TrainOutput

    losses = [row["loss"] for row in state.log_history if "loss" in row]
    return TrainOutput(state.global_step, sum(losses) / len(losses) if losses else 0.0, state.summary)


def _fields(args: Any) -> dict[str, Any]:
    """A config's fields as they are now: TRL's own `GRPOConfig` (not Hone's) after its `__post_init__`,
    whose derived fields read as their defaults again so they do not count as set."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(trl.GRPOConfig)}
    defaults = class_defaults(trl.GRPOConfig)
    derived = ("bf16", "steps_per_generation", "generation_batch_size", "logging_dir", "report_to", "use_cpu")
    for name in derived:
        values[name] = defaults.get(name)
    values["scale_rewards"] = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)
    return values


def _saved_dataset(dataset: Any, what: str) -> str:
    """A `datasets.Dataset` saved once under the cache (by its fingerprint) for the run to read; a path or
    hub name as it is."""
    if dataset is None:
        raise ConfigError(f"{what}: required (Hone trains on a dataset of prompts)")
    if isinstance(dataset, str):
        return dataset
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise ConfigError(f"{what}: a DatasetDict without a 'train' split: pass one split")
        dataset = dataset["train"]
    if not isinstance(dataset, datasets.Dataset):
        raise ConfigError(
            f"{what}: a {type(dataset).__name__}; Hone reads a datasets.Dataset (an IterableDataset: "
            "take what you need with Dataset.from_list(list(ds.take(n))))"
        )
    folder = CACHE / "datasets" / dataset._fingerprint
    if not (folder / "dataset_info.json").is_file():
        dataset.save_to_disk(str(folder))
    return str(folder)


def _reward_spec(fn: Any) -> str:
    """How the run names a reward function: `pkg.mod:fn` when it can be imported by that name (so a Ray
    worker or a resumed run finds it), else `script:<name>`, this program's object."""
    if not callable(fn):
        raise ConfigError(f"reward_funcs: {fn!r} is neither callable nor a reward model's name")
    if hasattr(fn, "save_pretrained"):
        raise ConfigError("reward_funcs: a reward model object; pass its name or folder (a string) instead")
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", type(fn).__name__)
    return spec_for(fn, str(name))


def _lora_fields(peft_config: Any) -> dict[str, Any]:
    """A peft `LoraConfig` as `trl grpo`'s ModelConfig fields (`use_peft`, `lora_r`, ...)."""
    refused = []
    if getattr(peft_config, "use_rslora", False):
        refused.append("use_rslora=True (Hone's LoRA scale is alpha / r)")
    if getattr(peft_config, "use_dora", False):
        refused.append("use_dora=True (DoRA is not in Hone)")
    if getattr(peft_config, "modules_to_save", None):
        refused.append("modules_to_save (Hone trains the adapters only)")
    if refused:
        raise ConfigError("peft_config: " + "; ".join(refused))
    modules = peft_config.target_modules
    return {
        "use_peft": True,
        "lora_r": peft_config.r,
        "lora_alpha": peft_config.lora_alpha,
        "lora_dropout": peft_config.lora_dropout,
        "lora_target_modules": sorted(modules) if isinstance(modules, set) else modules,
    }


def _weights_digest(model: Any) -> str:
    """A cheap fingerprint of a model object's weights: its parameters' shapes and first values."""
    parts = [
        f"{n}:{tuple(p.shape)}:{float(p.detach().flatten()[:4].sum()):.8g}"
        for n, p in model.named_parameters()
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _callback_spec(callback: Any, trainer: GRPOTrainer) -> str:
    """A `transformers.TrainerCallback` as a Hone `run.callbacks` function: its `on_step_end` and `on_log`
    (with the step's metrics as `logs`) after every RL step."""
    state = trainer.state

    def after_step(step: int, metrics: dict[str, float]) -> None:
        state.global_step = step
        state.log_history.append({"step": step, **metrics})
        for hook, extra in (("on_step_end", {}), ("on_log", {"logs": metrics})):
            method = getattr(callback, hook, None)
            if method is not None:
                method(trainer.args, state, None, **extra)

    return register_script_object(f"callback_{type(callback).__name__}_{id(callback)}", after_step)
