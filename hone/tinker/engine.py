"""The model side of `hone serve tinker`: base models loaded once, a LoRA adapter and an AdamW per training
client, forward/backward and optimizer steps. Runs on the futures' one worker thread only.

Several training clients on one base model share its weights: each is a named adapter of one peft model
(`add_adapter`), switched in for its requests (`set_adapter`, which also makes only that adapter's
parameters trainable), with an optimizer over its own adapter's parameters. A gradient stays in its
adapter's `.grad` between a client's forward_backward and its optim_step, whatever other clients run in
between.

Tinker's LoRA: rank `rank`, scale `alpha / rank` with alpha 32 (Tinker's, whatever the rank), on the
attention projections (`train_attn`), the MLP's (`train_mlp`) and the output embedding (`train_unembed`);
B starts at zero, so a new client computes exactly the base model. The model stays in eval mode
(no dropout), so a request's result depends on its inputs and the weights alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hone.models import resolve_model
from hone.tinker.losses import get_loss
from hone.tinker.wire import Datum, WireError
from hone.training.logprobs import token_scores
from hone.training.optim import adamw
from hone.training.policy import DType, Policy

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from tinker.types import AdamParams
    from transformers import PreTrainedModel

TINKER_LORA_ALPHA = 32.0


@dataclass(frozen=True)
class LoraSpec:
    """A training client's LoRA, as `tinker.types.LoraConfig` gives it (plus the scale's alpha)."""

    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    seed: int | None = None
    alpha: float = TINKER_LORA_ALPHA

    def layout(self) -> LoraSpec:
        """The same LoRA without its seed: what decides whether saved adapter tensors fit."""
        return dataclasses.replace(self, seed=None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoraSpec:
        return cls(**data)


def linear_layers(model: PreTrainedModel) -> dict[str, str]:
    """The model's linear layers by full name, each `attn` (under an attention block: `attn` or `attention`
    in a parent's name), `mlp` (under `mlp`, `feed_forward`, `experts`), `unembed` (the output embedding)
    or `other`. Read before any adapter is added (peft's own layers are linear too)."""
    unembed = model.get_output_embeddings()
    kinds = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parents = name.split(".")[:-1]
        if module is unembed:
            kinds[name] = "unembed"
        elif any("attn" in p or "attention" in p for p in parents):
            kinds[name] = "attn"
        elif any(p in ("feed_forward", "experts") or "mlp" in p for p in parents):
            kinds[name] = "mlp"
        else:
            kinds[name] = "other"
    return kinds


def peft_config(layers: dict[str, str], spec: LoraSpec) -> LoraConfig:
    """peft's config for `spec` on a model with these `linear_layers`."""
    from peft import LoraConfig

    wanted = {"attn": spec.train_attn, "mlp": spec.train_mlp, "unembed": spec.train_unembed}
    targets = [name for name, kind in layers.items() if wanted.get(kind, False)]
    if not targets:
        raise WireError(f"LoRA {spec}: no layer of the model to adapt (train_attn/train_mlp/train_unembed)")
    # peft types `lora_alpha` as int; the scale alpha / r is computed in floats either way.
    alpha: Any = spec.alpha
    return LoraConfig(r=spec.rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets)


class Base:
    """One base model, loaded once: the HF model (wrapped by peft at the first adapter) and its tokenizer."""

    def __init__(self, name: str, path: str, policy: Policy) -> None:
        self.name, self.path = name, path
        self.hf_model = policy.base_model()
        self.tokenizer = policy.tokenizer
        self.peft: PeftModel | None = None
        self.layers = linear_layers(self.hf_model)
        self.hf_model.eval()

    @property
    def model(self) -> torch.nn.Module:
        """What runs a forward: the peft model once there is an adapter, else the plain HF model."""
        return self.peft if self.peft is not None else self.hf_model

    @property
    def max_length(self) -> int:
        return int(getattr(self.hf_model.config, "max_position_embeddings", 0) or 1 << 30)

    def add_adapter(self, name: str, spec: LoraSpec, seed: int) -> list[torch.nn.Parameter]:
        """Add adapter `name` (initialised from `seed`); return its parameters."""
        from peft import get_peft_model

        config = peft_config(self.layers, spec)
        # An adapted `lm_head` of a model with tied embeddings adapts the output side only (Tinker's
        # `train_unembed`), which is what peft's warning about tied layers in an adapter is about.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Model has `tie_word_embeddings=True`")
            torch.manual_seed(seed)
            if self.peft is None:
                self.peft = get_peft_model(self.hf_model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        assert self.peft is not None
        self.peft.eval()
        return [p for n, p in self.peft.named_parameters() if f".{name}." in n]

    def peft_config(self, adapter: str) -> LoraConfig:
        """The adapter's peft config (what `adapter_config.json` holds)."""
        assert self.peft is not None
        config: LoraConfig = self.peft.peft_config[adapter]  # type: ignore[assignment]
        return config

    def activate(self, adapter: str | None) -> None:
        if adapter is not None:
            assert self.peft is not None
            self.peft.set_adapter(adapter)

    def adapter_state(self, adapter: str) -> dict[str, torch.Tensor]:
        """The adapter's tensors under peft's saved names (no adapter name in them), detached copies."""
        from peft import get_peft_model_state_dict

        # The adapter alone: never the (tied) embedding matrix peft would add when `lm_head` is adapted.
        state = get_peft_model_state_dict(self.peft, adapter_name=adapter, save_embedding_layers=False)
        return {k: v.detach().clone() for k, v in state.items()}

    def load_adapter_state(self, adapter: str, state: dict[str, torch.Tensor], origin: str) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft, state, adapter_name=adapter)
        unexpected: list[str] = result.unexpected_keys  # type: ignore[attr-defined]
        missing = [k for k in result.missing_keys if f".{adapter}." in k]  # type: ignore[attr-defined]
        if unexpected or missing:
            raise WireError(f"{origin}: the checkpoint's LoRA does not fit ({(unexpected or missing)[:3]})")


@dataclass
class Trainee:
    """A training client: its adapter on a base model and the AdamW over that adapter."""

    model_id: str
    base: Base
    adapter: str
    lora: LoraSpec
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW
    steps: int = 0


class Engine:
    """Base models by name and training clients by model id (see the module docstring)."""

    def __init__(self, *, dtype: DType = "float32", device: str = "auto", seed: int = 0) -> None:
        self.dtype, self.device, self.seed = dtype, device, seed
        self.bases: dict[str, Base] = {}
        self.trainees: dict[str, Trainee] = {}
        self._names = itertools.count()

    def base(self, name: str) -> Base:
        """The base model `name` (what `model.path` takes: `tiny`, a packaged alias, a directory, a hub name),
        loaded on first use."""
        if name not in self.bases:
            try:
                path = resolve_model(name, what="base_model")
            except (OSError, ValueError) as e:
                raise WireError(f"base_model {name!r}: {e}") from e
            policy = Policy.from_pretrained(path, dtype=self.dtype, device=self.device)
            self.bases[name] = Base(name, path, policy)
        return self.bases[name]

    def trainee(self, model_id: str) -> Trainee:
        if model_id not in self.trainees:
            raise WireError(f"unknown model_id {model_id!r} (create_model first; was the server restarted?)")
        return self.trainees[model_id]

    def create(self, model_id: str, base_name: str, spec: LoraSpec) -> Trainee:
        if spec.rank < 1:
            raise WireError(f"lora_config.rank must be >= 1, got {spec.rank}")
        base = self.base(base_name)
        adapter = f"t{next(self._names)}"
        params = base.add_adapter(adapter, spec, self.seed if spec.seed is None else spec.seed)
        optimizer = adamw(params, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.95))
        trainee = Trainee(model_id, base, adapter, spec, params, optimizer)
        self.trainees[model_id] = trainee
        return trainee

    def forward_backward(
        self,
        model_id: str,
        data: list[Datum],
        loss_name: str,
        config: dict[str, float | str],
        *,
        forward_only: bool,
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Run the batch through the client's model; unless `forward_only`, add the gradient of the summed
        loss to its adapter's gradients (they accumulate until `optim_step`)."""
        trainee = self.trainee(model_id)
        loss_fn = get_loss(loss_name, config)
        if not data:
            raise WireError("forward_backward: no data")
        base = trainee.base
        device = next(base.hf_model.parameters()).device
        for i, datum in enumerate(data):
            _check_datum(datum, i, base.max_length)
        width = max(len(d.tokens) for d in data)
        ids = torch.zeros((len(data), width), dtype=torch.long)
        targets = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for i, datum in enumerate(data):
            n = len(datum.tokens)
            ids[i, :n] = torch.tensor(datum.tokens)
            targets[i, :n] = torch.from_numpy(np.array(datum.inputs["target_tokens"], dtype=np.int64))
            mask[i, :n] = 1
        ids, targets, mask = ids.to(device), targets.to(device), mask.to(device)
        base.activate(trainee.adapter)
        with torch.set_grad_enabled(not forward_only):
            logits = base.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=False,
            ).logits
            logprobs, _ = token_scores(logits, targets, mask, 1.0, False, False)
            total = logprobs.new_zeros(())
            outputs = []
            for i, datum in enumerate(data):
                n = len(datum.tokens)
                inputs = {
                    k: torch.from_numpy(np.array(v, dtype=np.float32)).to(device)
                    for k, v in datum.inputs.items()
                    if k != "target_tokens"
                }
                elementwise = loss_fn(logprobs[i, :n], inputs)
                total = total + elementwise.sum()
                outputs.append(
                    {
                        "logprobs": logprobs[i, :n].detach().float().cpu().numpy(),
                        "elementwise_loss": elementwise.detach().float().cpu().numpy(),
                    }
                )
            if not forward_only:
                total.backward()
        return outputs, {"loss:sum": float(total.detach())}

    def optim_step(self, model_id: str, params: AdamParams) -> dict[str, float]:
        """One AdamW step with the hyperparameters as sent, on the gradients accumulated since the last
        step; then the gradients are cleared. `grad_clip_norm` > 0 clips the global norm first."""
        trainee = self.trainee(model_id)
        grads = [p for p in trainee.params if p.grad is not None]
        clip = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip)) if grads else 0.0
        for group in trainee.optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        if grads and math.isfinite(norm):
            trainee.optimizer.step()
            trainee.steps += 1
        trainee.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "learning_rate": params.learning_rate}

    def state(self, model_id: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The client's adapter tensors (peft's names) and its optimizer's state dict."""
        trainee = self.trainee(model_id)
        return trainee.base.adapter_state(trainee.adapter), trainee.optimizer.state_dict()

    def load(
        self, model_id: str, adapter: dict[str, torch.Tensor], optimizer: dict[str, Any] | None, origin: str
    ) -> None:
        """Put saved adapter tensors (and, when given, optimizer state) into the client; pending gradients
        are dropped."""
        trainee = self.trainee(model_id)
        trainee.base.load_adapter_state(trainee.adapter, adapter, origin)
        trainee.optimizer.zero_grad(set_to_none=True)
        if optimizer is not None:
            trainee.optimizer.load_state_dict(optimizer)


def _check_datum(datum: Datum, index: int, max_length: int) -> None:
    n = len(datum.tokens)
    if n == 0:
        raise WireError(f"datum {index}: empty model_input")
    if n > max_length:
        raise WireError(f"datum {index}: {n} tokens, more than the model's context of {max_length}")
    if "target_tokens" not in datum.inputs:
        raise WireError(f"datum {index}: loss_fn_inputs has no target_tokens")
    for name, value in datum.inputs.items():
        if value.shape[:1] != (n,):
            raise WireError(
                f"datum {index}: loss_fn_inputs[{name!r}] has shape {list(value.shape)}, expected {n} rows "
                "(one per model_input token)"
            )
