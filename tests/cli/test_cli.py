"""``mmp`` itself, as argparse has it: no command is a usage error (the summary on stderr, status
2), ``--help`` the summary on stdout with status 0; every command's ``--help`` says what it does
and what its exit statuses mean."""

import pytest

from megatron_musa_patch.cli.main import main, parsers


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "mmp <command> [options]" in err and "checkpoint import-hf" in err


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_prints_the_summary(capsys, flag):
    assert main([flag]) == 0
    out, err = capsys.readouterr()
    assert "mmp <command> [options]" in out and err == ""


def test_an_unknown_command_names_itself(capsys):
    assert main(["doctr"]) == 2
    assert "mmp: unknown command 'doctr'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "doctor", "patches", "selftest", "data", "checkpoint"])
def test_every_command_help_has_a_description_and_exit_statuses(command):
    parser = parsers()[command]
    text = parser.format_help()
    assert parser.description and parser.description.split()[0] in text
    assert "Exit status: 0" in text
