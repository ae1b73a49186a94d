"""What ``mmp run`` starts in every rank: activate, then run the user's script as ``__main__``.

``python -m megatron_musa_patch.cli.run_worker --script PATH ARGS...`` or ``--module NAME ARGS...``.
(``mmp selftest`` starts ``selftest_worker`` instead.)
"""

import os
import runpy
import sys

import megatron_musa_patch  # noqa: F401 - importing activates (a user error exits cleanly)
from megatron_musa_patch.activation import active_session, order_sys_path


def main(argv):
    mode, target, *rest = argv
    if mode == "--module":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(target)
    sys.argv = [path, *rest]
    # `python -m` put the working directory first on sys.path; `torchrun SCRIPT` would not, and
    # a directory there named like a package (tensorboard/, say) would shadow it
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    # the script's own imports (gpt_builders, model_provider) resolve from its directory, which
    # goes after site-packages so a checkout's megatron/core does not shadow pip's
    script_dir = os.path.dirname(path)
    if script_dir not in sys.path:
        sys.path.append(script_dir)
    session = active_session()
    session.lm_path = order_sys_path(session.lm_path)
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
