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


#: how a launcher's own process is started (the script's name, or the module of ``python -m``)
TORCHRUN = ("torchrun", "torch.distributed.run")
DLROVER_RUN = ("dlrover-run", "dlrover.trainer.torch.main", "dlrover.trainer.torch.elastic_run")
DLROVER_MASTER = ("dlrover.python.master.main",)
FT_LAUNCHER = ("ft_launcher", "nvidia_resiliency_ext.fault_tolerance.launcher")


def _entry() -> str:
    """What this interpreter was started to run: the -m module, or the script's file name."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if not argv:
        return os.path.basename(sys.argv[0]) if sys.argv else ""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-c":
            return ""
        if arg == "-m" or (arg.startswith("-") and not arg.startswith("--") and arg.endswith("m")):
            return argv[i + 1] if i + 1 < len(argv) else ""
        if arg in ("-W", "-X"):  # options that take a value
            i += 2
            continue
        if arg.startswith("-") and arg != "-":
            i += 1
            continue
        return os.path.basename(arg)
    return ""


def _started_as(names) -> bool:
    entry = _entry()
    return entry in names or entry.rsplit(".", 1)[0] in names  # torchrun.exe, dlrover-run.py


def pth_hook() -> None:
    """Activate in this process when MEGATRON_MUSA_PATCH is set. A launcher's agent does not
    activate (its workers activate themselves): torchrun's is left alone, dlrover-run's and
    nvidia-resiliency-ext's ft_launcher get what ``mmp run`` gives torchrun
    (``launch.supervise``), and dlrover's standalone master is left alone."""
    if not wanted() or _started_as(TORCHRUN) or _started_as(DLROVER_MASTER):
        return
    for names, launcher in ((DLROVER_RUN, "dlrover-run"), (FT_LAUNCHER, "ft_launcher")):
        if _started_as(names):
            with _not_activating():
                from megatron_musa_patch.cli.launch import supervise
            supervise(launcher)
            return
    import megatron_musa_patch  # activates, unless MEGATRON_MUSA_PATCH_AUTOACTIVATE is off

    megatron_musa_patch._activate_on_import()  # a no-op where the import activated


class _not_activating:
    """Import the package without activating it in this process (the variable is restored, so
    processes started later do activate)."""

    def __enter__(self):
        self.previous = os.environ.get(AUTOACTIVATE_ENV)
        os.environ[AUTOACTIVATE_ENV] = "0"

    def __exit__(self, *exc):
        if self.previous is None:
            os.environ.pop(AUTOACTIVATE_ENV, None)
        else:
            os.environ[AUTOACTIVATE_ENV] = self.previous


def cli() -> None:
    with _not_activating():
        from megatron_musa_patch.cli.main import main
    sys.exit(main())
