"""The README a user reads first: short, its two commands the ones CI and the quickstart run, its
links alive (the documentation site itself is built with ``mkdocs build --strict`` by .ci/run)."""

import re

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
QUICKSTART = "bash examples/quickstart.sh --offline"
TESTS = "bash scripts/bootstrap.sh && .venv/bin/python -m pytest -q -n auto tests"


def two_commands():
    section = README.split("## The two commands", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line and not line.startswith("#")]


def test_the_readme_fits_in_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_two_commands_are_what_ci_and_the_quickstart_run():
    assert two_commands() == [QUICKSTART, TESTS]
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.count(TESTS) == 1  # the oldest end, word for word
    assert TESTS.replace(".venv/", ".venv312/") in ci  # the newest end, its own venv
    script = (REPO / "examples" / "quickstart.sh").read_text()
    assert re.search(r"^\s*[-\w|]*--offline[|)]", script, re.M), "quickstart.sh takes --offline"


def test_every_relative_link_of_the_readme_resolves():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links the documentation"
    assert [t for t in local if not (REPO / t).exists()] == []


def test_every_documentation_page_is_in_the_site_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))
    # a nav entry is `- Title: page.md`, or `- page.md` (the page's own heading as its title)
    assert [p for p in pages if not re.search(rf"^\s*-( [^:\n]+:)? {re.escape(p)}$", nav,
                                              re.M)] == []


def test_every_example_folder_has_a_readme_naming_its_scripts():
    for folder in sorted(p for p in (REPO / "examples").iterdir()
                         if p.is_dir() and p.name not in ("quickstart",)):
        readme = folder / "README.md"
        assert readme.is_file(), folder.name
        text = readme.read_text()
        scripts = [p.name for p in folder.iterdir() if p.suffix in (".sh", ".py")]
        assert scripts and all(name in text for name in scripts), (folder.name, scripts)
