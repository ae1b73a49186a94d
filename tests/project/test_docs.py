"""The README a user reads first: short, its two commands the ones CI and the quickstart run, its
links alive (the documentation site itself is built with ``mkdocs build --strict`` by .ci/run)."""

import ast
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


#: the pages a user reads to get something done: each starts from its task and the commands;
#: measurements go to docs/benchmarks.md, history and CI to docs/contributing.md
USER_PAGES = ["README.md", *(f"docs/{name}.md" for name in (
    "index", "getting-started", "installation", "your-own-data", "data", "checkpoints",
    "examples", "devices", "musa-cluster", "mt-megatron", "toggles")),
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "features").glob("*.md"))]
#: what a measurement or CI narration looks like: medians, dates of a run, ratios (2.31x),
#: timings and bandwidths, the CI script
MEASUREMENT = re.compile(r"\bmedian|\b20\d\d-\d\d-\d\d\b|\b\d+(\.\d+)?x\b|\d ?(ms|µs|GB/s|s/GiB)\b"
                         r"|ms/iter|\.ci/run")


def page(name):
    return (REPO / name).read_text()


def test_every_user_page_starts_from_its_task_and_commands():
    late = []
    for name in USER_PAGES:
        lines = page(name).splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith("```")), None)
        if first is None or first > 40:  # the title, a short paragraph or two, the commands
            late.append((name, first))
    assert late == []


def test_user_pages_leave_measurements_and_ci_to_benchmarks_and_contributing():
    found = [f"{name}:{number}: {line.strip()}" for name in USER_PAGES
             for number, line in enumerate(page(name).splitlines(), 1)
             if MEASUREMENT.search(line)]
    assert found == [], "\n".join(found)


def setup_extras():
    """The extras setup.py declares (its extras_require keys)."""
    tree = ast.parse(page("setup.py"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    return {key.value for key in extras.keys}


def test_installation_has_the_install_commands_from_a_clone_and_a_wheel_with_every_extra():
    text = page("docs/installation.md")
    for command in ('pip install "torch>=2.11,<2.16"', 'pip install ".[training,data]"',
                    "python -m pip wheel --no-deps -w dist/ .",
                    'pip install "$(ls dist/megatron_musa_patch-*.whl)[training,data]"',
                    "export MEGATRON_LM_PATH="):
        assert command in text, command
    assert text.index("torch>=2.11") < text.index('".[training,data]"'), "torch first"
    table = set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    assert table == setup_extras(), "the extras table is setup.py's extras"


def test_install_commands_name_real_extras_and_no_index():
    """The package is on no index yet: no page installs it by name, and every extra a page
    installs exists; the README's install includes the data extra `mmp data` needs."""
    extras = setup_extras()
    for name in [*USER_PAGES, "docs/installation.md"]:
        text = page(name)
        assert not re.search(r"pip install [\"']?megatron-musa-patch", text), name
        for found in re.findall(r"pip install \S*?\.(?:whl\))?\[([\w,]+)\]", text):
            assert set(found.split(",")) <= extras, (name, found)
    install = README.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    assert 'pip install ".[training,data]"' in install and "pip wheel --no-deps" in install


def test_the_your_own_data_recipe_is_in_the_site_and_linked_from_the_start_pages():
    assert re.search(r"^\s*- [^:\n]+: your-own-data\.md$", page("mkdocs.yml"), re.M)
    assert "(docs/your-own-data.md)" in README
    assert "(your-own-data.md)" in page("docs/getting-started.md")
