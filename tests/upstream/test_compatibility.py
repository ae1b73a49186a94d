"""Compatibility as data, end to end: a torch or megatron-core outside the tables is refused at
activation with one paragraph; under MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED, or once a developer
adds its row to a table, every record not re-verified on it is reported ``unverified`` by ``mmp
doctor``, and ``mmp patches --resolve-all --strict`` exits non-zero on it. Every record carries
explicit ranges, and records whose code reaches torch's private names carry a torch range.

The releases are simulated (tests.upstream.probes.release.py sets the version the layer reads); what
ran on the real ones is docs/compatibility.md.
"""

import importlib
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, run_probe, run_python, subprocess_env

pytestmark = pytest.mark.release

FEATURES = REPO / "megatron_musa_patch" / "features"


def mmp(*args, env=None, torch=None, core=None, add_rows=False, timeout=300):
    probe = ["--torch", torch] if torch else []
    probe += ["--megatron-core", core] if core else []
    probe += ["--add-rows"] if add_rows else []
    overrides = {"MEGATRON_MUSA_PATCH_AUTOACTIVATE": "0", "MEGATRON_MUSA_PATCH_DEVICE": "cpu",
                 **(env or {})}
    environment = subprocess_env(**overrides)
    if core:  # a checkout of the installed release would not match the simulated one
        environment.pop("MEGATRON_LM_PATH", None)
    return run_probe("tests.upstream.probes.release", *probe, "--", *args, timeout=timeout,
                     env=environment)


def patches(proc) -> list:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["patches"]


ALLOW = {"MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED": "1"}


def test_a_torch_newer_than_the_table_is_refused_with_one_paragraph():
    proc = mmp("doctor", torch="2.16.0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert text.startswith("mmp doctor: error: torch 2.16.0 is installed, newer than the "
                           "torch releases this layer supports: >=2.11.0,<2.16")
    assert "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1" in text and "Traceback" not in proc.stderr


def test_a_megatron_core_newer_than_the_table_is_refused_with_one_paragraph():
    proc = mmp("doctor", core="0.20.0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert " ".join(proc.stderr.split()).startswith(
        "mmp doctor: error: megatron-core 0.20.0 is installed, but this layer supports "
        ">=0.16.1,<0.20")


@pytest.fixture(scope="module")
def installed_statuses():
    """{(record id, variant): status} on the installed releases (the same for every case)."""
    return {(r["id"], r["variant"]): r["status"]
            for r in patches(mmp("patches", "--json", "--no-import"))}


@pytest.mark.parametrize("simulated", [{"torch": "2.16.0"}, {"core": "0.20.0"}])
@pytest.mark.parametrize("how", ["override", "table row"])
def test_a_release_nobody_verified_shows_every_record_unverified(installed_statuses, simulated,
                                                                 how):
    """The torch records (all of them carry a torch range) or every record (megatron-core
    ranges) are tried and reported unverified; the rest stay as they were."""
    env, add_rows = (ALLOW, False) if how == "override" else ({}, True)
    baseline = installed_statuses
    rows = patches(mmp("patches", "--json", "--no-import", env=env, add_rows=add_rows,
                       **simulated))
    now = {(r["id"], r["variant"]): r for r in rows}
    assert now.keys() == baseline.keys()
    unverified = [r for r in rows if r["status"] == "unverified"]
    assert len(unverified) > 100
    assert not [r for r in rows if r["status"] == "applied" and
                (r["torch"] if "torch" in simulated else r["megatron"])]
    for key, status in baseline.items():
        row = now[key]
        gated = row["torch"] if "torch" in simulated else row["megatron"]
        if status == "applied" and gated:
            # a record upstream made unnecessary before the newest row ends there instead
            ends_early = "core" in simulated and not row["megatron"].endswith("<0.20")
            assert row["status"] == ("skipped" if ends_early else "unverified"), row
            if ends_early:
                continue
            assert ("not on the installed" if how == "table row" else "outside the support "
                    "table") in row["reason"]
    doctor = mmp("doctor", env=env, add_rows=add_rows, **simulated)
    if "core" in simulated and doctor.returncode != 0:
        # a simulated megatron-core 0.20 picks the newest variants, whose targets an installed
        # release older than the newest row may lack; only the torch case is clean. A required
        # one stops activation with one paragraph naming the patch (exit 2; 0.17: megatron_args);
        # an optional one is a failed row naming its target, the rest still reported (exit 1;
        # 0.16: checkpoint_safety.atomic_tracker)
        assert "Traceback" not in doctor.stderr, doctor.stderr[-2000:]
        if doctor.returncode == 2:
            assert re.search(r"mmp doctor: error: .*patch", doctor.stderr), doctor.stderr
            return
        assert doctor.returncode == 1, doctor.stderr[-2000:]
        summary = re.search(r"patches: 0 applied, (\d+) unverified.* (\d+) failed", doctor.stdout)
        assert summary and int(summary.group(1)) > 100, doctor.stdout[-2000:]
        failed = re.findall(r"^failed +(\S+) .*does not exist in the installed Megatron", doctor.stdout,
                            re.M)
        assert len(failed) == int(summary.group(2)), doctor.stdout[-3000:]
        return
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    assert re.search(r"patches: \d+ applied, (\d+) unverified", doctor.stdout)
    assert int(re.search(r"(\d+) unverified", doctor.stdout).group(1)) > 0


