"""``mmp checkpoint import-hf --hf-dir DIR --save OUT`` as the ``mmp`` script runs it, up to
the launch of its first Megatron step: prints that step's mode, the device row it is given and
whether the command's own process had imported torch by then, and ends there (the step's
worker would build the model)."""

import os
import subprocess
import sys

from _megatron_musa_patch_boot import cli


def launch(cmd, env=None, **kwargs):
    """In place of the step's process (``subprocess.Popen``)."""
    mode = cmd[cmd.index("--mode") + 1]
    print(f"step {mode} on {env['WORLD_SIZE']} rank(s), row {env['MEGATRON_MUSA_PATCH_DEVICE']}; "
          f"torch imported: {'torch' in sys.modules}", flush=True)
    os._exit(0)


subprocess.Popen = launch
sys.argv = ["mmp", "checkpoint", "import-hf", "--hf-dir", sys.argv[1], "--save", sys.argv[2]]
cli()
