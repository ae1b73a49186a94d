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
    (the launcher's records, ``activation.launcher``), and dlrover's standalone
    master is left alone. multiprocessing's
    helper processes activate when they first import torch or megatron (_ActivateOnFirstImport)."""
    if not wanted() or _started_as(TORCHRUN) or _started_as(DLROVER_MASTER):
        return
    try:
        _hook()
    except SystemExit as exc:  # a refusal, already said in one paragraph
        _exit_during_site(exc.code)
    except BaseException:  # noqa: BLE001 - site would go on without the layer, or abort
        import traceback

        traceback.print_exc()
        print(f"megatron_musa_patch: error: the start-up hook ({ENV}=1) failed to activate the "
              f"layer (the traceback above); unset {ENV} to run without it.", file=sys.stderr)
        _exit_during_site(1)


def _exit_during_site(code) -> None:
    """Leave from inside site's .pth processing: raising SystemExit there is reported by the
    interpreter as "Fatal Python error: init_import_site" with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(code if isinstance(code, int) else 1)


def _hook() -> None:
    if multiprocessing_helper():
        sys.meta_path.insert(0, _ActivateOnFirstImport())
        return
    for names, launcher in ((DLROVER_RUN, "dlrover-run"), (FT_LAUNCHER, "ft_launcher")):
        if _started_as(names):
            with _not_activating():
                from megatron_musa_patch.activation.launcher import activate_launcher_on_import
            activate_launcher_on_import(launcher)
            return
    _activate()


def multiprocessing_helper(argv=None) -> bool:
    """A process multiprocessing started: a spawn child, the resource tracker, the forkserver
    (their command lines are ``python -c "from multiprocessing.<module> import ..."``); this
    one, or the one started with ``argv``."""
    argv = list(argv if argv is not None else getattr(sys, "orig_argv", None) or [])
    return "-c" in argv[1:-1] and argv[argv.index("-c", 1) + 1].startswith("from multiprocessing.")


class _ActivateOnFirstImport:
    """Activates the layer when the process first imports torch or megatron, not at start-up.

    multiprocessing's helpers inherit MEGATRON_MUSA_PATCH. Some never import either (the resource
    tracker that a process using multiprocessing's locks or shared memory starts); some only
    later (the Manager server that dist_checkpointing's writer spawns on every rank imports torch
    when the first result reaches it, not while its rank waits for it to start). Activating at
    start-up costs each about 4 s of CPU (2 cores here). One that runs Megatron or torch code
    activates before that code runs, as its parent did: before megatron's package is found, right
    after torch's has run (activation imports torch itself)."""

    def __init__(self):
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if self.done or name not in ("torch", "megatron"):
            return None
        self.done = True  # once, and not for the imports activation makes
        import importlib.util

        if name == "megatron":
            _activate()
            return importlib.util.find_spec(name)  # through the finders activation added
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ActivatingLoader(spec.loader)
        return spec


class _ActivatingLoader:
    """torch's own loader, with the layer's activation once torch's package has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # as a plain import leaves them
        self.loader.exec_module(module)
        _activate()


def _activate() -> None:
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
    code = main()
    # what the command imported (export-hf's args bring torch and megatron-core) is left to the
    # process's end: the interpreter's last full collection over it took a second on 2 cores
    import gc

    gc.freeze()
    sys.exit(code)
