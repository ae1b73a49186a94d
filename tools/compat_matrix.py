"""The compatibility matrix: the layer on each (Python, torch, megatron-core) of the support
tables' ends and middles, in cached environments, rendered to docs/compatibility.md.

    python tools/compat_matrix.py                         # every default cell
    python tools/compat_matrix.py --cells py3.12-torch2.15-mc0.19 --steps selftest
    python tools/compat_matrix.py --render-only           # docs/compatibility.md from the results
    python tools/compat_matrix.py --list                  # the cells, nothing run

Per cell: an environment made with uv (hard links from one cache, so five torch builds cost one
download each) with the project's constraints (scripts/constraints.txt) and explicit pins, then

* ``selftest``: ``mmp selftest`` (a tiny GPT on 1 rank, then TP2, PP2, DP2 + distributed
  optimizer on 2 ranks, against the 1-rank losses);
* ``resolve``: ``mmp patches --resolve-all --strict`` (every record's target resolves on this
  release, and every record meant for it was verified on it);
* ``stock``: the CI-sized stock subset (``MMP_STOCK_SUITE=ci``: stock ``pretrain_gpt.py`` through
  the layer) and the torch-shape tests, with the release's Megatron-LM archive from
  ``../shared/upstream`` as ``MEGATRON_LM_PATH``;
* ``suite`` (not by default): the README's whole test command, as CI runs it on the tables'
  ends.

Results are merged into docs/compatibility/results.json (one entry per cell, with the date, the
machine and the versions that were actually installed) after every step, so an interrupted run
keeps what finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]


def _load_tables():
    """upstream/tables.py by its path (standard library only): importing the package would
    activate the layer in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_mmp_tables", REPO / "megatron_musa_patch" / "upstream" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tables = _load_tables()

RESULTS = REPO / "docs" / "compatibility" / "results.json"
PAGE = REPO / "docs" / "compatibility.md"
CONSTRAINTS = REPO / "scripts" / "constraints.txt"
STEPS = ("selftest", "resolve", "stock", "suite")
DEFAULT_STEPS = ("selftest", "resolve", "stock")
#: the stock tests the CI subset selects, plus the tests of torch's shapes and the release checks
#: (markers `stock` and `release`, pyproject.toml)
STOCK_TESTS = ("-m", "stock or release", "tests")


@dataclasses.dataclass(frozen=True)
class Cell:
    python: str        # "3.12"
    torch: str         # a series of the torch table, "2.15"
    megatron: str      # a series of the Megatron table, "0.19"

    @property
    def name(self) -> str:
        return f"py{self.python}-torch{self.torch}-mc{self.megatron}"

    @classmethod
    def parse(cls, name: str) -> "Cell":
        found = re.fullmatch(r"py(\d+\.\d+)-torch(\d+\.\d+)-mc(\d+\.\d+)", name)
        if not found:
            raise SystemExit(f"compat_matrix: cell {name!r} is not py<X.Y>-torch<X.Y>-mc<X.Y> "
                             f"(see --list)")
        cell = cls(*found.groups())
        if cell.torch not in [t.series for t in tables.TORCH] or \
                cell.megatron not in [m.series for m in tables.MEGATRON]:
            raise SystemExit(f"compat_matrix: cell {name}: torch {cell.torch} or megatron-core "
                             f"{cell.megatron} is not in the support tables "
                             f"(megatron_musa_patch/upstream/tables.py)")
        return cell

    @property
    def lm_tag(self) -> str:
        return next(m.lm_tag for m in tables.MEGATRON if m.series == self.megatron)


def default_cells() -> List[Cell]:
    """Every torch of the table with the oldest megatron-core (on the oldest Python it allows,
    3.11, where pip's newest megatron-core is the 0.16 row) and with the newest one (Python
    3.12); the middle Megatron rows with the middle torch."""
    oldest, newest = tables.MEGATRON[0], tables.MEGATRON[-1]
    cells = []
    for torch in tables.TORCH:
        cells.append(Cell("3.11", torch.series, oldest.series))
        cells.append(Cell("3.12", torch.series, newest.series))
    middle_torch = tables.TORCH[len(tables.TORCH) // 2].series
    for row in tables.MEGATRON[1:-1]:
        cells.append(Cell("3.12", middle_torch, row.series))
    return cells


# ---------------------------------------------------------------------------- machine


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, {platform.system()} {platform.release()}"


def find_python(version: str) -> str:
    """An interpreter of ``version``: pyenv's, else python<version> on PATH."""
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True)
        candidates = sorted((v for v in listed.stdout.split() if v.startswith(version + ".")),
                            key=lambda v: [int(n) for n in re.findall(r"\d+", v)])
        if candidates:
            found = subprocess.run([pyenv, "which", "python"], capture_output=True, text=True,
                                   env={**os.environ, "PYENV_VERSION": candidates[-1]})
            if found.returncode == 0:
                return found.stdout.strip()
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise SystemExit(f"compat_matrix: no Python {version} here (pyenv install {version}, or put "
                     f"python{version} on PATH)")


