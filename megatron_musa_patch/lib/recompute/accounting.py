"""Bytes held for backward, measured with ``torch.autograd.graph.saved_tensors_hooks``.

``with SavedBytes(exclude=model.parameters()) as saved: out = layer(x)`` records every tensor
autograd saves while the block runs; ``saved.nbytes()`` (call it after the forward, before
backward) is the memory those tensors still hold: unique storages, counted once however many
views of them were saved, at their size *now* -- so an output that upstream's
``CheckpointWithoutOutput`` released (storage resized to zero) counts as nothing. Parameters and
the ``exclude`` tensors (inputs shared by all layers: attention mask, RoPE tables) are left out.
"""

from __future__ import annotations

from typing import Dict, Iterable, List

import torch


def _key(t: torch.Tensor):
    storage = t.untyped_storage()
    return (storage.device.type, storage.device.index, storage.data_ptr())


class SavedBytes:
    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {_key(t) for t in exclude if isinstance(t, torch.Tensor)}
        self._saved: List[torch.Tensor] = []
        self._hooks = None

    def _pack(self, tensor):
        self._saved.append(tensor)
        return tensor

    @staticmethod
    def _unpack(tensor):
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    def storages(self) -> Dict[tuple, int]:
        """unique storage -> bytes it holds now (zero-byte ones dropped)."""
        held = {}
        for tensor in self._saved:
            key = _key(tensor)
            if key in self._excluded or key[2] == 0:
                continue
            held[key] = tensor.untyped_storage().nbytes()
        return {k: v for k, v in held.items() if v}

    def tensors(self) -> List[torch.Tensor]:
        """The saved tensors that hold counted memory now."""
        held = self.storages()
        return [t for t in self._saved if _key(t) in held]

    def nbytes(self) -> int:
        return sum(self.storages().values())

    def release(self) -> None:
        """Drop the references (the autograd graph keeps its own)."""
        self._saved.clear()
