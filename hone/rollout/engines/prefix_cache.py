"""The HF engine's prefix cache: the KV of whole sequences a `generate` call fed through the model, found
by the longest stored sequence a new prompt starts with (see `hone.rollout.engines.hf`'s docstring)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

# One layer's cached keys and values, each [rows, kv_heads, tokens, head_dim].
LayerKV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StoredSequence:
    """Where one stored sequence's KV lives: row `row` of `block`, at `columns` (its unmasked ones)."""

    block: list[LayerKV]
    row: int
    columns: list[int]


class PrefixStore:
    """KV caches of whole sequences, found by the longest stored sequence a prompt starts with.

    Rows that end at the same decode step are kept as one block (a gather per layer, not per row), and a
    sequence's real columns are gathered into place only when a later prompt reuses it: storing stays
    cheap for single-turn traffic that never comes back. Entries are keyed by the token tuple, with the
    stored lengths kept longest first: a lookup hashes one slice per distinct length until it hits (a
    multi-turn prompt usually hits on the first).
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, ...], StoredSequence] = {}
        self._lengths: list[int] = []  # distinct stored lengths, longest first

    def keep(
        self, sequences: list[list[int]], rows: list[int], cache: DynamicCache, mask: torch.Tensor
    ) -> None:
        """Store `rows` of `cache`, each under `sequences[k]`, the tokens it holds (its mask's ones)."""
        index = torch.tensor(rows, device=mask.device)
        block = [_key_values(layer, index) for layer in cache.layers]
        for k, (tokens, row_mask) in enumerate(zip(sequences, mask[index].tolist(), strict=True)):
            columns = [c for c, real in enumerate(row_mask) if real]
            if len(columns) != len(tokens):
                raise RuntimeError(f"prefix cache: a row holds {len(columns)} tokens, expected {len(tokens)}")
            if len(tokens) not in self._lengths:
                self._lengths = sorted([*self._lengths, len(tokens)], reverse=True)
            self._entries[tuple(tokens)] = StoredSequence(block, k, columns)

    def longest(self, tokens: list[int]) -> StoredSequence | None:
        """The longest stored sequence that `tokens` starts with (None if none)."""
        for length in self._lengths:
            if length <= len(tokens) and (stored := self._entries.get(tuple(tokens[:length]))) is not None:
                return stored
        return None

    @staticmethod
    def stack(hits: list[StoredSequence | None], width: int) -> list[LayerKV]:
        """The hits' KV right-aligned in `width` columns, one [rows, heads, width, dim] pair per layer (the
        columns left of a sequence repeat its first one; the attention mask hides them)."""
        found = [(row, stored) for row, stored in enumerate(hits) if stored is not None]
        if not found:
            return []
        by_block: dict[int, list[tuple[int, StoredSequence]]] = {}
        for row, stored in found:
            by_block.setdefault(id(stored.block), []).append((row, stored))
        shapes = [(len(hits), keys.shape[1], width, keys.shape[3]) for keys, _ in found[0][1].block]
        example = found[0][1].block[0][0]
        layers = [(example.new_zeros(shape), example.new_zeros(shape)) for shape in shapes]
        for group in by_block.values():
            block = group[0][1].block
            device = block[0][0].device
            dest = torch.tensor([row for row, _ in group], device=device)
            picks = torch.tensor([s.row for _, s in group], device=device)
            columns = torch.tensor(
                [[s.columns[0]] * (width - len(s.columns)) + s.columns for _, s in group], device=device
            )
            for (keys, values), (src_keys, src_values) in zip(layers, block, strict=True):
                index = columns[:, None, :, None].expand(-1, src_keys.shape[1], -1, src_keys.shape[3])
                keys[dest] = src_keys[picks].gather(2, index)
                values[dest] = src_values[picks].gather(2, index)
        return layers


def _key_values(layer: object, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of `rows` of one attention layer's cache. A layer without them (linear attention,
    as in hybrid models) cannot be stored by prefix: one line, not a failure deep inside a later lookup."""
    if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
        raise RuntimeError(
            f"prefix cache: a {type(layer).__name__} cache layer holds no keys/values to reuse; "
            "set rollout.prefix_cache: false for this model"
        )
    return layer.keys[index], layer.values[index]
