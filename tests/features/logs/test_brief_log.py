"""``logs.brief_log``: a stock run's console in brief, everything back with
``MEGATRON_MUSA_PATCH_LOG=full``."""

import argparse
import functools
import re
import warnings

import pytest
import wrapt

from megatron_musa_patch.features.logs import brief_log

from tests.harness.stock import run_stock

ITERATION = re.compile(r"iteration\s+\d+/\s*\d+ \|")
#: the progress lines startup_progress prints after 5 s of silence (their number depends on
#: the machine's speed, not on what the run prints otherwise)
PROGRESS = "megatron_musa_patch: rank 0 is "
UPSTREAM_TE_WARNING = re.compile(r"(Transformer Engine and Apex are|Apex is) not installed\.")


def test_the_argument_line_counts_what_was_given_and_what_validation_set():
    defaults = {"num_layers": None, "hidden_size": None, "lr": None, "ffn_hidden_size": None,
                "bf16": False}
    flags = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--lr": "lr",
             "--bf16": "bf16"}
    given = brief_log.given_dests(["--num-layers", "2", "--hidden-size=64", "--bf16", "7"],
                                  flags)
    assert given == {"num_layers", "hidden_size", "bf16"}
    args = argparse.Namespace(num_layers=2, hidden_size=64, lr=None, ffn_hidden_size=256,
                              bf16=True, rank=0)
    assert brief_log.arguments_paragraph(args, defaults, given) == (
        "arguments: 3 given, 1 more set by validate_args, 6 in all "
        "(MEGATRON_MUSA_PATCH_LOG=full lists them)")


def test_a_warning_is_one_line():
    assert brief_log.one_line_warning("it is so", UserWarning, "/x/y.py", 12, "  warn(") == \
        "/x/y.py:12: UserWarning: it is so\n"


def test_te_apex_warnings_are_counted_and_others_keep_their_caller():
    state = {}
    # as the record wraps it (a partial adds no frame of its own)
    warn = wrapt.FunctionWrapper(warnings.warn, functools.partial(brief_log._warn, state))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
        warn("Apex is not installed. Falling back to Torch Norm")
        line = _line_of_next_call(); warn("something else", UserWarning)  # noqa: E702
        warn("and with a stack level", UserWarning, 1)
    assert state == {"te_apex_warnings": 2}
    assert [str(w.message) for w in caught] == ["something else", "and with a stack level"]
    # attributed to this file and line, as without the wrapper (stacklevel counts past it)
    assert caught[0].filename == __file__ and caught[0].lineno == line
    assert caught[1].filename == __file__


def _line_of_next_call():
    import inspect

    return inspect.currentframe().f_back.f_lineno


def _said_beside_iterations(log):
    lines = log.splitlines()
    progress = [line for line in lines if line.startswith(PROGRESS)]
    other = [line for line in lines if not ITERATION.search(line) and line not in progress]
    return other, progress


@pytest.mark.stock
@pytest.mark.ci
def test_a_tp2_run_prints_at_most_60_lines_beside_its_iteration_lines(lm_path):
    _, _, log = run_stock(lm_path, ["--tensor-model-parallel-size", "2", "--bf16"], iters=20,
                          env={"MEGATRON_MUSA_PATCH_LOG": "brief"})
    other, progress = _said_beside_iterations(log)
    assert len([line for line in log.splitlines() if ITERATION.search(line)]) == 20
    assert len(other) <= 60, "\n".join(other)
    summary = [line for line in other if line.startswith("megatron_musa_patch ") and
               "patches: " in line]
    assert len(summary) == 1 and "0 failed" in summary[0], summary
    assert "status     patch" not in log  # the table's header
    assert not UPSTREAM_TE_WARNING.search(log)
    assert sum("TransformerEngine and Apex are not installed" in line for line in other) == 1
    assert sum(line.startswith("arguments: ") for line in other) == 1
    assert "------------------------ arguments ------------------------" not in log
    assert "Params for bucket" not in log  # Megatron's INFO messages
    # progress lines only after a silence: at most one per 5 s of a run that takes minutes
    assert len(progress) < 40


@pytest.mark.stock
def test_full_prints_upstream_s_log_and_the_table(lm_path):
    _, _, log = run_stock(lm_path, ["--tensor-model-parallel-size", "2", "--bf16"], iters=2,
                          env={"MEGATRON_MUSA_PATCH_LOG": "full"})
    assert "status     patch" in log
    assert UPSTREAM_TE_WARNING.search(log)
    assert "------------------------ arguments ------------------------" in log
    assert "Params for bucket 1" in log
    assert "arguments: " not in [line[:11] for line in log.splitlines()]
