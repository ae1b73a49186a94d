"""The three activation routes, diagnostics, and bad input (each a subprocess)."""

import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, run_probe, run_python, subprocess_env

MMP = shutil.which("mmp", path=os.path.dirname(sys.executable)) or shutil.which("mmp")
PLUGINS = str(FIXTURES / "plugins")
PROBES = Path(__file__).resolve().parent / "probes"


def one_paragraph(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.startswith("megatron_musa_patch: error:")]
    assert len(lines) == 1, stderr
    return " ".join(stderr.split())


def test_import_activates_once():
    proc = run_probe("tests.activation.probes.activate_once",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr
    name, applied = proc.stdout.split()
    assert name == "cpu" and int(applied) > 100


def test_pth_route_activates_only_when_asked():
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "megatron_musa_patch.pth").is_file(), "install the package (pip install .)"
    probe = "import torch; print(torch.cuda.is_available())"
    assert run_python(probe, env=subprocess_env(MEGATRON_MUSA_PATCH="1")).stdout.strip() == "True"
    assert run_python(probe).stdout.strip() == "False"
    # unset, the start-up line imports nothing of ours (and no torch)
    quiet = run_python("pass", args=("-X", "importtime"))
    assert "megatron_musa_patch" not in quiet.stderr and " torch" not in quiet.stderr


@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_mmp_run_runs_the_script_as_main_in_every_rank(tmp_path):
    script = tmp_path / "probe.py"  # it writes its rank files beside itself
    shutil.copy(PROBES / "mmp_run_rank.py", script)
    import subprocess
    proc = subprocess.run([MMP, "run", "--nproc-per-node", "2", str(script), "--flag", "x"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"rank{r}").read_text() for r in (0, 1)]
    assert lines == [f"RANK {r} __main__ ['--flag', 'x'] 3.0 gloo" for r in (0, 1)]


@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_mmp_patches_json_and_doctor():
    import subprocess

    from megatron_musa_patch.upstream import installed
    proc = subprocess.run([MMP, "patches", "--json"], env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = json.loads(proc.stdout)
    assert table["device"]["name"] == "cpu" and table["device"]["backend"] == "gloo"
    statuses = {p["id"]: p["status"] for p in table["patches"]}
    assert statuses["device.torch_cuda.current_device"] == "applied"
    # megatron.core was imported: applied, or skipped where upstream fixed it (0.17+)
    from megatron_musa_patch.upstream import facts

    fixed = facts.holds("moe_utils_defines_te_names", installed.megatron_core_version())
    assert statuses["upstream_fixes.moe_te_general_gemm"] == ("skipped" if fixed else "applied")
    assert not [p for p in table["patches"] if p["status"] == "failed"]
    doctor = subprocess.run([MMP, "doctor"], env=subprocess_env(), capture_output=True,
                            text=True, timeout=300)
    assert doctor.returncode == 0 and "device cpu" in doctor.stdout


# ----------------------------------------------------------------------------- bad input


def test_unknown_device_name():
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="tpu"))
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert "MEGATRON_MUSA_PATCH_DEVICE='tpu'" in text and "auto, musa, cpu, cuda" in text


def test_musa_requested_without_torch_musa():
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="musa"))
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert "torch_musa cannot be imported" in text and "MEGATRON_MUSA_PATCH_DEVICE=cpu" in text


def test_missing_patch_target_names_target_feature_and_version():
    from megatron_musa_patch.upstream import installed

    proc = run_python("import megatron_musa_patch\nimport megatron.core.utils",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_PLUGINS="broken_target_plugin",
                                         PYTHONPATH=PLUGINS))
    assert proc.returncode != 0
    text = one_paragraph(proc.stderr)
    for part in ("megatron.core.utils:no_such_function", "feature 'broken_target'",
                 str(installed.megatron_core_version())):
        assert part in text


def test_activation_after_megatron_was_imported():
    proc = run_python("import megatron.core\nimport megatron_musa_patch")
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert "activated after Megatron was imported" in text and "mmp run" in text


def test_wrong_megatron_lm_path(tmp_path):
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_LM_PATH=str(tmp_path)))
    assert proc.returncode == 2
    assert "is not a Megatron-LM checkout" in one_paragraph(proc.stderr)


def test_unknown_feature_toggle():
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DISABLE="recompute_typo"))
    assert proc.returncode == 2
    assert ("DISABLE names an unknown feature 'recompute_typo' (did you mean 'recompute'?)"
            in one_paragraph(proc.stderr))


