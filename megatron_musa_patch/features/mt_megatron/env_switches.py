"""MT-Megatron's environment switches, each honoured or named (never ignored in silence).

MT-Megatron's ``musa_patch`` reads these at import (MooreThreads/MT-MegatronLM; the meaning of
each from its code). The layer reads them once, with its settings (``Settings.mt_env``). A switch
that asks for something the layer does itself is honoured (nothing to do); one that asks for a
feature the layer does not have is named in one warning at start-up (rank 0), with what to use
instead. ``mmp doctor`` lists the same verdicts. ``verdicts`` is the table docs/mt-megatron.md shows.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import List, Optional

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.settings import switched_on

FEATURE = feature(
    __name__,
    "MT-Megatron's environment switches: honoured, or named in one start-up warning")



@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str
    value: str
    honoured: bool
    text: str

    def line(self) -> str:
        return f"{self.name}={self.value}: {self.text}"


#: name -> (what MT does with it, what to use here instead) for switches the layer lacks
MISSING = {
    "USE_EPX": ("MT's EPX fault tolerance / elastic training (external EPX package)",
                "launch with `mmp run --max-restarts N` (or torchrun --max-restarts N) and "
                "--save D --load D: a hung or frozen rank is ended by the hang watchdog "
                "(--hang-timeout), a dead one seen by torchrun, and the group restarts from the "
                "latest checkpoint"),
    "USE_DEEPEP_ACE": ("MT-DeepEP's preallocated permute buffers",
                       "not available; --moe-token-dispatcher-type flex "
                       "--moe-flex-dispatcher-backend deepep needs DeepEP"),
    "USE_CE_ALLTOALL": ("MT's copy-engine all-to-all for the MoE dispatcher",
                        "not available; the alltoall dispatcher uses the device's collectives"),
    "USE_MUSA_ROUTER": ("MT's router with --norm-before-router-softmax",
                        "not available; megatron-core's TopKRouter routes"),
    "ENABLE_PROFILER": ("MT's torch.profiler traces (PROFILER_* schedule, PROFILER_SAVE_DIR)",
                        "use upstream's --profile --use-pytorch-profiler --profile-step-start N "
                        "--profile-step-end M (traces under --tensorboard-dir)"),
    "ENABLE_ASYNC_CKPT": ("MT's DLRover flash checkpoint",
                          "use megatron-core's async writer: --async-save "
                          "--use-persistent-ckpt-worker with --ckpt-format torch_dist (and "
                          "--async-strategy mcore on megatron-core 0.19)"),
    "NO_LOSS_REDUCE": ("MT's single loss all-reduce per step instead of one per micro-batch",
                       "not available; the loss is reduced per micro-batch as upstream does (the "
                       "logged values are the same)"),
    "MLFLOW_TRACKING_URI": ("MT's MLflow logging of the training metrics",
                            "not available; use --tensorboard-dir or --wandb-project"),
}

#: name -> why setting it needs nothing here
HONOURED = {
    "ENABLE_ZERO_BUBBLE": "sets --enable-zero-bubble: the ZB-H1 schedule (weight-gradient GEMMs "
                          "held back into the pipeline's idle slots)",
    "USE_RECOMPUTE_VARIANCE": "the recompute flags (--attn-recompute, --mlp-recompute, "
                              "--recompute-variance, --mla-rms-recompute, --mlp-rms-recompute) "
                              "work without it",
    "USE_MUSA_MOE": "the device-level MoE losses and capacity (--moe-device-level-*, "
                    "--moe-comm-aux-loss-coeff) work without it",
    "ENABLE_D2H_IN_PERMUTATION": "MT-Megatron does not use it either",
    "CPU_OPTIMIZER_PRECISION_AWARE_RECONFIG": "offload keeps --use-precision-aware-optimizer as "
                                              "given",
}


def verdicts(settings, args=None, device: Optional[str] = None,
             max_restarts: Optional[int] = None) -> List[Verdict]:
    """One verdict per MT switch that is set (``args``/``device`` refine a few when known;
    ``max_restarts``: torchrun's, when the process runs under it)."""
    found = []
    for name, value in settings.mt_env:
        on = switched_on(value)
        if name == "USE_EPX" and on and max_restarts and (
                args is None or getattr(args, "hang_timeout", 0)):
            found.append(Verdict(name, value, True,
                                 f"torchrun restarts the group up to {max_restarts} times; the "
                                 f"hang watchdog ends a hung rank (--hang-timeout)"))
        elif name == "ENABLE_ASYNC_CKPT" and on and args is not None and getattr(
                args, "async_save", False) and getattr(args, "use_persistent_ckpt_worker", False):
            found.append(Verdict(name, value, True,
                                 "--async-save: megatron-core's async writer saves the "
                                 "checkpoints while training goes on"))
        elif name in MISSING:
            what, instead = MISSING[name]
            if on:
                found.append(Verdict(name, value, False, f"asks for {what}: {instead}"))
            else:
                found.append(Verdict(name, value, True, "off, as here"))
        elif name == "USE_RECOMPUTE_VARIANCE" and not on and args is not None and any(
                getattr(args, f, False) for f in ("attn_recompute", "mlp_recompute",
                                                  "recompute_variance", "mla_rms_recompute",
                                                  "mlp_rms_recompute")):
            found.append(Verdict(name, value, False,
                                 "MT-Megatron would ignore the fine-grained recompute flags; "
                                 "this layer applies them (drop them to train without)"))
        elif name == "CPU_OPTIMIZER_PRECISION_AWARE_RECONFIG" and not on and args is not None \
                and getattr(args, "optimizer_cpu_offload", False) \
                and getattr(args, "use_precision_aware_optimizer", False):
            found.append(Verdict(name, value, False,
                                 "MT-Megatron would drop --use-precision-aware-optimizer with "
                                 "--optimizer-cpu-offload; this layer keeps it (megatron-core "
                                 "requires it with offload)"))
        elif name == "ACCELERATOR_BACKEND":
            wanted = value.strip().lower()
            if device is None or wanted == device:
                found.append(Verdict(name, value, True, "the layer selects the device itself"))
            else:
                found.append(Verdict(name, value, False,
                                     f"this layer runs on {device} (MEGATRON_MUSA_PATCH_DEVICE="
                                     f"{settings.device}); set MEGATRON_MUSA_PATCH_DEVICE="
                                     f"{wanted} to insist"))
        else:
            found.append(Verdict(name, value, True, HONOURED.get(name, "nothing to do")))
    return found


def warning(found: List[Verdict]) -> Optional[str]:
    """The one start-up warning: every switch that is set and not honoured."""
    unmet = [v for v in found if not v.honoured]
    if not unmet:
        return None
    return ("megatron_musa_patch: warning: MT-Megatron environment switches that this layer "
            "does not honour: " + "; ".join(v.line() for v in unmet) + ".")


@hookimpl
def mmp_validate_args(args, session, device):
    state = session.state_for(FEATURE.name, dict)
    if state.get("warned") or not session.settings.mt_env or \
            session.why_unavailable(FEATURE.name) is not None:
        return
    state["warned"] = True
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS")
    text = warning(verdicts(session.settings, args, device.name,
                            int(restarts) if restarts and restarts.isdigit() else None))
    if text and session.is_rank_zero():
        print(text, file=sys.stderr, flush=True)