# ---------------------------------------------------------------------------- environments


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise SystemExit("compat_matrix: uv is not installed (pip install uv): it makes the "
                         "environments from one cache of hard links")
    return found


def environment(cell: Cell, cache: Path, log) -> Path:
    """The cell's virtual environment (made once, kept in ``cache``), with this checkout
    installed into it afresh."""
    venv = cache / "venvs" / cell.name
    python = venv / "bin" / "python"
    env = {**os.environ, "UV_CACHE_DIR": str(cache / "uv"), "VIRTUAL_ENV": str(venv)}
    if not python.exists():
        log(f"{cell.name}: making the environment (Python {cell.python})")
        run([uv(), "venv", "-q", "-p", find_python(cell.python), str(venv)], env=env)
        run([uv(), "pip", "install", "-q", "-c", str(CONSTRAINTS), f"torch=={cell.torch}.*",
             f"megatron-core=={cell.megatron}.*", f"{REPO}[training,data,test,musa]"], env=env)
    run([uv(), "pip", "install", "-q", "--reinstall-package", "megatron-musa-patch",
         "--no-deps", str(REPO)], env=env)
    return venv


def installed_versions(python: Path) -> Dict[str, str]:
    code = ("import json, sys; from importlib.metadata import version as v; print(json.dumps("
            "{'python': sys.version.split()[0], 'torch': v('torch'), "
            "'megatron-core': v('megatron-core')}))")
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


def checkout(cell: Cell, cache: Path, archives: Path) -> Path:
    """The Megatron-LM archive of the cell's release, unpacked once into the cache."""
    target = cache / "megatron-lm" / f"Megatron-LM-{cell.lm_tag}"
    if not (target / "pretrain_gpt.py").exists():
        archive = archives / f"Megatron-LM-{cell.lm_tag}.tar.gz"
        if not archive.exists():
            raise SystemExit(f"compat_matrix: {archive} is missing (the unmodified Megatron-LM "
                             f"archives: ../shared/upstream, or --archives)")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target.parent)
    return target


def run(cmd, env=None, cwd=None, timeout=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"compat_matrix: {' '.join(map(str, cmd))} failed:\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return proc


# ---------------------------------------------------------------------------- steps


def layer_env(venv: Path, lm: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_MUSA_PATCH",
                                                                     "VIRTUAL_ENV"))}
    env.update(MEGATRON_LM_PATH=str(lm), MMP_STOCK_SUITE="ci", OMP_NUM_THREADS="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


def step(name: str, venv: Path, lm: Path, tmp: Path) -> dict:
    python, mmp = str(venv / "bin" / "python"), str(venv / "bin" / "mmp")
    env = layer_env(venv, lm)
    if name == "selftest":
        cmd = [mmp, "selftest", "--json", str(tmp / "selftest.json")]
    elif name == "resolve":
        cmd = [mmp, "patches", "--resolve-all", "--strict", "--json"]
    else:
        cmd = [python, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
               f"--basetemp={tmp / 'pytest'}", *(STOCK_TESTS if name == "stock" else ["tests"])]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=REPO if name in ("stock", "suite") else tmp,
                          capture_output=True, text=True, timeout=3600)
    out = {"rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
           "command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))}
    if name == "resolve" and proc.stdout.strip().startswith("{"):
        rows = json.loads(proc.stdout)["resolutions"]
        out["records"] = len(rows)
        out["unresolved"] = sorted(r["id"] for r in rows if r["for_this_release"] and
                                   r["status"] in ("missing", "not importable"))
        out["unverified"] = sorted(r["id"] for r in rows if r["for_this_release"] and
                                   not r["verified"])
    if name in ("stock", "suite"):
        summary = re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)",
                             proc.stdout.splitlines()[-1] if proc.stdout.strip() else "")
        out["counts"] = {kind.rstrip("s") if kind == "errors" else kind: int(n)
                         for n, kind in summary}
    if name == "selftest" and (tmp / "selftest.json").exists():
        found = json.loads((tmp / "selftest.json").read_text())
        out["layouts"] = {layout: result.get("max_abs_diff")
                          for layout, result in found.get("layouts", {}).items()}
    if proc.returncode != 0:
        out["tail"] = (proc.stdout[-1500:] + proc.stderr[-2500:]).strip()
    return out


# ---------------------------------------------------------------------------- results


def load_results(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"cells": {}}


