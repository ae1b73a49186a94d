"""Device facts live in the device table (``device/rows.py``): outside ``device/``, no module
spells a row's name ("musa", "cpu", "cuda") except where the string is torch's own vocabulary
(a tensor's ``.device.type``, ``torch.device(...)``, ``map_location=``, ``device=``, a Tensor
method's name) or a flag's help text. A record for some rows says ``devices=OFF_CUDA`` or
``frozenset({CPU.name})``; the framework (``core/``) takes the rows it is handed."""

import ast
from pathlib import Path

from megatron_musa_patch.core import settings
from megatron_musa_patch.device.rows import OFF_CUDA, ROWS

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_musa_patch"
NAMES = set(ROWS)
TORCH_KEYWORDS = {"help", "map_location", "device", "device_type"}
#: modules where the names are torch's device types throughout, and why
TORCH_VOCABULARY = {
    "lib/ops": "ops dispatch on a tensor's torch device type and key their measured choices by it",
}


def _parents(tree):
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _torch_context(node, parents) -> bool:
    parent = parents.get(node)
    if isinstance(parent, ast.keyword) and parent.arg in TORCH_KEYWORDS:
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        # torch.device("cpu"), x.to("cuda"), a Tensor method looked up by name
        return name in ("device", "to", "original_tensor_method")
    if isinstance(parent, ast.Compare):
        others = [parent.left] + parent.comparators
        return any(isinstance(o, ast.Attribute) and o.attr == "type" for o in others if o is not node)
    return False


def literals():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("device/") or any(rel.startswith(p) for p in TORCH_VOCABULARY):
            continue
        tree = ast.parse(path.read_text())
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in NAMES and \
                    not _torch_context(node, parents):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_device_name_outside_the_device_table():
    # the device variable's accepted values are the one declared exception: the settings object
    # is below the device table, and the next test holds the two to one another
    allowed = [f for f in literals() if f.startswith("core/settings.py:")]
    assert [f for f in literals() if f not in allowed] == []


def test_the_device_variable_takes_exactly_the_rows():
    (variable,) = [v for v in settings.VARIABLES if v.name == "MEGATRON_MUSA_PATCH_DEVICE"]
    assert variable.choices == ("auto",) + tuple(ROWS)


def test_off_cuda_is_what_the_rows_say():
    assert OFF_CUDA == {name for name, row in ROWS.items() if row.rewrites_cuda} == {"musa", "cpu"}
