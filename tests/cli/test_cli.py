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
    err = capsys.readouterr().err
    assert err.startswith("mmp <command> [options]")  # the usage, then the error, as argparse
    assert err.rstrip().endswith("mmp: error: unknown command 'doctr'")


@pytest.mark.parametrize("command", ["run", "doctor", "patches", "selftest", "data", "checkpoint"])
def test_every_command_help_has_a_description_and_exit_statuses(command):
    parser = parsers()[command]
    text = parser.format_help()
    assert parser.description and parser.description.split()[0] in text
    assert "Exit status: 0" in text


#: a bad input for each command, and the program its error names (argparse's ``PROG: error:``)
BAD = [
    (["frobnicate"], "mmp"),
    (["doctor", "--strict"], "mmp doctor"),
    (["patches", "--no-such-flag"], "mmp patches"),
    (["selftest", "--layouts", "tp3"], "mmp selftest"),
    (["run", "--nproc-per-node", "2", "/no/such/pretrain_gpt.py"], "mmp run"),
    (["data", "blend"], "mmp data blend"),
    (["data", "prepare", "--input", "/no/such/corpus.jsonl", "--output-dir", "/tmp/x",
      "--tokenizer-type", "NullTokenizer", "--vocab-size", "8"], "mmp data prepare"),
    (["checkpoint", "import-hf", "--hf-dir", "/no/such/model", "--save", "/tmp/x"],
     "mmp checkpoint import-hf"),
]


@pytest.mark.parametrize("argv, prog", BAD, ids=[" ".join(a[:2]) for a, _ in BAD])
def test_every_command_refuses_in_one_form(capsys, monkeypatch, argv, prog):
    """One error prefix: whatever refuses (argparse, the command, the layer's activation), the
    error line is ``<the command as typed>: error: ...`` and the exit status 2."""
    monkeypatch.setenv("MEGATRON_MUSA_PATCH_DEVICE", "cpu")
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and "Traceback" not in err, err
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), err
