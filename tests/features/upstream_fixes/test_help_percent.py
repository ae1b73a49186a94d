"""``upstream_fixes.help_percent``: ``--help`` of Megatron's parser formats on every release
(0.18 and 0.19 have a help string with a lone ``%``)."""

import argparse

import pytest

from megatron_musa_patch.features.upstream_fixes import help_percent

from tests.conftest import run_probe, subprocess_env


@pytest.mark.parametrize("text, expected", [
    ("headroom (e.g. 1.10 = 10%).", "headroom (e.g. 1.10 = 10%%)."),
    ("default: %(default)s, 5% more", "default: %(default)s, 5%% more"),
    ("already 50%% escaped", "already 50%% escaped"),
    ("%(default).2f and %", "%(default).2f and %%"),
])
def test_a_lone_percent_is_doubled_and_specifiers_kept(text, expected):
    assert help_percent.escaped(text) == expected


def test_the_parser_s_helps_format_after_the_wrap():
    def add(parser):
        parser.add_argument("--factor", type=float, default=1.1, help="headroom (e.g. 10%).")
        parser.add_argument("--fine", default=3, help="fine: %(default)s")
        return parser

    parser = help_percent._add_megatron_arguments(add, None, (argparse.ArgumentParser(),), {})
    text = parser.format_help()
    assert "headroom (e.g. 10%)." in text and "fine: 3" in text
    broken = add(argparse.ArgumentParser())
    with pytest.raises(ValueError):
        broken.format_help()


@pytest.mark.release
def test_megatron_s_own_parser_prints_its_help(lm_path):
    """The installed release's parser, with the layer active: --help exits 0 with the usage."""
    proc = run_probe("tests.features.upstream_fixes.probes.megatron_help",
                     env=subprocess_env(MEGATRON_LM_PATH=str(lm_path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: pretrain_gpt.py") and "--num-layers" in proc.stdout
