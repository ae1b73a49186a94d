"""The training log's first line of a job, when it falls on a log interval.

Megatron-LM logs the first iteration of every job (to show the start-up cost) and, so that the
next regular line still averages its whole interval, does not reset its loss accumulator and
interval timer after it (``training_log``: ``should_reset = not is_first_iteration``). When that
first iteration is itself on the log interval -- always with ``--log-interval 1``, and for a job
resumed from a checkpoint at a multiple of the interval minus one -- its line *is* a regular one,
yet nothing is reset: the job's next line prints the mean of two intervals. A resumed run's curve
then differs from the uninterrupted run's at exactly that line, although parameters and every
other loss are bitwise equal.

The fix tells ``training_log`` that such an iteration is not a first iteration: it is logged as the
regular line it is, and the accumulators are reset after it, so every printed ``lm loss`` is the
mean of exactly the iterations of its interval. A first iteration off the interval is logged and
not reset, as upstream does.
"""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "a job's first logged iteration on the log interval resets the loss accumulator")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.training.training:training_log", "wrap", _training_log,
        why="a first iteration on the log interval is a regular log line: reset after it"))


def _training_log(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    if call.get("is_first_iteration"):
        interval = getattr(args_read_by("megatron.training.training"), "log_interval", None)
        if interval and call["iteration"] % interval == 0:
            call["is_first_iteration"] = False
            return wrapped(**call)
    return wrapped(*args, **kwargs)
