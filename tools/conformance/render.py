"""docs/conformance.md (a summary) and docs/conformance/details/ (every test's verdict) from every
release's results, and the release a run was made on."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from .classify import pass_rate, verdicts
from .tables import CI_DATA, CI_SET, DEFAULT_SET, LAUNCHED_BY, REMAINING

# ---------------------------------------------------------------------------- the release
def describe_release(python: str, lm_path: Path) -> dict:
    code = ("import json, sys\nfrom pathlib import Path\n"
            "from megatron_musa_patch.upstream import installed, ranges, tables\n"
            "core = installed.megatron_core_version()\n"
            "lm = installed.megatron_lm_version(Path(sys.argv[1]))\n"
            "row = ranges.row_of(tables.MEGATRON, core)\n"
            "import torch\n"
            "print(json.dumps({'megatron_core': str(core), 'megatron_lm': str(lm),\n"
            "    'tag': row.lm_tag if row else 'unsupported', 'series': row.series if row else '',\n"
            "    'python': sys.version.split()[0], 'torch': torch.__version__}))")
    proc = subprocess.run([python, "-c", code, str(lm_path)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("MEGATRON_MUSA_PATCH")})
    if proc.returncode != 0:
        sys.exit(f"conformance: error: {python} cannot tell the release (is the package "
                 f"installed there?):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the report
#: the categories of the summary table, in its column order (classify.py's names)
COLUMNS = (("passed", "passed"), ("failed", "failed"), ("hung", "hung"), ("not run", "not run"),
           ("skipped", "skipped by upstream"), ("off CUDA by design", "off CUDA by design"),
           (CI_DATA, "need upstream's CI"), ("flaky upstream", "flaky upstream"))
DETAILS = "details"  # the per-test data files, beside the results: <results>/details/<tag>.json


def _runs(results_dir: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]


def _setups(run: dict) -> tuple:
    """(where and how the files ran, in words; the per-file limit most files had; the launcher
    most files had). The run-wide limit is the last --update's, which may have been a longer
    limit for one slow file; each file's own machine, launcher and limit are in the details."""
    machines = [(f.get("machine") or run["machine"]).removeprefix("machine: ").split(", ")
                for f in run["files"]]
    names = sorted({fields[0] for fields in machines})
    software = sorted({", ".join(x for x in fields if x.startswith(("Python ", "torch ")))
                       for fields in machines} - {""})
    launchers = collections.Counter(f.get("launcher", "torchrun") for f in run["files"])
    started = " and ".join(f"{LAUNCHED_BY[launcher]}"
                           + (f" ({n} file{'s' * (n != 1)})" if len(launchers) > 1 else "")
                           for launcher, n in sorted(launchers.items(), key=lambda kv: -kv[1]))
    where_run = (f"on {' and '.join(names)}" + (f" ({'; '.join(software)})" if software else "")
                 + f", ranks {started}")
    limits = collections.Counter(f.get("timeout", run["timeout"]) for f in run["files"])
    return (where_run, max(limits, key=limits.get, default=run["timeout"]),
            max(launchers, key=launchers.get, default="torchrun"))


def details(run: dict) -> dict:
    """The per-test record of one release, compact: each file's outcome, and every test that did
    not pass grouped by category and by its reason (the page gives only the totals)."""
    _, usual_limit, _ = _setups(run)
    files, grouped = [], collections.defaultdict(lambda: collections.defaultdict(list))
    for file_result in run["files"]:
        counts = collections.Counter()
        for _, nodeid, category, reason, where in verdicts([file_result]):
            counts[category] += 1
            if category != "passed":
                why = _one_line(reason) + (f" -- {where}" if where else "")
                grouped[category][why].append(nodeid.replace("tests/unit_tests/", "", 1))
        slow = sorted(file_result["tests"].items(), key=lambda kv: -kv[1].get("seconds", 0))[:3]
        files.append({"file": file_result["file"], "status": file_result["status"],
                      "seconds": round(file_result["seconds"]),
                      "ranks": file_result.get("nproc", run["nproc"]),
                      "limit": file_result.get("timeout", run["timeout"]) or usual_limit,
                      "machine": file_result.get("machine") or run["machine"],
                      "launcher": file_result.get("launcher", "torchrun"),
                      "counts": dict(sorted(counts.items())),
                      "slowest": [[n.split("::", 1)[-1], round(t.get("seconds", 0), 1)]
                                  for n, t in slow if t.get("seconds", 0) >= 1.0]})
    return {"release": run["release"], "date": run["date"], "files": files,
            "not passed": {c: dict(sorted(grouped[c].items())) for c in sorted(grouped)}}


def _totals(run: dict) -> tuple:
    """(a Counter of categories, a Counter of (category, where) for what remains)."""
    counts, remaining = collections.Counter(), collections.Counter()
    for _, _, category, _, where in verdicts(run["files"]):
        counts[category] += 1
        if category in REMAINING:
            remaining[(category, where or "not yet classified")] += 1
    return counts, remaining


def _reproduce(run: dict, usual_limit: float, launcher: str) -> str:
    files = sorted(f["file"].replace("tests/unit_tests/", "", 1) for f in run["files"])
    chosen = next((name for name, chosen in (("default", DEFAULT_SET), ("ci", CI_SET))
                   if files == sorted(chosen)), "all")
    tag = run["release"]["tag"]
    return (f"python -m tools.conformance --lm-path path/to/Megatron-LM-{tag} \\\n"
            f"    --python path/to/python-with-megatron-core-{run['release']['megatron_core']} "
            f"--set {chosen} --timeout {usual_limit:.0f}"
            + (" --launcher fork" if launcher == "fork" else ""))