def test_resolve_all_strict_fails_on_unverified_records():
    """Exit status of ``--resolve-all`` is that of the targets alone; ``--strict`` adds the
    records not verified on this release (a table row added, nothing re-verified)."""
    baseline = mmp("patches", "--resolve-all", "--json")
    strict = mmp("patches", "--resolve-all", "--json", "--strict")
    assert strict.returncode == baseline.returncode, strict.stderr[-2000:]
    rows = json.loads(baseline.stdout)["resolutions"]
    assert not [r for r in rows if r["for_this_release"] and not r["verified"]]
    added = mmp("patches", "--resolve-all", "--json", torch="2.16.0", add_rows=True)
    added_strict = mmp("patches", "--resolve-all", "--json", "--strict", torch="2.16.0",
                       add_rows=True)
    assert added.returncode == baseline.returncode, added.stderr[-2000:]
    assert added_strict.returncode == 1
    found = json.loads(added.stdout)["resolutions"]
    unchecked = [r for r in found if r["for_this_release"] and not r["verified"]]
    assert unchecked and all(r["torch"] for r in unchecked)
    assert all("verified on torch >=2.11,<2.16, not on the installed 2.16.0" in
               r["unverified_because"] for r in unchecked)
    text = mmp("patches", "--resolve-all", torch="2.16.0", add_rows=True).stdout
    assert f"{len(unchecked)} meant for this release are unverified on it" in text
    assert mmp("patches", "--strict").returncode == 2  # --strict goes with --resolve-all


# ----------------------------------------------------------------------------- the records

#: torch's private names, as the layer's code reaches them
PRIVATE_TORCH = re.compile(r"torch(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*|distributed_c10d\._\w+|"
                           r"from torch[\w.]* import _\w+")


def feature_of(path: Path):
    """The feature a module of features/ declares (None for helper modules)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    declared = getattr(importlib.import_module(module), "FEATURE", None)
    return declared.name if declared is not None else None


def test_records_of_code_that_reaches_torchs_private_names_carry_a_torch_range():
    """Every record of the cpu and musa rows has explicit bounded ranges (the record refuses
    to be made otherwise); a feature whose module reaches a private torch name (torch._C,
    distributed_c10d._world, ...) gives each of its records a torch range too."""
    rows = patches(mmp("patches", "--json", "--no-import"))
    rows += patches(mmp("patches", "--json", "--no-import",
                        env={"PYTHONPATH": str(REPO / "tests" / "fixtures" / "fake_musa"),
                             "MEGATRON_MUSA_PATCH_DEVICE": "musa"}))
    assert all(r["megatron"].startswith(">=") and ",<" in r["megatron"] for r in rows)
    private = {}
    for path in FEATURES.rglob("*.py"):
        found = PRIVATE_TORCH.findall(path.read_text())
        feature = feature_of(path)
        if found and feature:
            private[feature] = found[0]
    assert {"device", "device.collectives", "device.release_dropped_groups"} <= private.keys()
    lacking = {r["id"]: private[r["feature"]] for r in rows
               if r["feature"] in private and not r["torch"]}
    assert lacking == {}
    assert all(r["torch"] for r in rows if r["target"].startswith("torch"))


# ----------------------------------------------------------------------------- torch_musa


def _torch_musa_metadata(root: Path, version: str) -> Path:
    """An installed-looking torch_musa distribution (its metadata: what the check reads)."""
    dist = root / f"torch_musa-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_musa\nVersion: {version}\n")
    return root


def _installed_torch_release() -> str:
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:3])


def test_a_torch_musa_built_on_another_torch_stops_device_selection(tmp_path):
    """pip replaced the MUSA SDK's torch: without the check, ``auto`` would quietly fall back to
    the CPU. An explicit ``cpu`` row goes ahead."""
    site = _torch_musa_metadata(tmp_path, "2.9.0.post1")
    # the MUSA SDK's torch is not a CUDA build (a CUDA build is the next test's case)
    code = "import torch; torch.version.cuda = None; import megatron_musa_patch"
    proc = run_python(code, env=subprocess_env(PYTHONPATH=str(site)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert text.startswith("megatron_musa_patch: error: MEGATRON_MUSA_PATCH_DEVICE=auto: "
                           "torch_musa 2.9.0.post1 is built on torch 2.9.0, but torch ")
    assert "Reinstall the torch that came with your MUSA SDK (torch 2.9.0" in text
    on_cpu = run_python(code, env=subprocess_env(PYTHONPATH=str(site),
                                                 MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert on_cpu.returncode == 0, on_cpu.stderr[-2000:]


def test_a_cuda_build_of_torch_beside_torch_musa_stops_device_selection(tmp_path):
    site = _torch_musa_metadata(tmp_path, f"{_installed_torch_release()}.post2")
    code = "import torch; torch.version.cuda = '13.0'; import megatron_musa_patch"
    proc = run_python(code, env=subprocess_env(PYTHONPATH=str(site),
                                               MEGATRON_MUSA_PATCH_DEVICE="musa"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert "MEGATRON_MUSA_PATCH_DEVICE=musa: torch " in text
    assert "is a CUDA build (CUDA 13.0), but torch_musa" in text
    assert "pip has replaced the MUSA torch" in text


def test_a_plugin_record_without_ranges_stops_activation_with_one_paragraph(tmp_path):
    shutil.copy(FIXTURES / "plugins" / "rangeless_plugin.py", tmp_path)  # alone on PYTHONPATH
    proc = run_python("import megatron_musa_patch", env=subprocess_env(
        PYTHONPATH=str(tmp_path), MEGATRON_MUSA_PATCH_PLUGINS="rangeless_plugin",
        MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert " ".join(proc.stderr.split()).startswith(
        "megatron_musa_patch: error: patch rangeless.x (feature 'rangeless') names no megatron "
        "range: records declare the releases they were verified on, e.g. "
        "megatron='>=0.16.1,<0.20'")
