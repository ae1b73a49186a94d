"""Start-up entry points kept outside the package, whose import activates the layer.

``megatron_musa_patch.pth`` calls :func:`pth_hook` in every Python process of the environment,
so it must cost nothing unless ``MEGATRON_MUSA_PATCH`` is set; the ``mmp`` console script uses
:func:`cli` to import the package without activating it in the launcher itself.
"""

import os
import sys

ENV = "MEGATRON_MUSA_PATCH"
AUTOACTIVATE_ENV = "MEGATRON_MUSA_PATCH_AUTOACTIVATE"


def wanted() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _is_torchrun_agent() -> bool:
    head = (getattr(sys, "orig_argv", None) or sys.argv or [])[:3]
    return any(a == "torch.distributed.run" or os.path.basename(a) in ("torchrun", "torchrun.exe")
               for a in head)


def pth_hook() -> None:
    """Activate in this process when MEGATRON_MUSA_PATCH is set (torchrun's agent excepted:
    its workers activate themselves)."""
    if not wanted() or _is_torchrun_agent():
        return
    if os.environ.get(AUTOACTIVATE_ENV) == "0":
        import megatron_musa_patch

        megatron_musa_patch._activate_on_import()
    else:
        import megatron_musa_patch  # noqa: F401 - importing activates


def cli() -> None:
    previous = os.environ.get(AUTOACTIVATE_ENV)
    os.environ[AUTOACTIVATE_ENV] = "0"
    try:
        from megatron_musa_patch.cli import main
    finally:
        if previous is None:
            os.environ.pop(AUTOACTIVATE_ENV, None)
        else:
            os.environ[AUTOACTIVATE_ENV] = previous
    sys.exit(main())
