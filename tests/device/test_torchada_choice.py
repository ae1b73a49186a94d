"""Who maps torch, and the mistakes around it: one paragraph naming the culprit and the fix, exit
2 at activation (or the error at a refused ``import torchada``), never two adapters on the same
torch names. Against the stand-in torch_musa; the cases that need torchada skip without it."""

import os
import shutil
import sys

import pytest

from tests.conftest import run_probe, run_python, subprocess_env
from tests.device.musa_rows import MAPPINGS, STAND_IN, musa_env, needs_torchada


def one_paragraph(proc) -> str:
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [l for l in proc.stderr.splitlines() if l.startswith("megatron_musa_patch: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return " ".join(proc.stderr.split())


def test_musa_row_without_torchada_says_to_install_the_musa_extra():
    proc = run_probe("tests.device.probes.torchada_choice_not_installed",
                     env=musa_env("torchada"))
    text = one_paragraph(proc)
    assert proc.returncode == 2
    assert "maps torch through torchada, which is not installed" in text
    assert 'pip install "megatron-musa-patch[musa]"' in text and "torchada==0.1.103" in text
    assert "MEGATRON_MUSA_PATCH_TORCHADA=0" in text


def test_builtin_mapping_needs_no_torchada():
    proc = run_probe("tests.device.probes.torchada_choice_builtin_hidden",
                     env=musa_env("builtin"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["megatron_musa_patch", "False", "True"]


@needs_torchada
def test_torchada_told_another_platform_on_the_musa_row():
    proc = run_python("import megatron_musa_patch",
                      env=musa_env("torchada", MEGATRON_MUSA_PATCH_DEVICE="musa",
                                   TORCHADA_PLATFORM="cpu"))
    text = one_paragraph(proc)
    assert "did not map torch.cuda to torch.musa (TORCHADA_PLATFORM=cpu" in text
    assert "MEGATRON_MUSA_PATCH_TORCHADA=0" in text


@needs_torchada
def test_builtin_mapping_refuses_torchada_imported_before():
    proc = run_python("import torchada\nimport megatron_musa_patch", env=musa_env("builtin"))
    text = one_paragraph(proc)
    assert "MEGATRON_MUSA_PATCH_TORCHADA=0 asks for the layer's built-in torch mapping, but " \
           "torchada 0.1.103 was imported before the layer" in text


@needs_torchada
@pytest.mark.parametrize("env", [
    {"MEGATRON_MUSA_PATCH_TORCHADA": "0"},  # built-in mapping on the musa row
    {"MEGATRON_MUSA_PATCH_DEVICE": "cpu"},  # cpu row on a machine with torch_musa
], ids=["builtin-musa", "cpu-with-torch_musa"])
def test_a_later_import_torchada_is_refused_where_the_layer_maps_torch(env):
    proc = run_probe("tests.device.probes.torchada_choice_later_import",
                     env=subprocess_env(PYTHONPATH=STAND_IN, **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED TorchMappingError `import torchada` after megatron_musa_patch" in proc.stdout
    assert "UNCHANGED True" in proc.stdout


@needs_torchada
def test_torchada_mapping_for_a_row_without_a_musa_device():
    # torch_musa installed, no device visible: auto imported torchada (it maps wherever
    # torch_musa imports), then the row came out cpu
    proc = run_python("import megatron_musa_patch", env=musa_env("torchada", FAKE_MUSA_DEVICES="0"))
    text = one_paragraph(proc)
    assert "torchada 0.1.103 (imported because torch_musa is installed) has mapped torch.cuda " \
           "to torch.musa, but the layer runs on the cpu row" in text
    assert "MEGATRON_MUSA_PATCH_DEVICE=cpu" in text


@needs_torchada
def test_explicit_cpu_row_does_not_import_torchada():
    proc = run_python("import megatron_musa_patch as m, sys\n"
                      "print(m.active_session().device.name, 'torchada' in sys.modules)",
                      env=musa_env("torchada", MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["cpu", "False"]


def test_cpu_row_never_imports_torchada():
    proc = run_python("import megatron_musa_patch as m, sys\n"
                      "print(m.active_session().torch_mapping.adapter, 'torchada' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["megatron_musa_patch", "False"]


@needs_torchada
def test_the_layer_imports_torchada_before_torch_and_torch_musa():
    # torchada syncs MUSA_VISIBLE_DEVICES before torch loads; the environment it leaves lets
    # the ranks a launcher starts import it the same way
    proc = run_probe("tests.device.probes.torchada_choice_import_order",
                     env=musa_env("torchada"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["True", "1"]


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_doctor_on_the_musa_row_with_either_mapping(mapping):
    # doctor imports every patched module; torchada's guard record must not make it import
    # (and so refuse) torchada
    mmp = shutil.which("mmp", path=os.path.dirname(sys.executable))
    proc = run_python(None, args=(mmp, "doctor"), env=musa_env(mapping))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "importing torchada" not in proc.stderr and "error" not in proc.stderr
    expected = {"torchada": "torch mapping        torchada 0.1.103 (imported by the layer)",
                "builtin": "torch mapping        built-in (megatron_musa_patch), "
                           "MEGATRON_MUSA_PATCH_TORCHADA=0"}[mapping]
    assert expected in proc.stdout
