"""The package's layering (pyproject.toml, [tool.importlinter]) and no import cycles: imports
flow one way, from leaf helpers up to the command line, and no module reaches the session from
below (features get it handed through the hooks)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_layers_contract_is_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("import-linter is not installed: it is in the `test` extra "
                    "(pip install '.[test]')")
    proc = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "1 kept, 0 broken" in proc.stdout, proc.stdout[-4000:]


def test_no_module_imports_itself_through_others():
    import grimp

    graph = grimp.build_graph("megatron_musa_patch", cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            chain = graph.find_shortest_chain(importer=imported, imported=importer)
            if chain:
                cycles.append(" -> ".join((importer,) + chain))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:20])


def test_features_never_fetch_the_session():
    """``active_session()`` is for the public API, the CLI and tests; below activation the
    session arrives as a hook argument."""
    offenders = []
    for path in (REPO / "megatron_musa_patch").rglob("*.py"):
        rel = path.relative_to(REPO / "megatron_musa_patch").as_posix()
        if rel == "__init__.py" or rel.split("/")[0] in ("activation", "cli"):
            continue
        text = path.read_text()
        if "active_session" in text or "activation import" in text:
            offenders.append(rel)
    assert offenders == []


def _contract_layers():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return [name.strip() for layer in contract["layers"] for name in layer.split("|")]


def test_every_module_is_in_a_layer():
    """The contract checks the modules its layers name: a module outside all of them (a new
    root module, say) would be checked by nothing."""
    import grimp

    layers = _contract_layers()
    graph = grimp.build_graph("megatron_musa_patch", cache_dir=None)
    # the root and core's __init__ (a docstring, importing nothing) belong to no layer
    unlayered = {"megatron_musa_patch", "megatron_musa_patch.core"}
    assert not graph.find_modules_directly_imported_by("megatron_musa_patch.core")
    outside = sorted(m for m in graph.modules if m not in unlayered and not any(
        m == layer or m.startswith(layer + ".") for layer in layers))
    assert outside == []


def test_the_root_is_small():
    """A newcomer reads the package's root in one look: one package a layer (the logic layer's
    three), nothing loose but the package's own ``__init__``."""
    root = REPO / "megatron_musa_patch"
    entries = sorted(p.name for p in root.iterdir()
                     if p.name != "__pycache__" and not p.name.endswith((".so", ".pyd")))
    assert entries == ["__init__.py", "activation", "base", "checkpoint", "cli", "core", "data",
                       "device", "features", "lib", "upstream"]


def test_a_feature_is_named_by_its_module_path():
    """Every built-in feature's name (the toggles' and ``mmp patches``' name) is the dotted path
    of its module under features/, and every feature module is registered."""
    import pkgutil
    import importlib

    from megatron_musa_patch import features
    from megatron_musa_patch.core.feature import Feature

    declared = {}
    for info in pkgutil.walk_packages(features.__path__, features.__name__ + "."):
        module = importlib.import_module(info.name)
        if isinstance(getattr(module, "FEATURE", None), Feature):
            declared[module.FEATURE.name] = info.name
    assert declared, "no feature found"
    for name, module in declared.items():
        assert module == f"megatron_musa_patch.features.{name}", (name, module)
    assert sorted(m.FEATURE.name for m in features.BUILTIN) == sorted(declared)


def test_the_logic_knows_no_feature_name():
    """lib/ is the logic the features plug in; which feature serves what is the features' to
    say (lib.recompute asks through the ``require`` its feature binds). "device" is also the
    plain word (lib.offload counts host and device parameters)."""
    import ast

    from megatron_musa_patch.features import BUILTIN

    names = {m.FEATURE.name for m in BUILTIN} - {"device"}
    found = []
    for path in sorted((REPO / "megatron_musa_patch" / "lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert found == []
