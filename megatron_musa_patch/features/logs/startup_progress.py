"""Rank 0 says what it is doing whenever it has printed nothing for 5 s while it starts.

Between a launch and the first iteration a rank imports torch and Megatron, joins the process
group, builds the model, the optimizer and the datasets' indices, and runs a first step that may
compile; on a small machine any of these can take tens of seconds without a line. Here rank 0 (of
a job started by torchrun, ``mmp run`` or another elastic agent) prints
``megatron_musa_patch: rank 0 is <what> (<s> s since its start)`` after each 5 s without output,
from its main thread's stack (``lib/heartbeat.py``), until its first training step is done (or,
in a loop of the script's own, its first optimizer step).
Output is noticed through ``sys.stdout``/``sys.stderr``, which rank 0 writes through a proxy.
"""

from __future__ import annotations

import functools
import os
import sys

from megatron_musa_patch.lib.elastic import reports
import _megatron_musa_patch_boot as boot  # the start-up hook's own test of a helper process

from megatron_musa_patch.lib.heartbeat import QUIET_S, Heartbeat, NoticingStream, \
    describe_stack, main_thread_frame, say
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "rank 0 says what it is doing (importing, initialising, building the model or the data, "
    "the first step) after each 5 s without output while it starts",
    aliases=("startup_progress",))

#: a script that never calls Megatron's train_step is not followed longer than this
MOST_S = 1800.0

#: Megatron's functions on a starting rank's stack, innermost first wins (the names are the same
#: on every supported release; a missing one only makes the line less specific)
PHASES = {
    "parse_args": "parsing the arguments",
    "validate_args": "checking the arguments",
    "_initialize_distributed": "joining the process group (torch.distributed)",
    "_compile_dependencies": "preparing Megatron's dataset helpers and fused kernels",
    "initialize_megatron": "initialising Megatron",
    "load_checkpoint": "loading the checkpoint",
    "setup_model_and_optimizer": "building the model and the optimizer",
    "build_train_valid_test_data_iterators": "building the datasets and their sample indices",
    "train_step": "running the first training step",
    "evaluate": "evaluating",
    "save_checkpoint": "saving a checkpoint",
}


def launched_rank_zero():
    """Condition: rank 0 of a job an elastic agent started, itself (not ``mmp doctor``, not a
    script run by hand, not a helper process it starts, which inherits its environment)."""
    if os.environ.get("RANK") != "0" or "LOCAL_RANK" not in os.environ:
        return "not rank 0 of a job started by torchrun or another elastic agent"
    if boot.multiprocessing_helper():  # a forked one has no thread of its parent's
        return "a helper process of rank 0 (multiprocessing), not the rank"
    return True


@hookimpl
def mmp_register_patches(session, registry):
    heartbeat = Heartbeat(say, _describe, most_s=MOST_S)
    for name in ("stdout", "stderr"):
        registry.add(FEATURE.patch(
            name, f"sys:{name}", "attribute",
            NoticingStream(getattr(sys, name), heartbeat.written),
            condition=launched_rank_zero,
            why=f"rank 0's {name} notices output, so a progress line comes only after "
                f"{QUIET_S:.0f} s without one"))
    registry.add(FEATURE.patch(
        "first_step", "megatron.training.training:train_step", "wrap",
        functools.partial(_train_step, heartbeat), condition=launched_rank_zero,
        why="the progress lines end with the first training step"))
    if registry.toggles.is_off(FEATURE.name) or boot.multiprocessing_helper():
        return
    report_dir = session.settings.watchdog_dir
    # the lines themselves come from a thread of rank 0, started with the layer; the launcher's
    # own lines stop once this node's first rank is up
    if launched_rank_zero() is True:
        said = reports.launcher_last_line(report_dir)
        if said is not None:
            heartbeat.written_at(said)  # its next line is due 5 s after the launcher's last
        heartbeat.start()
        _end_at_the_first_optimizer_step(heartbeat)
    if os.environ.get("LOCAL_RANK") == "0":
        reports.mark_rank_started(report_dir)


def _describe(elapsed: float) -> str:
    frame = main_thread_frame()
    what = describe_stack(frame, PHASES) if frame is not None else "starting"
    return f"megatron_musa_patch: rank 0 is {what} ({elapsed:.0f} s since its start)"


def _end_at_the_first_optimizer_step(heartbeat: Heartbeat) -> None:
    """A training loop of the script's own (megatron-core without Megatron-LM's train_step)
    has started once an optimizer stepped: torch's hook after every optimizer's step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: heartbeat.stop())


def _train_step(heartbeat, wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    finally:
        heartbeat.stop()
