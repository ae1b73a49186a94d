"""``--wait-after-ckpt S``: after each checkpoint save, every rank waits S seconds before training
on (MT-Megatron's flag; its tutorial: "the time to wait after each checkpoint save, in
seconds"), e.g. to let a network file system settle. 0 (the default) does not wait.

``megatron.training.checkpointing.save_checkpoint`` is wrapped (every save goes through it: the
periodic, signal-triggered and exit saves of ``save_checkpoint_and_time`` and the final one after
training, which ``pretrain`` calls directly; ``training.py`` imports the wrapped function); rank
0 says how long it waited.
"""

from __future__ import annotations

import functools
import os
import time

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.core.feature import feature

# after no_rewrite_of_loaded: the wait sits inside that feature's wrapper of save_checkpoint
FEATURE = feature(
    __name__,
    "--wait-after-ckpt S: wait S seconds after each checkpoint save (MT-Megatron)",
    after=("reliability.checkpoint_safety.no_rewrite_of_loaded",))

CHECKPOINTING = "megatron.training.checkpointing"


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("checkpointing (MT-Megatron spellings)")
    group.add_argument("--wait-after-ckpt", type=float, default=0.0,
                       help="Seconds every rank waits after each checkpoint save (0: none).")


@hookimpl
def mmp_validate_args(args):
    wait = getattr(args, "wait_after_ckpt", 0.0)
    if wait < 0:
        raise ArgumentError(f"--wait-after-ckpt {wait:g}: give the seconds to wait after each "
                            f"checkpoint save, 0 or more.")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch("save", f"{CHECKPOINTING}:save_checkpoint",
                               "wrap", functools.partial(after_save, time.sleep),
                               rebind=("megatron.training.training", "megatron.training.utils"),
                               why="--wait-after-ckpt: wait after each checkpoint save"))


def after_save(sleep, wrapped, instance, args, kwargs, *, get_args=None):
    result = wrapped(*args, **kwargs)
    megatron_args = get_args() if get_args is not None else args_read_by(CHECKPOINTING)
    wait = float(getattr(megatron_args, "wait_after_ckpt", 0.0) or 0.0)
    if wait > 0:
        sleep(wait)
        if os.environ.get("RANK", "0") == "0":
            iteration = call_arguments(wrapped, args, kwargs).get("iteration")
            print(f"megatron_musa_patch: --wait-after-ckpt: waited {wait:g} s after saving the "
                  f"checkpoint of iteration {iteration}", flush=True)
    return result