def render(results_dir: Path) -> str:
    """The summary page: per release, how many of upstream's unit tests ran through the layer
    and what became of them, where the per-test details are, and the command that reruns them.
    A function of the results alone, so a stale page is found by rendering it again."""
    runs = _runs(results_dir)
    lines = ["# Conformance: Megatron-LM's unit tests through the layer", "",
             "<!-- generated by `python -m tools.conformance --render-only` from "
             "docs/conformance/*.json; do not edit by hand -->", "",
             "Upstream's own unit tests (`tests/unit_tests` of each release's Megatron-LM tag), "
             "every file run on CPU ranks through the layer. To run them yourself: "
             "[how it runs](conformance-guide.md).", "",
             "| release | files | tests | " + " | ".join(name for _, name in COLUMNS)
             + " | pass rate |", "|---" * (len(COLUMNS) + 4) + "|"]
    sections = []
    for run in runs:
        rel = run["release"]
        counts, remaining = _totals(run)
        passed, runnable, percent = pass_rate(counts)
        rate = f"{percent:.1f}%" if percent is not None else "n/a"
        lines.append(f"| megatron-core {rel['megatron_core']} (`{rel['tag']}`) | "
                     f"{len(run['files'])} | {sum(counts.values())} | "
                     + " | ".join(str(counts[c]) for c, _ in COLUMNS) + f" | {rate} |")
        where_run, usual_limit, launcher = _setups(run)
        sections += [f"## megatron-core {rel['megatron_core']}, Megatron-LM {rel['tag']}", "",
                     f"Last run {run['date']} {where_run}; {run['nproc']} ranks, "
                     f"{usual_limit:.0f} s per file.", "",
                     f"**{passed} of {runnable} runnable tests pass ({rate}).** What did not, "
                     f"by where it belongs:", ""]
        sections += [f"- {n} {category}; {where}" for (category, where), n in
                     sorted(remaining.items(), key=lambda kv: (-kv[1], kv[0]))] or ["- none"]
        sections += ["", f"Every test's verdict and reason: "
                         f"[details/{rel['tag']}.json](conformance/{DETAILS}/{rel['tag']}.json); "
                         f"the raw results: [{rel['tag']}.json](conformance/{rel['tag']}.json). "
                         f"Run again:", "", "```bash", _reproduce(run, usual_limit, launcher),
                     "```", ""]
    if not runs:
        lines += ["", "No results yet."]
    lines += ["", "- **pass rate**: passed / (passed + failed + hung + not run).",
              "- **off CUDA by design**: the test needs TransformerEngine, CUDA tensors or CUDA "
              "graphs, so it cannot pass on CPU or MUSA.",
              "- **need upstream's CI**: the test needs what upstream's CI image has (the data "
              "it mounts, downloads, a package this release's Python cannot install); it fails "
              "the same way on CUDA without it.",
              "- **flaky upstream**: upstream marks the test flaky and its CI deselects it; "
              "counted apart, whatever it did here.", ""]
    return "\n".join(lines + sections)


def details_files(results_dir: Path) -> dict:
    """{path: text} of every release's per-test data file."""
    return {results_dir / DETAILS / f"{run['release']['tag']}.json":
            json.dumps(details(run), indent=1) + "\n" for run in _runs(results_dir)}


def write(results_dir: Path, markdown: Path) -> list:
    """Writes the page and the data files, removes data files of releases without results;
    returns the paths written."""
    pages = {markdown: render(results_dir), **details_files(results_dir)}
    (results_dir / DETAILS).mkdir(exist_ok=True)
    for old in (results_dir / DETAILS).glob("*.json"):
        if old not in pages:
            old.unlink()
    for path, text in pages.items():
        path.write_text(text)
    return list(pages)


def stale(results_dir: Path, markdown: Path) -> list:
    """What ``write`` would change: the pages that differ from the results, are missing, or
    belong to no release."""
    pages = {markdown: render(results_dir), **details_files(results_dir)}
    found = [str(p) for p, text in pages.items() if not p.is_file() or p.read_text() != text]
    return found + [f"{p} (no such release)" for p in sorted((results_dir / DETAILS).glob("*.json"))
                    if p not in pages]


def _one_line(text: str) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= 300 else text[:297] + "..."


def updated(previous: dict, run: dict) -> dict:
    """``previous`` with ``run``'s files in place of its results for the same files (new files
    appended); results of another release cannot be mixed in. Each file keeps the ranks, the
    timeout and the machine it ran with (older results: the run's)."""
    if previous.get("release") != run["release"]:
        sys.exit(f"conformance: error: --update: the stored results are of release "
                 f"{previous.get('release')!r}, this run of {run['release']!r}; write them "
                 f"elsewhere (--results) or rerun them all")
    run_wide = {"nproc": previous.get("nproc"), "timeout": previous.get("timeout"),
                "machine": previous.get("machine")}
    fresh = {f["file"]: f for f in run["files"]}
    files = [fresh.pop(f["file"], None) or {**run_wide, **f} for f in previous["files"]]
    return {**run, "files": files + list(fresh.values())}
