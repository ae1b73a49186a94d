"""A norm's output, not kept for backward but recomputed from the norm's input.

The layers after a norm (QKV / fc1 / the MoE router) save the norm output for their weight
gradient. ``NormOutput.release`` frees that tensor's storage once the block's forward is done
(every alias of it, so the saved copies too) and registers a hook on the block's output that,
when backward reaches the block, re-runs the norm on its input (which the norm's own backward
keeps anyway) without autograd and copies the result back into the same storage.

Upstream's ``CheckpointWithoutOutput`` (``--recompute-modules layernorm``) releases the output
the same way but moves the norm out of the autograd graph: its backward runs as a separate
``torch.autograd.backward`` whose input gradient is then added to the residual's, a different
summation order, so fp32 gradients differ in the last bits. Here the norm stays in the graph
exactly as without recompute; only the values of its output are dropped and restored, so the
gradients are bitwise those of the run without recompute.
"""

from __future__ import annotations

import torch


class NormOutput:
    def __init__(self, norm, inputs, output: torch.Tensor):
        self.norm, self.inputs, self.output = norm, inputs, output
        self.nbytes = output.untyped_storage().nbytes()

    @classmethod
    def release(cls, norm, inputs, output, *, until: torch.Tensor) -> None:
        """Free ``output``'s storage now; restore it when ``until``'s gradient is computed."""
        if not isinstance(output, torch.Tensor) or not output.is_contiguous():
            return
        storage = output.untyped_storage()
        if storage.nbytes() != output.numel() * output.element_size():
            return  # a view into something larger: not the norm's own buffer
        if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == storage.data_ptr()
               for t in inputs):
            return  # computed in place
        entry = cls(norm, inputs, output)
        storage.resize_(0)
        until.register_hook(entry.restore)

    def restore(self, grad):
        if self.output is None:
            return None
        with torch.no_grad():
            fresh = self.norm(*self.inputs)
        source = fresh.untyped_storage()
        if source.nbytes() != self.nbytes or fresh.shape != self.output.shape:
            raise RuntimeError(f"recomputed norm output {tuple(fresh.shape)} {fresh.dtype} does "
                               f"not match the released {tuple(self.output.shape)} "
                               f"{self.output.dtype}")
        storage = self.output.untyped_storage()
        storage.resize_(self.nbytes)
        storage.copy_(source)
        self.norm = self.inputs = self.output = None
        return None
