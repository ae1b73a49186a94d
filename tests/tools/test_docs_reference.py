"""tools/docs_reference.py: the CLI and environment references are generated from the code, list
every option and variable it defines, and the committed pages are current."""

import argparse

from tools import docs_reference

from tests.conftest import REPO


def test_the_committed_pages_are_what_the_code_says():
    assert (REPO / "docs" / "reference" / "cli.md").read_text() == docs_reference.cli_page()
    assert (REPO / "docs" / "reference" / "environment.md").read_text() == \
        docs_reference.environment_page()
    assert (REPO / "docs" / "troubleshooting.md").read_text() == \
        docs_reference.troubleshooting_page()


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
