"""The ``mmp`` command: run | doctor | patches | selftest | data | checkpoint | plan."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import List, Optional

from megatron_musa_patch.base.errors import MegatronMusaPatchError

USAGE = """mmp <command> [options]       (mmp --version: this package's release)

commands:
  run [torchrun options] SCRIPT [ARGS]   run a training script with the layer active in every rank
  doctor [--all]                         device, versions, and every patch with its status
  patches [--json] [--resolve-all [--strict]]
                                         the patch table (machine-readable with --json); with
                                         --resolve-all every record's target on this release,
                                         with --strict an error for any record unverified on it
  selftest [--layouts tp2,pp2,dp2,...]   tiny megatron-core GPT on this device, checked against 1 rank
  data ...                               tokenize, binarize and blend training data
  checkpoint import-hf|export-hf ...     Hugging Face models in and out of Megatron checkpoints
  plan [--device D] [--search] SCRIPT ARGS   memory per rank and step time of a run, before it starts
"""


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a usage error, as argparse has it: the usage on stderr, status 2
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("--version", "-V", "version"):
        from megatron_musa_patch.base.version import __version__

        print(f"mmp (megatron-musa-patch) {__version__}")
        return 0
    try:
        if command == "run":
            from .launch import run

            return run(rest)
        if command in ("doctor", "patches"):
            return _doctor(command, rest)
        if command == "selftest":
            from .selftest import main as selftest

            return selftest(rest)
        if command == "checkpoint":
            from megatron_musa_patch.checkpoint.cli import main as checkpoint

            return checkpoint(rest)
        if command == "plan":
            from .plan import main as plan

            return plan(rest)
        if command == "data":
            try:
                data_cli = importlib.import_module("megatron_musa_patch.data.cli")
            except ImportError as exc:
                raise MegatronMusaPatchError(f"`mmp data` is unavailable: {exc}") from exc
            return data_cli.main(rest)
    except MegatronMusaPatchError as exc:
        print(exc.render(prog=program(command, rest)), file=sys.stderr)
        return exc.exit_code
    print(f"{USAGE}\nmmp: error: unknown command {command!r}", file=sys.stderr)
    return 2


def program(command: str, rest: List[str]) -> str:
    """The command as typed, as argparse names it in its errors: ``mmp data prepare``."""
    verb = rest[:1] if command in ("data", "checkpoint") and rest and \
        not rest[0].startswith("-") else []
    return " ".join(["mmp", command, *verb])


#: what each command's exit status means (``--help`` says it, docs/reference/cli.md lists it)
EXIT_STATUS = {
    "doctor": "Exit status: 0 the report was printed; 2 the layer refused to activate (one "
              "paragraph: the setting, release or patch, and what to do).",
    "patches": "Exit status: 0 the table was printed; 1 with --resolve-all, a record meant for this "
               "release does not resolve (with --strict: or was not verified on it); 2 the layer "
               "refused to activate, or a bad option.",
}
DESCRIPTIONS = {
    "doctor": "The device, the installed releases, the torch mapping, and every patch of the "
              "layer with its status and why.",
    "patches": "The patch table: one row per logical patch (--all: per record), machine-readable "
               "with --json; --resolve-all checks every record's target on the installed "
               "release, whatever the device.",
}


def doctor_parser(command: str = "doctor") -> argparse.ArgumentParser:
    """``mmp doctor`` and ``mmp patches`` (one parser: the same report, two defaults)."""
    parser = argparse.ArgumentParser(prog=f"mmp {command}", description=DESCRIPTIONS[command],
                                     epilog=EXIT_STATUS[command])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--all", action="store_true", help="one row per patch (no grouping)")
    parser.add_argument("--no-import", action="store_true",
                        help="do not import Megatron's modules (their patches stay deferred)")
    parser.add_argument("--resolve-all", action="store_true",
                        help="resolve every record's target on the installed release, whatever "
                             "the device (MUSA- and CUDA-only records too); exit 1 if one meant "
                             "for this release does not resolve")
    parser.add_argument("--strict", action="store_true",
                        help="with --resolve-all: exit 1 also if a record meant for this release "
                             "was not verified on it (a release the support tables gained since, "
                             "or one outside them under MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED)")
    return parser


def parsers() -> dict:
    """Every command's parser, by command (the CLI reference is generated from these)."""
    from megatron_musa_patch.checkpoint.cli import parser as checkpoint_parser
    from megatron_musa_patch.data.cli import parser as data_parser

    from .launch import parser as run_parser
    from .plan import parser as plan_parser
    from .selftest import parser as selftest_parser

    return {"run": run_parser(), "doctor": doctor_parser("doctor"),
            "patches": doctor_parser("patches"), "selftest": selftest_parser(),
            "data": data_parser(), "checkpoint": checkpoint_parser(), "plan": plan_parser()}


def _doctor(command: str, rest: List[str]) -> int:
    parser = doctor_parser(command)
    opts = parser.parse_args(rest)
    if opts.strict and not opts.resolve_all:
        parser.error("--strict goes with --resolve-all")

    from megatron_musa_patch import activation
    from megatron_musa_patch.core import table

    state = activation.activate()
    if not opts.no_import:
        _import_targets(state)
    from megatron_musa_patch.activation.launcher import LAUNCHER_PROCESSES, launcher_side

    launcher = launcher_side(state.settings, state.plugins).registry
    launcher.preview(LAUNCHER_PROCESSES)
    launcher_rows = launcher.results()
    if opts.resolve_all:
        resolved = table.resolutions(state.registry) + table.resolutions(launcher)
        if opts.json:
            print(json.dumps({**table.as_json(state), "resolutions": resolved,
                              "launcher_patches": [r.as_dict() for r in launcher_rows]},
                             indent=2))
        else:
            print(table.render_resolutions(resolved))
        failing = table.unresolved(resolved) + (table.unverified(resolved) if opts.strict
                                                else [])
        return 1 if failing else 0
    if opts.json:
        print(json.dumps({**table.as_json(state),
                          "launcher_patches": [r.as_dict() for r in launcher_rows]}, indent=2))
    else:
        if command == "doctor":
            for name, value in state.versions().items():
                print(f"{name:20} {value or 'not installed'}")
            changed = state.settings.changed()
            print(f"{'settings':20} " + (", ".join(f"{k}={v}" for k, v in changed.items())
                                         or "defaults (no MEGATRON_MUSA_PATCH_* variable set)"))
            from megatron_musa_patch.features.mt_megatron import env_switches

            for verdict in env_switches.verdicts(state.settings, device=state.device.name):
                print(f"{'MT-Megatron switch':20} "
                      f"{'honoured' if verdict.honoured else 'NOT honoured'}: {verdict.line()}")
            from megatron_musa_patch.lib.ops import kernels

            print(f"{'torch mapping':20} "
                  f"{state.torch_mapping.describe(state.registry.results())}")
            print(f"{'csrc kernels':20} {kernels.status(state.device.torch_type)}")
            print(f"{'memory statistics':20} {state.device.memory_stats}\n")
        print(table.render_table(state, collapse=not opts.all))
        print("\n" + table.render_launcher_table(launcher_rows))
    return 1 if any(r.status == "failed" for r in state.registry.results() + launcher_rows) \
        else 0


def _import_targets(state) -> None:
    """Import every module a patch targets, so each row shows applied / skipped / failed."""
    waiting = {r.target.split(":", 1)[0] for r in state.registry.results() if r.status == "deferred"}
    for module in sorted(waiting):
        if module.split(".")[0] not in ("megatron", "torch"):
            continue  # not what the layer patches (torchada: its guard refuses the import)
        if module.startswith(("megatron.training", "megatron.legacy")) and state.lm_path is None \
                and not _ships_training():
            continue
        try:
            importlib.import_module(module)
        except MegatronMusaPatchError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, not fatal, for a diagnostic command
            print(f"mmp doctor: warning: importing {module} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)


def _ships_training() -> bool:
    from megatron_musa_patch.upstream import installed, ranges, tables

    release = ranges.row_of(tables.MEGATRON, installed.megatron_core_version())
    return release is not None and release.training_from == "wheel"


if __name__ == "__main__":
    sys.exit(main())
