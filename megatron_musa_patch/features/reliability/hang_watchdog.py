"""A rank that stops making progress in training is ended within ``--hang-timeout`` seconds.

Under torchrun (``mmp run`` or any route), every rank arms a deadline when a training step, a
checkpoint save or an evaluation begins, and one for reaching the next step when it ends
(``elastic/watchdog.py``: the standard library's faulthandler writes the rank's stacks and exits
it). The elastic agent then sees a failed rank and, with ``--max-restarts``, restarts the group,
which resumes from the latest checkpoint (``--load``). Megatron's own ``--distributed-timeout-
minutes`` (10 by default) bounds only a wait inside a collective; this bounds a rank hung
anywhere, and the peers waiting for it.

A step, save or evaluation may take ``--hang-timeout`` seconds (default 60) or twice the slowest
of its kind so far, whichever is longer; the first of each kind (the first step warms up) may
take ``--hang-timeout-first`` (default 600). ``--hang-timeout 0`` switches it off.
"""

from __future__ import annotations

import functools
import os

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.lib.elastic.watchdog import Deadlines, Watchdog
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.core.feature import feature

# after throughput: its deadline wraps train() inside throughput's wrapper
FEATURE = feature(
    __name__,
    "a rank that stops making progress ends itself (with its stack) within --hang-timeout, so "
    "torchrun can restart the group",
    after=("logs.throughput",),
    aliases=("hang_watchdog",))


TRAINING = "megatron.training.training"
#: set by torchrun (any elastic agent) in each rank's environment
AGENT_ENV = "TORCHELASTIC_RUN_ID"


@hookimpl
def mmp_register_patches(session, registry):
    state = session.state_for(FEATURE.name)
    report_dir = session.settings.watchdog_dir

    def add(pid, name, impl, why):
        registry.add(FEATURE.patch(pid, f"{TRAINING}:{name}", "wrap",
                                   functools.partial(impl, state, report_dir), why=why))

    add("train", "train", _train, "the training loop arms the deadline of reaching each step")
    add("train_step", "train_step", _train_step, "a training step has a deadline")
    add("save", "save_checkpoint_and_time", _save, "a checkpoint save has a deadline")
    add("evaluate", "evaluate_and_print_results", _evaluate, "an evaluation has a deadline")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("hang watchdog (megatron_musa_patch)")
    group.add_argument(
        "--hang-timeout", type=float, default=60.0, metavar="SECONDS",
        help="Under torchrun, a rank that has not finished a training step, checkpoint save or "
             "evaluation within this many seconds (or twice the slowest of its kind so far, if "
             "longer), or not begun the next step this long after one, writes its stack and "
             "exits, so that torchrun --max-restarts restarts the group. 0: off. Default 60.")
    group.add_argument(
        "--hang-timeout-first", type=float, default=600.0, metavar="SECONDS",
        help="The same for the first training step, the first save and the first evaluation "
             "of a run (warm-up, compilation). Default 600.")


@hookimpl
def mmp_validate_args(args):
    for flag in ("hang_timeout", "hang_timeout_first"):
        value = getattr(args, flag, None)
        if value is not None and not value >= 0:
            raise ArgumentError(
                f"--{flag.replace('_', '-')} must be a number of seconds >= 0, not {value} "
                f"(--hang-timeout 0 switches the hang watchdog off).")


def _train(state, report_dir, wrapped, instance, args, kwargs):
    margs = args_read_by(TRAINING)
    timeout = getattr(margs, "hang_timeout", 0.0)
    watchdog = None
    if timeout and os.environ.get(AGENT_ENV):
        watchdog = state.get("watchdog")
        if watchdog is None:
            deadlines = Deadlines(timeout, getattr(margs, "hang_timeout_first", 600.0))
            watchdog = state["watchdog"] = Watchdog.for_rank(deadlines, margs.rank, report_dir)
        watchdog.in_loop = True
        watchdog.arm(watchdog.deadlines.allowed("step"), "training loop, before its first step")
    try:
        return wrapped(*args, **kwargs)
    finally:
        if watchdog is not None:
            watchdog.in_loop = False
            watchdog.cancel()


def _guarded(state, kind, where, wrapped, args, kwargs):
    watchdog = state.get("watchdog")
    if watchdog is None:
        return wrapped(*args, **kwargs)
    with watchdog.section(kind, where):
        return wrapped(*args, **kwargs)


def _train_step(state, report_dir, wrapped, instance, args, kwargs):
    iteration = getattr(args_read_by(TRAINING), "curr_iteration", None)
    where = "training step" if iteration is None else f"training step of iteration {iteration + 1}"
    return _guarded(state, "step", where, wrapped, args, kwargs)


def _save(state, report_dir, wrapped, instance, args, kwargs):
    iteration = call_arguments(wrapped, args, kwargs).get("iteration")
    return _guarded(state, "save", f"checkpoint save of iteration {iteration}", wrapped, args,
                    kwargs)


def _evaluate(state, report_dir, wrapped, instance, args, kwargs):
    prefix = call_arguments(wrapped, args, kwargs).get("prefix")
    return _guarded(state, "evaluate", f"evaluation ({prefix})", wrapped, args, kwargs)
