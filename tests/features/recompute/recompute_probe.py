"""Test plugin (MEGATRON_MUSA_PATCH_PLUGINS=recompute_probe): after every training step of the
stock pretrain_gpt.py, each rank prints the full-precision loss, the gradient norm and a hash of
every parameter's gradient (``main_grad``) and value, so two runs can be compared bit for bit
(Megatron's own log rounds the loss to 7 digits and the gradient norm to 3 decimals), and how
many blocks were recomputed (with the last linear skipped) and norm outputs restored so far."""

import hashlib
import inspect
from collections import Counter

from megatron_musa_patch.lib.recompute import blocks, norm_output

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import Patch
from megatron_musa_patch.upstream import tables

FEATURE = "recompute_probe"


COUNTS = Counter()
_call, _restore = blocks._BlockRun.__call__, norm_output.NormOutput.restore


def _counted_call(self, *tensors):
    if self.calls >= 1:
        COUNTS["recomputed" if not self.defer else "recomputed-variance"] += 1
    return _call(self, *tensors)


def _counted_restore(self, grad):
    if self.output is not None:
        COUNTS["norm"] += 1
    return _restore(self, grad)


blocks._BlockRun.__call__ = _counted_call
norm_output.NormOutput.restore = _counted_restore


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch("recompute_probe.train_step", "megatron.training.training:train_step",
                       "wrap", _probe, FEATURE, megatron=tables.MEGATRON_SUPPORTED,
                       why="test probe"))


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _probe(wrapped, instance, args, kwargs):
    import torch

    result = wrapped(*args, **kwargs)
    model = inspect.signature(wrapped).bind(*args, **kwargs).arguments["model"]
    params = [p for chunk in model for _, p in sorted(chunk.named_parameters())]
    grads = [p.main_grad for p in params if getattr(p, "main_grad", None) is not None]
    losses = {k: repr(float(v)) for k, v in (result[0] or {}).items()}
    print(f"recompute_probe rank={torch.distributed.get_rank()} losses={losses} "
          f"grad_norm={result[5]!r} grads={_digest(grads)} params={_digest(params)} "
          f"blocks={COUNTS['recomputed']} variance_blocks={COUNTS['recomputed-variance']} "
          f"norms={COUNTS['norm']}", flush=True)
    return result