def save_results(results: dict, path: Path = RESULTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # never a half-written results file


def verdict(entry: dict) -> str:
    steps = entry.get("steps", {})
    if not steps:
        return "not run"
    return "passes" if all(s["rc"] == 0 for s in steps.values()) else "FAILS"


def render(results: dict) -> str:
    lines = [
        "# Compatibility: what ran where",
        "",
        "Generated by `tools/compat_matrix.py` from `docs/compatibility/results.json`; do not "
        "edit by hand.",
        "",
        "Each cell is one environment: a Python, a torch series and a megatron-core series of "
        "the support tables (`megatron_musa_patch/upstream/tables.py`), with the versions that "
        "were actually installed. Steps: `selftest` is `mmp selftest` (1 rank, then TP2, PP2 "
        "and DP2 with the distributed optimizer on 2 ranks, against the 1-rank losses); "
        "`resolve` is `mmp patches --resolve-all --strict` (every record's target resolves, "
        "and every record meant for the release was verified on it); `stock` is the CI-sized "
        "subset of stock `pretrain_gpt.py` runs through the layer (`MMP_STOCK_SUITE=ci`, the "
        "release's unmodified Megatron-LM archive) with the torch-shape and release-check "
        "tests; `whole suite`, where it ran, is the README's test command (what CI runs on the "
        "tables' ends). All on the CPU row (gloo), the MUSA row against the stand-in torch_musa "
        "with torchada; nothing here ran on MUSA or CUDA hardware.",
        "",
        "| cell | Python | torch | megatron-core | selftest | resolve | stock | whole suite | "
        "result | date | machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in sorted(results["cells"].items(), key=lambda kv: _order(kv[0])):
        v, steps = entry.get("versions", {}), entry.get("steps", {})
        lines.append(
            f"| {name} | {v.get('python', '?')} | {v.get('torch', '?')} | "
            f"{v.get('megatron-core', '?')} | {_step(steps.get('selftest'))} | "
            f"{_step(steps.get('resolve'))} | {_step(steps.get('stock'))} | "
            f"{_step(steps.get('suite'))} | {verdict(entry)} | {entry.get('date', '?')} | "
            f"{entry.get('machine', '?')} |")
    failing = [(n, e) for n, e in results["cells"].items() if verdict(e) == "FAILS"]
    if failing:
        lines += ["", "## Failures", ""]
        for name, entry in failing:
            for step_name, found in entry["steps"].items():
                if found["rc"] != 0:
                    lines += [f"### {name}: {step_name}", "", "```",
                              found.get("tail", "(no output)"), "```", ""]
    return "\n".join(lines) + "\n"


def _order(name: str):
    cell = Cell.parse(name)
    return [int(n) for n in re.findall(r"\d+", f"{cell.megatron} {cell.torch} {cell.python}")]


def _step(found: Optional[dict]) -> str:
    if found is None:
        return "-"
    mark = "ok" if found["rc"] == 0 else "FAIL"
    if "counts" in found:
        counts = found["counts"]
        detail = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped")
                           if counts.get(k))
        return f"{mark} ({detail}; {found['seconds']:.0f} s)"
    if "records" in found:
        return (f"{mark} ({found['records']} records, {len(found['unresolved'])} unresolved, "
                f"{len(found['unverified'])} unverified)")
    return f"{mark} ({found['seconds']:.0f} s)"


# ---------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/compat_matrix.py", description=__doc__.split("\n")[0])
    p.add_argument("--cells", nargs="+", help="cells to run (default: every default cell)")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help=f"comma-separated, from {', '.join(STEPS)} (default: %(default)s)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "mmp-compat-matrix",
                   help="where environments, uv's cache and unpacked archives are kept")
    p.add_argument("--archives", type=Path, default=REPO.parent / "shared" / "upstream",
                   help="the unmodified Megatron-LM archives (default: %(default)s)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    opts = p.parse_args(argv)
    steps = [s for s in opts.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    cells = [Cell.parse(c) for c in opts.cells] if opts.cells else default_cells()
    if opts.list:
        print("\n".join(c.name for c in cells))
        return 0
    results = load_results(opts.results)
    if not opts.render_only:
        where = machine()

        def log(line):
            print(f"[{datetime.datetime.now():%H:%M:%S}] {line}", flush=True)

        for cell in cells:
            venv = environment(cell, opts.cache, log)
            lm = checkout(cell, opts.cache, opts.archives)
            entry = {"versions": installed_versions(venv / "bin" / "python"), "machine": where,
                     "date": datetime.date.today().isoformat(), "steps": {}}
            previous = results["cells"].get(cell.name, {})
            if previous.get("versions") == entry["versions"]:
                entry["steps"] = dict(previous.get("steps", {}))  # other steps stay
            tmp = opts.cache / "runs" / cell.name
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name in steps:
                log(f"{cell.name}: {name} ...")
                entry["steps"][name] = step(name, venv, lm, tmp)
                log(f"{cell.name}: {name} {_step(entry['steps'][name])}")
                results["cells"][cell.name] = entry
                save_results(results, opts.results)
    PAGE.write_text(render(results))
    print(f"compat_matrix: {PAGE.relative_to(REPO)} written "
          f"({sum(verdict(e) == 'passes' for e in results['cells'].values())} of "
          f"{len(results['cells'])} cells pass)")
    return 0 if all(verdict(e) != "FAILS" for e in results["cells"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
