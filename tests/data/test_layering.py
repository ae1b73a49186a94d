"""Imports inside megatron_musa_patch/data flow one way: each module imports only modules of
lower layers, function-level imports included (a lazy import is still a dependency; one of those
hid the old encode -> tokenizer -> writer -> encode cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "megatron_musa_patch" / "data"

#: bottom to top; a module may import modules of the layers below its own, not of its own or above
LAYERS = [
    {"errors", "types", "indexfile", "manifest", "progress", "reference", "bytelevel"},
    {"inputs", "tokenizer", "writer", "splits"},
    {"light", "train_tokenizer", "blend"},
    {"encode"},
    {"prepare"},
    {"cli"},
]


def imports_of(path: Path, modules: set) -> dict:
    """{imported data module: line} for every import in ``path`` that names one of ``modules``
    (relative or absolute, at module level or inside functions)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:          # from .x import y
                names.append(node.module.split(".")[0])
            elif node.level == 1:                         # from . import x, y
                names.extend(a.name for a in node.names)
            elif node.level == 0 and (node.module or "").startswith("megatron_musa_patch.data."):
                names.append(node.module.split(".")[2])
            elif node.level == 0 and node.module == "megatron_musa_patch.data":
                names.extend(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.extend(a.name.split(".")[2] for a in node.names
                         if a.name.startswith("megatron_musa_patch.data."))
        for name in names:
            if name in modules:
                found.setdefault(name, node.lineno)
    return found


def graph():
    modules = {p.stem for p in DATA.glob("*.py") if p.stem != "__init__"}
    return modules, {m: imports_of(DATA / f"{m}.py", modules) for m in modules}


def test_every_module_has_a_layer():
    modules, _ = graph()
    placed = set().union(*LAYERS)
    assert modules == placed, (f"not in LAYERS: {sorted(modules - placed)}; "
                               f"gone: {sorted(placed - modules)}")


def test_imports_flow_down():
    _, deps = graph()
    layer = {m: i for i, group in enumerate(LAYERS) for m in group}
    wrong = [f"{m} (layer {layer[m]}) imports {d} (layer {layer[d]}) at line {line}"
             for m, ds in sorted(deps.items()) for d, line in sorted(ds.items())
             if layer[d] >= layer[m]]
    assert not wrong, "imports that do not flow down:\n" + "\n".join(wrong)


def test_no_cycles():
    _, deps = graph()
    state = {}

    def visit(m, stack):
        if state.get(m) == "done":
            return
        if state.get(m) == "open":
            cycle = stack[stack.index(m):] + [m]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        state[m] = "open"
        for d in sorted(deps[m]):
            visit(d, stack + [m])
        state[m] = "done"

    for m in sorted(deps):
        visit(m, [])


def test_the_checker_sees_lazy_imports(tmp_path):
    """The old cycle went through a function-level import: the parser must see those."""
    (tmp_path / "a.py").write_text("def f():\n    from .b import x\n    from . import c\n")
    assert imports_of(tmp_path / "a.py", {"b", "c", "d"}) == {"b": 2, "c": 3}
