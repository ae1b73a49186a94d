"""The check of a script's arguments that ``mmp run`` makes before any rank starts
(``args_check``): rank 0 of the job as far as arguments go, with the layer active, Megatron's
parser and its ``validate_args``.

Forked from the launcher (``main``), or ``python -m megatron_musa_patch.cli.args_check_worker
VERDICT_JSON SCRIPT ARGS...`` with ``MEGATRON_MUSA_PATCH_AUTOACTIVATE=0`` (it activates the layer
itself, to catch a refusal); the environment says the world size (``WORLD_SIZE``). Whatever
Megatron prints while it parses and validates is not shown: the ranks print it when they run.

The script's ``extra_args_provider`` and ``args_defaults`` are evaluated from the statements of
its module that bind them (a stock script's model and dataset imports cost a second and decide
nothing here); a refusal found that way is confirmed with the whole module, as a rank imports it,
so that a statement the first pass left out cannot cause one.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import inspect
import io
import os
import re
import runpy
import sys
import time
import traceback

from megatron_musa_patch.cli.megatron_entry import KEYS, Verdict, called_name, entry_call, \
    is_main_guard
from megatron_musa_patch.base.errors import MegatronMusaPatchError

PROG = "mmp run"
#: how Megatron's parse_args and validate_args refuse arguments (its assertions, and a help
#: string argparse cannot format); anything else (a device that fails) is left to the ranks
REFUSALS = (AssertionError, ValueError)


class _ParserError(Exception):
    def __init__(self, parser, message):
        super().__init__(message)
        self.parser = parser


def main(argv) -> int:
    out, script, *script_args = argv
    begin = time.monotonic()
    verdict = _check(os.path.abspath(script), script_args)
    verdict = Verdict(verdict.status, verdict.text, round(time.monotonic() - begin, 2),
                      verdict.megatron)
    with open(out, "w", encoding="utf-8") as f:
        f.write(verdict.to_json())
    return 0


def _check(path: str, script_args) -> Verdict:
    from megatron_musa_patch import activation

    try:
        session = activation.activate()
    except MegatronMusaPatchError as exc:
        return Verdict("refused", exc.render())
    release = session.versions().get("megatron-core") or ""
    sys.argv = [path, *script_args]
    script_dir = os.path.dirname(path)
    if script_dir not in sys.path:
        sys.path.append(script_dir)  # after site-packages, as run_worker puts it
    session.lm_path = activation.order_sys_path(session.lm_path)
    with open(path, encoding="utf-8") as f:
        call = entry_call(f.read())
    if call is None:
        return Verdict("unknown", "not a Megatron entry script", megatron=release)
    why_not = _why_not_parsed_by_megatron(call)
    if why_not:
        return Verdict("unknown", why_not, megatron=release)
    verdict = _with_namespace(path, call, release, whole=False)
    if verdict.status == "refused":  # confirmed with everything the module does
        verdict = _with_namespace(path, call, release, whole=True)
    return verdict


def _with_namespace(path: str, call, release: str, whole: bool) -> Verdict:
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            namespace = None
            if not whole:
                try:
                    namespace = _needed_part(path, call)
                    entry = _entry_arguments(call, namespace)
                except Exception:  # noqa: BLE001 - then the whole module, as a rank has it
                    namespace = None
            if namespace is None:
                namespace = runpy.run_path(path, run_name="__mmp_args_check__")
                entry = _entry_arguments(call, namespace)
    except Exception as exc:  # noqa: BLE001 - the ranks will say it, with their traceback
        return Verdict("unknown", f"loading the script failed: {type(exc).__name__}: {exc}",
                       megatron=release)
    return _parse_and_validate(*entry, release)


def _why_not_parsed_by_megatron(call) -> str:
    """Why the entry call does not parse Megatron's command line with Megatron's parser, or ""."""
    if any(kw.arg == "parsed_args" for kw in call.keywords):
        return "the script parses its arguments itself (parsed_args)"
    name = called_name(call)
    module = {"pretrain": "megatron.training.training",
              "initialize_megatron": "megatron.training.initialize"}.get(name)
    if module is not None and "extra_args_provider" not in _parameters(module, name):
        return f"{name} of this release does not parse the command line"
    return ""


def _parameters(module: str, function: str) -> set:
    """The parameters of ``module.function`` as its source declares them (importing
    megatron.training.training would cost the check a second)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return set()
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            a = node.args
            return {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return set()


def _needed_part(path: str, call) -> dict:
    """Run only the script's top-level statements that bind what the entry call's
    ``extra_args_provider`` and ``args_defaults`` use, and what those use in turn: a stock
    script's model and dataset imports cost the check a second and decide nothing here."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    wanted = set()
    for kw in call.keywords:
        if kw.arg in KEYS + ("ignore_unknown_args",):
            wanted |= _names_used(kw.value)
    if call.args and not set(KEYS) <= {kw.arg for kw in call.keywords}:
        # a positional one: the callee's signature says which (so the callee is needed too)
        wanted |= _names_used(call.func) | set().union(*(_names_used(a) for a in call.args))
    body = [node for node in tree.body
            if not (isinstance(node, ast.If) and is_main_guard(node.test))]
    chosen, todo = [], set(wanted)
    while todo:
        found = [node for node in body if node not in chosen and _binds(node) & todo]
        if not found:
            break
        chosen.extend(found)
        todo = set().union(*(_names_used(node) for node in found)) - set().union(
            *(_binds(node) for node in chosen))
    module = ast.Module(body=[node for node in body if node in chosen], type_ignores=[])
    namespace = {"__name__": "__mmp_args_check__", "__file__": path, "__builtins__": __builtins__}
    exec(compile(module, path, "exec"), namespace)
    return namespace


def _names_used(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _binds(node) -> set:
    """The module-level names a top-level statement may bind."""
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
        elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(inner.name)
        elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
            names.add(inner.id)
    return names


def _entry_arguments(call, namespace):
    """The script's ``extra_args_provider``, ``args_defaults`` and ``ignore_unknown_args``,
    evaluated in its module."""
    wanted = KEYS + ("ignore_unknown_args",)
    function = namespace.get(called_name(call) or "")
    nodes = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    if call.args and function is not None:
        try:
            params = list(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            params = []
        nodes.update({name: node for name, node in zip(params, call.args) if name in wanted})

    def value(name, default):
        node = nodes.get(name)
        if node is None:
            return default
        return eval(compile(_expression(node), "<entry call>", "eval"), namespace)

    return (value("extra_args_provider", None), value("args_defaults", {}) or {},
            bool(value("ignore_unknown_args", False)))


def _expression(node):
    return ast.fix_missing_locations(ast.Expression(body=node))


def _parse_and_validate(provider, defaults, ignore_unknown, release) -> Verdict:
    from megatron.training import arguments

    quiet = io.StringIO()
    original_error = argparse.ArgumentParser.error

    def error(parser, message):
        raise _ParserError(parser, message)

    argparse.ArgumentParser.error = error
    step = "parse_args fails on"
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            args = arguments.parse_args(provider, ignore_unknown_args=ignore_unknown)
        step = "validate_args refuses"
        if getattr(args, "use_checkpoint_args", False) or defaults.get("use_checkpoint_args"):
            return Verdict("ok", "parsed; validated by the ranks (--use-checkpoint-args)",
                           megatron=release)
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            if getattr(args, "yaml_cfg", None) is not None:
                from megatron.training.yaml_arguments import validate_yaml

                validate_yaml(args, defaults)
            else:
                arguments.validate_args(args, defaults)
    except _ParserError as exc:
        return Verdict("refused", _parser_paragraph(exc, release), megatron=release)
    except SystemExit as exc:  # --help (or --version): print it once, from here
        if exc.code in (0, None):
            return Verdict("printed", quiet.getvalue(), megatron=release)
        return Verdict("unknown", f"Megatron's parser exited {exc.code}", megatron=release)
    except MegatronMusaPatchError as exc:
        return Verdict("refused", exc.render(), megatron=release)  # as a rank would say it
    except REFUSALS as exc:  # Megatron's own refusal of these arguments
        return Verdict("refused", _validation_paragraph(exc, step, release), megatron=release)
    except Exception as exc:  # noqa: BLE001 - not about the arguments: the ranks will say it
        return Verdict("unknown", f"{step.split()[0]} failed: {type(exc).__name__}: {exc}",
                       megatron=release)
    finally:
        argparse.ArgumentParser.error = original_error
    return Verdict("ok", megatron=release)


def _ranks() -> str:
    world, local = os.environ.get("WORLD_SIZE", "1"), os.environ.get("LOCAL_WORLD_SIZE", "1")
    nodes = int(world) // max(int(local), 1)
    return f"{world} ranks ({nodes} node{'s' if nodes != 1 else ''} x {local})"


def _parser_paragraph(exc: _ParserError, release: str) -> str:
    message = str(exc)
    hints = []
    if message.startswith("unrecognized arguments:"):
        known = sorted(s for s in exc.parser._option_string_actions if s.startswith("--"))
        for flag in re.findall(r"(?<!\S)(--[\w-]+)", message):
            close = difflib.get_close_matches(flag.split("=", 1)[0], known, n=1, cutoff=0.8)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
    body = (f"{message} (Megatron's parser, megatron-core {release}, checked before any rank "
            f"started).")
    if hints:
        body += " " + " ".join(hints)
    return MegatronMusaPatchError(body).render(prog=PROG)


def _validation_paragraph(exc: Exception, step: str, release: str) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1] if frames else None
    said = str(exc).strip() or "(no message)"
    place = ""
    if where is not None:
        place = f" at {_short(where.filename)}:{where.lineno} in {where.name}"
    body = (f"Megatron's {step} these arguments for {_ranks()}, before any rank "
            f"started: {type(exc).__name__}{place}: {said} (megatron-core {release}).")
    return MegatronMusaPatchError(body).render(prog=PROG)


def _short(filename: str) -> str:
    marker = os.sep + "megatron" + os.sep
    return "megatron" + os.sep + filename.split(marker, 1)[1] if marker in filename else filename


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
