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
        if rel.split("/")[0] in ("activation.py", "__init__.py", "cli.py", "launch.py",
                                 "selftest.py", "run_worker.py", "selftest_worker.py"):
            continue
        text = path.read_text()
        if "active_session" in text or "activation import" in text:
            offenders.append(rel)
    assert offenders == []
