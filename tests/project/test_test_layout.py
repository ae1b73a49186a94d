"""The test tree is sorted by what it tests (docs/contributing.md, "Where tests go"): its folders
mirror the package, cost is a marker rather than a folder, test workers drive the one tiny-GPT
harness (tests/harness/tiny_gpt.py) rather than the shipped selftest worker, and programs run in
a subprocess are real modules (probes, workers), not Python in string literals."""

import ast

from tests.conftest import REPO

TESTS = REPO / "tests"
#: the top-level folders of tests/: the package's subjects, then whole runs and the repository
SUBJECTS = {"core", "upstream", "device", "lib", "features", "data", "checkpoint", "cli",
            "activation", "training", "examples", "benchmarks", "tools", "project", "harness",
            "fixtures"}
#: folders named for cost, which markers replaced
COST_FOLDERS = {"unit", "stock", "gpu", "slow", "integration"}


def _python_files():
    return [p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts]


def test_top_level_folders_are_subjects_not_costs():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= SUBJECTS, f"tests/ folders outside the subjects: {sorted(folders - SUBJECTS)}"
    assert not folders & COST_FOLDERS


def test_every_test_folder_is_a_package():
    """Two test files may share a name in different folders (features/offload/cpu_offload/test_flags.py,
    features/fused_ops/test_flags.py) only if each folder is a package."""
    missing = sorted(str(p.parent.relative_to(REPO)) for p in _python_files()
                     if not (p.parent / "__init__.py").exists())
    assert not missing, f"folders without __init__.py: {sorted(set(missing))}"


def test_tests_do_not_import_the_shipped_selftest_worker():
    """The selftest worker is a program; tests drive its model through tests/harness/tiny_gpt.py
    (which imports megatron_musa_patch.cli.tiny_gpt, the model both share)."""
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            if any("selftest_worker" in n for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_one_harness_launches_the_workers():
    """Each torchrun worker of the test tree is launched through the harness (``torchrun``)."""
    workers = sorted(p for p in _python_files() if p.name.endswith("_worker.py"))
    assert workers, "no workers found: the test's glob is stale"
    launched_by_hand = [str(p.relative_to(REPO)) for p in _python_files()
                        if p.name.startswith("test_") and "torch.distributed.run" in p.read_text()
                        and any(w.stem in p.read_text() for w in workers)]
    assert not launched_by_hand, launched_by_hand


def _program_literals(path):
    """(line, first line) of each string literal in ``path`` that is a program: four or more
    lines, one of them an import or a def. Docstrings are prose, not programs."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        parts = ([node] if isinstance(node, ast.Constant) and isinstance(node.value, str) else
                 [v for v in node.values if isinstance(v, ast.Constant)]
                 if isinstance(node, ast.JoinedStr) else [])
        if isinstance(node, ast.Constant) and id(node) in docstrings:
            continue
        text = "".join(p.value for p in parts if isinstance(p.value, str))
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) >= 4 and any(line.startswith(("import ", "def ")) or
                                   (line.startswith("from ") and " import " in line)
                                   for line in lines):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[0][:60]}")
    return found


def test_no_programs_in_string_literals():
    """A program a test runs in a subprocess is a module (a probe beside its test, run with
    ``tests.conftest.run_probe``; a worker run with the harness's ``torchrun``): it can be read,
    linted, and run by hand."""
    found = [hit for path in _python_files() for hit in _program_literals(path)]
    assert not found, "\n".join(found)
