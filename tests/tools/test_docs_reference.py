"""tools/docs_reference.py: the CLI, environment and feature references are generated from the
code, list every option, variable, feature, flag and patch record it defines, and the committed
pages are current."""

import argparse
import json
import re
import subprocess
import sys

import pytest

from tools import docs_reference

from tests.conftest import REPO, subprocess_env


def test_the_committed_pages_are_what_the_code_says():
    assert (REPO / "docs" / "reference" / "cli.md").read_text() == docs_reference.cli_page()
    assert (REPO / "docs" / "reference" / "environment.md").read_text() == \
        docs_reference.environment_page()
    assert (REPO / "docs" / "troubleshooting.md").read_text() == \
        docs_reference.troubleshooting_page()
    folder = docs_reference.FEATURE_PAGES
    pages = docs_reference.feature_pages()
    assert sorted(p.name for p in folder.glob("*.md")) == sorted(pages)
    assert [n for n, text in pages.items() if (folder / n).read_text() != text] == []


def test_troubleshooting_lists_every_refusal_of_the_catalogue():
    page = docs_reference.troubleshooting_page()
    rows = docs_reference.catalogue_rows()
    assert len(rows) > 80
    assert [r[0] for r in rows if f"(row {r[0]})." not in page] == []


def _every_parser(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_parser(sub)


def test_every_option_of_every_command_is_listed():
    from megatron_musa_patch.cli.main import parsers

    page = docs_reference.cli_page()
    missing = []
    for name, parser in parsers().items():
        assert f"`mmp {name}`" in page
        if name == "run":  # torchrun's own options, those of the installed torch
            continue
        for p in _every_parser(parser):
            assert p.description, f"{p.prog} --help has no description"
            for action in p._actions:
                if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                    continue
                missing += [o for o in action.option_strings if f"`{o}`" not in page]
        assert parser.epilog and parser.epilog.startswith("Exit status:"), name
    assert missing == []


def test_every_variable_is_listed():
    from megatron_musa_patch.core import settings

    page = docs_reference.environment_page()
    names = [v.name for v in settings.VARIABLES] + list(settings.MT_VARIABLES) + \
        [settings.LM_PATH_ENV, *settings.FOREIGN_ENV_NAMES]
    assert [n for n in names if f"`{n}`" not in page] == []


# ---------------------------------------------------------------------------------- features
def _features():
    from megatron_musa_patch.features import BUILTIN

    return [m.FEATURE.name for m in BUILTIN]


def test_every_feature_and_group_has_a_page_the_index_lists():
    from megatron_musa_patch.core.toggles import groups

    pages = docs_reference.feature_pages()
    names = _features()
    assert len(names) > 50
    every = sorted(groups(names))  # the features and the groups a toggle may name
    assert [n for n in every if f"{n}.md" not in pages] == []
    assert [n for n in every if f"| [`{n}`]({n}.md) |" not in pages["index.md"]] == []
    assert sorted(pages) == sorted(["index.md"] + [f"{n}.md" for n in every])
    for name in names:
        page = pages[f"{name}.md"]
        assert page.startswith(f"# `{name}`\n") and \
            f"MEGATRON_MUSA_PATCH_DISABLE={name}`" in page, name
    assert "[`fused_ops.rope`](fused_ops.rope.md)" in pages["fused_ops.md"]  # a group's parts
    assert "| required | yes |" in pages["device.md"]


def test_a_page_names_the_flags_its_feature_adds_and_needs():
    pages = docs_reference.feature_pages()
    recompute = pages["recompute.md"].split("## Flags it adds")[1].split("\n## ")[0]
    for flag in ("--attn-recompute", "--mlp-recompute", "--recompute-variance"):
        assert f"| `{flag}` |" in recompute
    assert "--mla-rms-recompute" not in recompute  # recompute.mla_rms's own
    needs = pages["offload.cpu_offload.md"].split("work only through it")[1].split("\n## ")[0]
    assert "| `--optimizer-cpu-offload` | cpu, musa |" in needs
    assert "after [`recompute`](recompute.md)" in pages["fused_ops.moe_fusion.md"]
    # every flag of every hook, called on a parser of its own
    from megatron_musa_patch.features import BUILTIN

    missing = []
    for module in BUILTIN:
        hook = getattr(module, "mmp_add_arguments", None)
        if hook is None:
            continue
        parser = argparse.ArgumentParser(add_help=False)
        hook(parser)
        page = pages[f"{module.FEATURE.name}.md"]
        missing += [(module.FEATURE.name, o) for a in parser._actions
                    for o in a.option_strings if f"`{o}`" not in page]
    assert missing == []


def test_a_page_lists_its_records_as_mmp_patches_does():
    """Every row of ``mmp patches --json --no-import`` (CPU row), the launcher's too, is on its
    feature's page."""
    run = subprocess.run([sys.executable, "-m", "megatron_musa_patch.cli.main", "patches",
                          "--json", "--no-import"], cwd=REPO, capture_output=True, text=True,
                         env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    rows = report["patches"] + report["launcher_patches"]
    assert len(rows) > 200 and len(report["launcher_patches"]) == 9  # the agent's 6, 3 for launchers
    pages = docs_reference.feature_pages()
    absent = [r["id"] for r in rows if f"| `{r['id']}` | `{r['target']}` | {r['kind']} |"
              not in pages[f"{r['feature']}.md"]]
    assert absent == []
    counts = {}
    for r in rows:
        counts[r["feature"]] = counts.get(r["feature"], 0) + 1
    for name in _features():  # and no more than those
        page = pages[f"{name}.md"].split("## Patch records")[1]
        assert page.count("\n| `") == counts.get(name, 0), name


def test_the_features_overview_links_every_feature_to_its_page():
    text = (REPO / "docs" / "features" / "index.md").read_text()
    linked = re.findall(r"^\| \[`([\w.]+)`\]\(\.\./reference/features/([\w.]+)\.md\) \|",
                        text, re.M)
    assert [n for n, page in linked if n != page] == []
    assert sorted(n for n, _ in linked) == sorted(_features())


def test_mkdocs_nav_lists_every_feature_page():
    assert docs_reference.missing_from_nav(docs_reference.feature_pages()) == []


def test_check_fails_on_a_stale_missing_or_extra_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEGATRON_MUSA_PATCH_AUTOACTIVATE", "0")
    assert docs_reference.main(["--root", str(tmp_path)]) == 0
    assert docs_reference.main(["--check", "--root", str(tmp_path)]) == 0
    folder = tmp_path / "docs" / "reference" / "features"
    page = folder / "recompute.md"
    good = page.read_text()
    page.write_text(good.replace("--attn-recompute", "--attn-recompute-old"))
    capsys.readouterr()
    assert docs_reference.main(["--check", "--root", str(tmp_path)]) == 1
    assert "docs/reference/features/recompute.md" in capsys.readouterr().err
    page.unlink()
    assert docs_reference.main(["--check", "--root", str(tmp_path)]) == 1
    page.write_text(good)
    (folder / "renamed_feature.md").write_text("# `renamed_feature`\n")
    assert docs_reference.main(["--check", "--root", str(tmp_path)]) == 1
    assert "renamed_feature.md (no such feature)" in capsys.readouterr().err
    assert docs_reference.main(["--root", str(tmp_path)]) == 0  # writing removes it
    assert not (folder / "renamed_feature.md").exists()
    assert docs_reference.main(["--check", "--root", str(tmp_path)]) == 0


@pytest.mark.parametrize("name", ["recompute", "fused_ops.rope"])
def test_a_page_says_where_the_code_and_tests_are(name):
    page = docs_reference.feature_pages()[f"{name}.md"]
    code = re.search(r"^\| code \| `([^`]+)` \|$", page, re.M).group(1)
    assert (REPO / code).is_file()
    assert ("| tests | `tests/features/recompute/` |" in page) == (name == "recompute")
