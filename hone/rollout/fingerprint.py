"""Weight fingerprints: does the engine hold the weights the learner published?

The most expensive failures of RL post-training are silent: verl #7495 trained for two months against a
vLLM that never received the LoRA adapter. So after every weight load each engine reports a fingerprint
of the weights it *holds* (read back from its own model after its dtype cast, LoRA merge or tied-head
re-packing), and the learner compares it with the fingerprint of what it published, computed in the
engine's dtype (`compare`).

The fingerprint of a tensor is the sum of its elements' bit patterns, read as integers of the dtype's
width and added modulo 2^64. That is exact (no float rounding, so no tolerance to tune), independent of
the order of the elements (an engine that re-lays a weight out, pads it with zeros or concatenates
several into one, as vLLM packs q/k/v into one `qkv_proj`, sums to the same value; `by_layer` groups
the tensors of one transformer layer for such an engine), and any single flipped bit changes it by
±2^k. It reads every element once: a pass over the weights, next to the copy a load makes anyway.
A cast is done as the engine does it (`Tensor.to`: round to nearest even), so an fp32 learner and a
bf16 engine agree exactly; a float rounding difference anywhere is a mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from hone.errors import HoneError

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # elements widened to int64 at once: bounds the extra memory of a large embedding
_LAYER = re.compile(r"^(.*?\.(?:layers|blocks)\.\d+)\.")  # a decoder layer or a vision-tower block
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Fingerprint:
    """`sums[key] = (dtype, bit sum)`: a tensor's (or, `by_layer`, a layer's tensors') exact checksum in
    the dtype the engine holds it; keys are HF parameter names, or a layer's prefix (`...layers.3`)."""

    sums: dict[str, tuple[str, int]]
    by_layer: bool = False


@runtime_checkable
class Fingerprinted(Protocol):
    """A sampler that can report the fingerprint of the weights it holds; `names` are those a publish
    sent (the engine may report more: what was not sent is not compared)."""

    def weights_fingerprint(self, names: Collection[str]) -> Fingerprint: ...


def group_key(name: str, by_layer: bool) -> str:
    """The key `name` is summed under: itself, or its layer's prefix (`model.layers.3.mlp.up_proj.weight`
    -> `model.layers.3`; a vision tower's `...blocks.3` alike) where the engine packs a layer's tensors
    together."""
    if by_layer and (match := _LAYER.match(name)):
        return match.group(1)
    return name


def bit_sum(tensor: torch.Tensor) -> int:
    """The sum of `tensor`'s elements' bit patterns modulo 2^64, as an unsigned int."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype.is_floating_point or flat.dtype.is_complex:
        flat = flat.view(_INT_OF_WIDTH[flat.element_size()])
    total = 0
    for start in range(0, flat.numel(), _CHUNK):
        total += int(flat[start : start + _CHUNK].to(torch.int64).sum())  # int64 addition wraps mod 2^64
    return total & _MASK


def add_sums(values: Collection[int]) -> int:
    """Bit sums of the parts of one tensor (its shards) added as the whole's is: modulo 2^64."""
    return sum(values) & _MASK


def fingerprint(
    tensors: Mapping[str, torch.Tensor],
    *,
    by_layer: bool = False,
    dtypes: Mapping[str, str] | None = None,
) -> Fingerprint:
    """The fingerprint of `tensors`, each first cast to `dtypes[its key]` where given (the engine's dtype).
    A tensor published under two names (a tied LM head) counts once, under its first name, as an engine
    that re-derives the head from the embeddings holds it once."""
    sums: dict[str, tuple[str, int]] = {}
    seen: set[tuple[int, int, torch.device]] = set()
    for name, tensor in tensors.items():
        if tensor.numel():
            storage = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tensor.device)
            if storage in seen:
                continue
            seen.add(storage)
        key = group_key(name, by_layer)
        dtype = tensor.dtype if dtypes is None or key not in dtypes else getattr(torch, dtypes[key])
        value = bit_sum(tensor.to(dtype))
        _, before = sums.get(key, ("", 0))
        sums[key] = (str(dtype).removeprefix("torch."), (before + value) & _MASK)
    return Fingerprint(sums, by_layer)


def expected_for(tensors: Mapping[str, torch.Tensor], held: Fingerprint) -> Fingerprint:
    """The fingerprint `tensors` should have on an engine that reported `held`: grouped as it groups,
    each cast to the dtype it holds that key in."""
    return fingerprint(tensors, by_layer=held.by_layer, dtypes={k: d for k, (d, _) in held.sums.items()})


def compare(expected: Fingerprint, held: Fingerprint) -> str | None:
    """None when every key of `expected` is held with the same sum; else what differs, in a few words."""
    missing = [key for key in expected.sums if key not in held.sums]
    if missing:
        return f"{len(missing)} published tensor(s) not held by the engine, e.g. {missing[0]}"
    differ = [key for key, (_, value) in expected.sums.items() if held.sums[key][1] != value]
    if not differ:
        return None
    dtype = held.sums[differ[0]][0]
    return f"{len(differ)} of {len(expected.sums)} tensor(s) differ, e.g. {differ[0]} ({dtype})"


class WeightMismatchError(HoneError, RuntimeError):
    """The engine does not hold what the learner published (or not as the version it says); one line."""


def verify_load(sampler: object, tensors: Mapping[str, torch.Tensor], version: int) -> bool:
    """After `sampler.load_weights(tensors, version)`: raise `WeightMismatchError` unless the sampler says
    it is at `version` and holds exactly `tensors` (in its own dtype). False when the engine cannot report
    a fingerprint (its `EngineCapabilities.fingerprint` is off): only the version was checked, which the
    run said in one line at start (`hone.rl.components.warn_unverified`), not at every load."""
    engine = type(sampler).__name__
    held_version = getattr(sampler, "policy_version", version)
    if held_version != version:
        raise WeightMismatchError(
            f"the {engine} sampler reports weight version {held_version} after loading version {version}"
        )
    if not isinstance(sampler, Fingerprinted):
        return False
    held = sampler.weights_fingerprint(tensors.keys())
    problem = compare(expected_for(tensors, held), held)
    if problem is not None:
        raise WeightMismatchError(
            f"weight version {version} on the {engine} sampler is not what the learner published: {problem} "
            "(its rollouts would come from other weights than the ones trained; trainer.verify_weights)"
        )
    return True
