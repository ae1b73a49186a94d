"""dlrover-run's agent, stood in: the test copies this file to a script named ``dlrover-run``
(the start-up hook tells the launcher by the script's name) and runs it with a fake
``dlrover.trainer.torch.elastic_run`` on PYTHONPATH. Prints whether the layer is active, what
the run returned and what mmp run's supervision was given (``active ...``), then
MEGATRON_MUSA_PATCH_AUTOACTIVATE as the agent left it (``autoactivate ...``).

Run by tests/activation/test_launcher_hooks.py."""

import contextlib
import os
import types

import megatron_musa_patch
from dlrover.trainer.torch import elastic_run

from megatron_musa_patch.lib.elastic import supervision

seen = {}


def supervised(state, script_args, max_restarts, elastic, **said):
    """supervision.supervised, recording what it was given."""
    seen.update(said, script_args=script_args, max_restarts=max_restarts, elastic=elastic,
                state=type(state).__name__)
    return contextlib.nullcontext()


def main():
    supervision.supervised = supervised
    result = elastic_run.run(types.SimpleNamespace(training_script_args=["--save", "d"],
                                                   max_restarts=3))
    print("active", megatron_musa_patch.is_active(), "result", result, "seen",
          sorted(seen.items()))
    print("autoactivate", os.environ.get("MEGATRON_MUSA_PATCH_AUTOACTIVATE"))


if __name__ == "__main__":
    main()