def test_disable_and_only_toggles_switch_features_off():
    code = ("import megatron_musa_patch as m\n"
            "print(sorted({r.feature for r in m.report() if r.status == 'skipped'"
            " and 'switched off' in r.reason}))")

    def switched_off(**env):
        proc = run_python(code, env=subprocess_env(**env))
        assert proc.returncode == 0, proc.stderr
        return set(eval(proc.stdout.strip()))

    fixes = switched_off(MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes")
    assert fixes and all(f.startswith("upstream_fixes.") for f in fixes)
    assert {"upstream_fixes.checkpoint_without_output_fp8",
            "upstream_fixes.expert_bias_out_of_place"} <= fixes
    only_none = switched_off(MEGATRON_MUSA_PATCH_ONLY="none")
    assert fixes | {"moe_mla_mtp.mla_local", "moe_mla_mtp.moe_device_balance", "fused_ops.rope"} <= only_none
    assert not only_none & {"device", "device.collectives", "megatron_args", "startup.cuda_free_startup"}
    only_mla = switched_off(MEGATRON_MUSA_PATCH_ONLY="moe_mla_mtp.mla_local")
    assert "moe_mla_mtp.mla_local" not in only_mla and fixes <= only_mla


def test_one_fusion_off_leaves_the_others_on():
    code = ("import megatron_musa_patch as m\n"
            "print(sorted({r.feature for r in m.report() if r.status == 'skipped'"
            " and 'switched off' in r.reason}))")
    proc = run_python(code, env=subprocess_env(MEGATRON_MUSA_PATCH_DISABLE="fused_ops.rope"))
    assert proc.returncode == 0, proc.stderr
    assert eval(proc.stdout.strip()) == ["fused_ops.rope"]
    proc = run_python(code, env=subprocess_env(MEGATRON_MUSA_PATCH_ONLY="fused_ops"))
    assert proc.returncode == 0, proc.stderr
    off = set(eval(proc.stdout.strip()))
    # the five fusions the name always meant; flash attention and the MoE fusion joined the
    # folder later and are switched by their own names (as before they moved)
    assert not off & {"fused_ops.norm", "fused_ops.rope", "fused_ops.softmax", "fused_ops.swiglu",
                      "fused_ops.wgrad_accumulation"} and "recompute" in off
    assert {"fused_ops.flash_attention", "fused_ops.moe_fusion"} <= off


def test_activation_imports_no_megatron_module():
    """The layer orders sys.path when ``megatron`` is first imported (a launcher puts the script's
    directory, often a checkout, first after activation); importing it during activation would
    fix the namespace package's order before that (the start-up hook route)."""
    proc = run_python("import sys, megatron_musa_patch\n"
                      "print(sorted(m for m in sys.modules if m.split('.')[0] == 'megatron'))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("value, active", [("0", False), ("off", False), ("no", False),
                                           ("1", True), ("on", True)])
def test_autoactivate_takes_every_spelling_the_settings_take(value, active):
    """MEGATRON_MUSA_PATCH_AUTOACTIVATE has one reader (core.settings.autoactivate): 'off' stops
    the import's activation as '0' does (it was accepted by the settings and then ignored)."""
    proc = run_python("import megatron_musa_patch as m; print(m.is_active())",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu",
                                         MEGATRON_MUSA_PATCH_AUTOACTIVATE=value))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(active)


def test_multiprocessing_helpers_activate_on_their_first_torch_or_megatron_import():
    """The start-up hook in a spawn child (and the resource tracker, the Manager server) waits
    for the first import of torch or megatron: one that imports neither stays without torch,
    one that does is active before its code runs."""
    proc = run_probe("tests.activation.probes.multiprocessing_helpers",
                     env=subprocess_env(MEGATRON_MUSA_PATCH="1",
                                        MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "bare torch=False layer=False",
        "torch active=True cuda=True loader=SourceFileLoader",  # torch's own, not a wrapper
        "megatron active=True",
        "parent torch=True",
    ]


def test_a_refusal_in_the_start_up_hook_is_its_paragraph_not_a_fatal_error(tmp_path):
    """The .pth hook activates while Python imports site: a SystemExit there was reported by
    the interpreter as "Fatal Python error: init_import_site" with a traceback."""
    proc = run_python("print('not reached')", cwd=tmp_path, env=subprocess_env(
        MEGATRON_MUSA_PATCH="1", MEGATRON_MUSA_PATCH_DISABLE="fused_ops.rop"))
    assert proc.returncode == 2
    assert "Fatal Python error" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("megatron_musa_patch: error: MEGATRON_MUSA_PATCH_DISABLE names") == 1
    assert "not reached" not in proc.stdout


def test_a_failure_in_the_start_up_hook_stops_the_process_with_its_traceback(tmp_path):
    """Not a refusal: the traceback, then one line saying what failed and how to run without
    the layer; never a process that goes on unpatched, never a fatal error."""
    env = subprocess_env(MEGATRON_MUSA_PATCH="1",
                         MEGATRON_MUSA_PATCH_PLUGINS="tests.activation.probes.broken_plugin",
                         PYTHONPATH=str(REPO))
    proc = run_python("print('not reached')", cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert "Fatal Python error" not in proc.stderr
    assert "RuntimeError: a plugin's own bug" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith(
        "megatron_musa_patch: error: the start-up hook (MEGATRON_MUSA_PATCH=1) failed to "
        "activate the layer")
    assert "not reached" not in proc.stdout
