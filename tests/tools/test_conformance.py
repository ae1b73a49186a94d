"""tools/conformance's bookkeeping: how the ranks' event streams become one verdict per
test, how verdicts are classified, and what docs/conformance.md says (no Megatron needed)."""

import collections
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import FIXTURES, REPO

from tools.conformance import classify, cli, render, runner, tables

WORKER = REPO / "tools" / "conformance" / "ranks" / "conformance_worker.py"
worker_spec = importlib.util.spec_from_file_location("conformance_worker", WORKER)
worker = importlib.util.module_from_spec(worker_spec)
worker_spec.loader.exec_module(worker)

F = "tests/unit_tests/x/test_f.py"


def _test_file(tmp_path, fixture, name):
    """A stand-in upstream test file (tests/fixtures/conformance/, named so that our own pytest
    does not collect it), copied into ``tmp_path`` under the test name the runner is given."""
    path = tmp_path / name
    shutil.copy(FIXTURES / "conformance" / fixture, path)
    return path


def report(nodeid, when, outcome, message="", duration=0.5):
    return {"event": "report", "nodeid": nodeid, "when": when, "outcome": outcome,
            "duration": duration, "message": message}


def passed(nodeid):
    return [{"event": "start", "nodeid": nodeid}, report(nodeid, "setup", "passed"),
            report(nodeid, "call", "passed"), report(nodeid, "teardown", "passed")]


def stream(rank):
    ids = [f"{F}::test_{n}" for n in "abcdef"]
    events = [{"event": "collected", "nodeids": ids}]
    events += passed(ids[0])
    # b fails on rank 1 only: the test failed
    events += [{"event": "start", "nodeid": ids[1]}, report(ids[1], "setup", "passed"),
               report(ids[1], "call", "failed" if rank == 1 else "passed",
                      "AssertionError: weights differ"), report(ids[1], "teardown", "passed")]
    # c is skipped by upstream's condition; d fails on a TE spec
    events += [{"event": "start", "nodeid": ids[2]},
               report(ids[2], "setup", "skipped", "Only 8 ranks"),
               report(ids[2], "teardown", "passed")]
    events += [{"event": "start", "nodeid": ids[3]}, report(ids[3], "setup", "passed"),
               report(ids[3], "call", "failed", "NameError: name 'TESpecProvider' is not "
                                                "defined"), report(ids[3], "teardown", "passed")]
    # e starts and never ends (the file's timeout); f never starts
    events += [{"event": "start", "nodeid": ids[4]}, report(ids[4], "setup", "passed")]
    return events


def test_ranks_merge_into_one_verdict_per_test():
    tests = runner.merge({0: stream(0), 1: stream(1)}, "timeout")
    outcomes = {n.split("::")[1]: t["outcome"] for n, t in tests.items()}
    assert outcomes == {"test_a": "passed", "test_b": "failed", "test_c": "skipped",
                        "test_d": "failed", "test_e": "hung", "test_f": "not run"}
    assert "weights differ" in tests[f"{F}::test_b"]["message"]
    assert tests[f"{F}::test_a"]["seconds"] == 1.5


def test_classification_and_the_generated_page(tmp_path):
    tests = runner.merge({0: stream(0), 1: stream(1)}, "timeout")
    kinds = {n.split("::")[1]: classify.classify(t, n)[0] for n, t in tests.items()}
    assert kinds == {"test_a": "passed", "test_b": "failed", "test_c": "skipped",
                     "test_d": "off CUDA by design", "test_e": "hung", "test_f": "not run"}
    assert classify.classify(tests[f"{F}::test_d"], "")[1] == "needs TransformerEngine"
    run = {"release": {"megatron_core": "0.16.1", "tag": "core_v0.16.1"}, "nproc": 2,
           "timeout": 60.0, "machine": "machine: test", "date": "2026-12-01",
           "files": [{"file": F, "status": "timeout", "seconds": 60.0, "tests": tests}]}
    (tmp_path / "core_v0.16.1.json").write_text(json.dumps(run))
    page = render.render(tmp_path)
    # the summary: one row per release (passed, failed, hung, not run, skipped, off CUDA, ...)
    assert "| megatron-core 0.16.1 (`core_v0.16.1`) | 1 | 6 | 1 | 1 | 1 | 1 | 1 | 1 | 0 | 0 | " \
           "25.0% |" in page
    assert "**1 of 4 runnable tests pass (25.0%).**" in page
    assert "- 1 failed; not yet classified" in page and "- 1 hung; see the file's time line" in page
    assert "(conformance/details/core_v0.16.1.json)" in page and "do not edit by hand" in page
    assert "--lm-path path/to/Megatron-LM-core_v0.16.1" in page
    # the per-test details: a data file, not the page
    assert "weights differ" not in page
    detail = render.details(run)
    assert detail["not passed"]["failed"] == {
        "[call] AssertionError: weights differ -- not yet classified": ["x/test_f.py::test_b"]}
    assert detail["not passed"]["hung"] and detail["not passed"]["not run"]
    assert detail["files"][0]["counts"] == {"failed": 1, "hung": 1, "not run": 1,
                                            "off CUDA by design": 1, "passed": 1, "skipped": 1}


def test_peers_of_a_stopped_rank_are_not_counted_as_failures():
    lost = {"outcome": "failed", "message": "[setup] torch.distributed.DistNetworkError: Broken "
                                            "pipe", "seconds": 0.0}
    assert classify.classify(lost, "t", "timeout")[0] == "not run"
    assert classify.classify(lost, "t", "finished")[0] == "failed"  # a real failure there


def test_the_whole_tree_is_every_test_file_in_path_order(tmp_path):
    root = tmp_path / "tests" / "unit_tests"
    for name in ("b/test_z.py", "a/test_y.py", "test_x.py", "a/helper.py", "a/conftest.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    assert runner.every_test_file(tmp_path) == ["a/test_y.py", "b/test_z.py", "test_x.py"]


def test_tests_upstream_marks_flaky_are_counted_apart_whatever_they_did():
    ids = [f"{F}::test_a", f"{F}::test_b", f"{F}::test_c"]
    events = [{"event": "collected", "nodeids": ids, "flaky": ids[1:]}]
    events += passed(ids[0]) + passed(ids[1])
    events += [{"event": "start", "nodeid": ids[2]}, report(ids[2], "setup", "passed"),
               report(ids[2], "call", "failed", "AssertionError: sizes must be the same"),
               report(ids[2], "teardown", "passed")]
    tests = runner.merge({0: events}, "finished")
    verdicts = {n.split("::")[1]: classify.classify(t, n) for n, t in tests.items()}
    assert [v[0] for v in verdicts.values()] == ["passed", "flaky upstream", "flaky upstream"]
    assert verdicts["test_c"][1].startswith("failed here: [call] AssertionError: sizes")
    counts = collections.Counter(v[0] for v in verdicts.values())
    assert classify.pass_rate(counts) == (1, 1, 100.0)


def test_an_update_replaces_only_the_files_it_ran():
    def result(name, outcome):
        return {"file": name, "tests": {f"{name}::t": {"outcome": outcome}}}
    release = {"megatron_core": "0.16.1", "tag": "core_v0.16.1"}
    stored = {"release": release, "nproc": 8, "timeout": 900.0, "date": "2026-11-30",
              "files": [result("a", "failed"), result("b", "passed")]}
    run = {"release": release, "nproc": 8, "timeout": 900.0, "date": "2026-12-01",
           "files": [result("a", "passed"), result("c", "passed")]}
    merged = render.updated(stored, run)
    assert [f["file"] for f in merged["files"]] == ["a", "b", "c"]
    assert merged["files"][0]["tests"]["a::t"]["outcome"] == "passed"
    assert merged["date"] == "2026-12-01"
    # each file keeps the limit it ran with; the stored ones keep the run's
    shorter = render.updated(stored,
                                  {**run, "timeout": 300.0,
                                   "files": [{**result("c", "passed"), "timeout": 300.0}]})
    assert [(f["file"], f["timeout"]) for f in shorter["files"]] == [
        ("a", 900.0), ("b", 900.0), ("c", 300.0)]
    # the stored results are read, not changed: the runner merges into them after every file
    assert all("timeout" not in f for f in stored["files"])
    with pytest.raises(SystemExit, match="release"):
        render.updated(stored, {**run, "release": {**release, "tag": "core_v0.19.0"}})


def test_the_page_names_each_files_machine_and_launcher(tmp_path):
    """Files of one release run on different machines, or with their ranks forked, in separate
    passes: the page says which, so a time is never read against the wrong machine."""
    def result(name, **setup):
        return {"file": name, "status": "finished", "seconds": 1.0,
                "tests": {f"{name}::t": {"outcome": "passed", "message": "", "seconds": 0.5}},
                **setup}
    release = {"megatron_core": "0.17.1", "tag": "core_v0.17.1"}
    stored = {"release": release, "nproc": 8, "timeout": 900.0, "date": "2026-11-30",
              "machine": "machine: Intel", "files": [result("a"), result("b")]}
    run = {"release": release, "nproc": 8, "timeout": 900.0, "date": "2026-12-02",
           "machine": "machine: AMD",
           "files": [result("c", launcher="fork", machine="machine: AMD")]}
    merged = render.updated(stored, run)
    assert [f["machine"] for f in merged["files"]] == ["machine: Intel"] * 2 + ["machine: AMD"]
    (tmp_path / "core_v0.17.1.json").write_text(json.dumps(merged))
    page = render.render(tmp_path)
    assert ("on AMD and Intel, ranks started by torchrun (2 files) and forked from one process "
            "(conformance_launch.py) (1 file); 8 ranks") in page
    assert [(f["file"], f["machine"], f["launcher"]) for f in render.details(merged)["files"]] \
        == [("a", "machine: Intel", "torchrun"), ("b", "machine: Intel", "torchrun"),
            ("c", "machine: AMD", "fork")]


def test_a_failure_message_keeps_the_source_line_that_raised():
    class Report:
        longrepr = ("tests/x.py:64: in setup_method\n    build()\n"
                    "specs.py:233: in get_submodules\n    backend = TESpecProvider()\n"
                    "              ^^^^^^^^^^^^^^^^\n"
                    "E   TypeError: 'NoneType' object is not callable")
    message = worker._message(Report())
    assert message == "backend = TESpecProvider() | TypeError: 'NoneType' object is not callable"
    verdict = classify.classify({"outcome": "failed", "message": message}, "t")
    assert verdict[:2] == ("off CUDA by design", "needs TransformerEngine")


def test_tests_that_need_upstreams_ci_environment_are_counted_apart_from_the_runnable_ones():
    message = ("[call] OSError: Repo id must be in the form 'repo_name' or "
               "'namespace/repo_name': '/opt/data/tokenizers/huggingface'")
    verdict = classify.classify({"outcome": "failed", "message": message}, "t")
    assert verdict[0] == tables.CI_DATA and "/opt/data" in verdict[1]
    counts = collections.Counter([verdict[0], "passed"])
    assert classify.pass_rate(counts) == (1, 1, 100.0)
    # the same message from a test that did not read upstream's data stays a failure
    plain = classify.classify({"outcome": "failed", "message": "[call] OSError: repo id"}, "t")
    assert plain[0] == "failed"


def test_a_deselected_test_is_listed_as_off_cuda_with_its_reason():
    nodeid, why = next(iter(tables.NOT_RUN_OFF_CUDA.items()))
    verdict = classify.classify({"outcome": "deselected", "message": why}, nodeid)
    assert verdict[:2] == ("off CUDA by design", why)
    spelled = classify.classify(
        {"outcome": "failed", "message": "[collect] ImportError: Transformer Engine is not "
                                         "installed. Please use local Bert layer spec instead."},
        "t")
    assert spelled[:2] == ("off CUDA by design", "needs TransformerEngine")


def test_a_test_deselected_for_want_of_ci_data_is_counted_apart_with_its_reason():
    nodeid, why = next(iter(tables.NOT_RUN_WITHOUT_CI_DATA.items()))
    verdict = classify.classify({"outcome": tables.NEEDS_CI_ENVIRONMENT, "message": why},
                                   nodeid)
    assert verdict[:2] == (tables.CI_DATA, why)
    assert tables.CI_DATA not in tables.RUNNABLE
    assert set(tables.NOT_RUN) == {"deselected", tables.NEEDS_CI_ENVIRONMENT,
                                        tables.DERAILS}


def test_a_test_deselected_because_it_derails_its_file_counts_as_failed():
    nodeid, (why, where) = next(iter(tables.NOT_RUN_DERAILS.items()))
    verdict = classify.classify({"outcome": tables.DERAILS, "message": why}, nodeid)
    assert verdict == ("failed", why, where + "; not run here")
    assert "failed" in tables.RUNNABLE  # it counts against the pass rate


def test_a_file_skipped_at_module_level_is_reported_as_skipped(tmp_path):
    test_file = _test_file(tmp_path, "skipped_module.py", "test_skipped_module.py")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "MMP_CONFORMANCE_OUT": str(out), "RANK": "0"}
    subprocess.run([sys.executable, str(WORKER),
                    test_file.name], cwd=tmp_path, env=env, capture_output=True, check=False)
    events = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    tests = runner.merge({0: events}, "finished")
    assert tests == {"test_skipped_module.py": {
        "outcome": "skipped", "message": "Skipped: needs nvidia-modelopt", "seconds": 0.0}}


def test_only_deselected_tests_the_file_has_are_recorded(tmp_path):
    # a release whose file lacks a listed test (other parameters, say) gets no record of it
    _test_file(tmp_path, "kept_and_harmful.py", "test_two.py")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "MMP_CONFORMANCE_OUT": str(out), "RANK": "0"}
    subprocess.run([sys.executable, str(WORKER),
                    "test_two.py", "--deselect=test_two.py::test_harmful",
                    "--deselect=test_two.py::test_renamed[x]"],
                   cwd=tmp_path, env=env, capture_output=True, check=False)
    events = {0: [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]}
    listed = {"test_two.py::test_harmful": ("deselected", "would harm the machine"),
              "test_two.py::test_renamed[x]": ("deselected", "another release's test")}
    assert runner.deselected_records(events, listed) == {
        "test_two.py::test_harmful": {"outcome": "deselected",
                                      "message": "would harm the machine", "seconds": 0.0}}
    assert set(runner.merge(events, "finished")) == {"test_two.py::test_kept"}


def test_a_test_some_ranks_failed_while_the_others_never_finished_is_where_the_file_hung():
    ids = [f"{F}::test_broadcast", f"{F}::test_send_recv"]
    collected = {"event": "collected", "nodeids": ids, "flaky": []}
    failing = [{"event": "start", "nodeid": ids[0]}, report(ids[0], "setup", "passed"),
               report(ids[0], "call", "failed", "AssertionError: assert tensor.is_cuda"),
               report(ids[0], "teardown", "passed"), {"event": "start", "nodeid": ids[1]},
               report(ids[1], "setup", "passed")]
    waiting = [{"event": "start", "nodeid": ids[0]}, report(ids[0], "setup", "passed")]
    tests = runner.merge({0: [collected] + waiting, 1: [collected] + failing}, "timeout")
    assert tests[ids[0]]["outcome"] == "hung"
    assert tests[ids[0]]["message"].startswith("ranks [1] failed it ([call] AssertionError")
    assert "ranks [0] never finished it (timeout)" in tests[ids[0]]["message"]
    assert tests[ids[1]]["outcome"] == "not run"
    # a file that finished reports the failure as it is
    finished = runner.merge({1: [collected] + failing}, "finished")
    assert finished[ids[0]]["outcome"] == "failed"


def test_a_failure_in_a_helper_keeps_the_line_that_called_it():
    class Report:
        longrepr = ("tests/unit_tests/models/test_x.py:70: in setup_method\n"
                    ">       spec = get_spec(config, use_te=True)\n"
                    "megatron/core/models/gpt/specs.py:120: in get_spec\n"
                    ">       linear_fc1=not_none(TELayerNormColumnParallelLinear),\n"
                    "megatron/core/typed_torch.py:49: in not_none\n"
                    ">           raise ValueError('Expected value to be not None')\n"
                    "E           ValueError: Expected value to be not None")
    message = worker._message(Report())
    assert message == (">       linear_fc1=not_none(TELayerNormColumnParallelLinear), | "
                       ">           raise ValueError('Expected value to be not None') | "
                       "ValueError: Expected value to be not None")
    verdict = classify.classify({"outcome": "failed", "message": message}, "t")
    assert verdict[:2] == ("off CUDA by design", "needs TransformerEngine")


def _alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stopped_file_leaves_no_process_of_its_ranks_behind(tmp_path):
    """A rank leads a session of its own; what its test started (preprocess_data's worker
    pool) must end with it, not keep the next file's cores busy."""
    rank = subprocess.Popen([sys.executable, "-m", "tests.tools.probes.rank_with_pool"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    pool_pid = int(rank.stdout.readline())
    (tmp_path / "rank0.pid").write_text(str(rank.pid))
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                start_new_session=True)
    runner._kill(launcher, tmp_path)
    rank.wait(timeout=30)
    for _ in range(100):
        if not _alive(pool_pid):
            break
        time.sleep(0.1)
    assert not _alive(pool_pid) and rank.returncode == -9 and launcher.returncode == -9


def _session_leader(tmp_path, *argv, rank=0):
    """A stand-in rank, ``python *argv`` (run from the repository root, so ``-m`` finds the
    probes): a process leading a session of its own, its pid where the runner reads it."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, start_new_session=True)
    (tmp_path / f"rank{rank}.pid").write_text(str(proc.pid))
    return proc


def _watched(tmp_path, window, write_events=False):
    """IdleWatch's verdicts over 1.5 windows, sampled as the runner does."""
    watch = runner.IdleWatch(tmp_path, window)
    verdicts = []
    begin = time.monotonic()
    while time.monotonic() - begin < 1.5 * window:
        if write_events:
            with open(tmp_path / "rank0.jsonl", "a") as f:
                f.write('{"event": "start", "nodeid": "t"}\n')
        verdicts.append(watch.idle(time.monotonic()))
        time.sleep(0.2)
    return verdicts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_that_sit_idle_for_the_window_are_stalled_and_busy_ones_are_not(tmp_path):
    # a rank blocked in a collective sleeps: no CPU, no events
    waiting = _session_leader(tmp_path, "-c", "import time; time.sleep(60)")
    try:
        verdicts = _watched(tmp_path, window=1.5)
        assert verdicts[0] is False and verdicts[-1] is True  # only once a window has passed
        # events written meanwhile: a test finished, so the file is not stuck
        assert not any(_watched(tmp_path, window=1.5, write_events=True))
    finally:
        waiting.kill()
    busy_dir = tmp_path / "busy"
    busy_dir.mkdir()
    # a rank at work (a long GEMM) writes no event either, but uses CPU
    busy = _session_leader(busy_dir, "-c", "while True: pass")
    try:
        assert not any(_watched(busy_dir, window=1.5))
    finally:
        busy.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_idle_window_starts_when_the_ranks_do(tmp_path):
    """The launcher's start-up (megatron-core imported before the fork: a minute or more on a
    loaded 2-core machine) is not rank idleness: ranks that appear after a window of it have
    a window of their own before they count as stalled."""
    watch = runner.IdleWatch(tmp_path, window=60)
    assert watch.idle(0.0) is False  # launching: no rank yet
    rank = _session_leader(tmp_path, "-c", "import time; time.sleep(60)")
    try:
        assert watch.idle(70.0) is False  # forked a moment ago, nothing collected yet
        assert watch.idle(100.0) is False
        assert watch.idle(135.0) is True  # a whole window since the ranks began, all asleep
    finally:
        rank.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cpu_is_counted_over_the_ranks_whole_sessions(tmp_path):
    # the rank waits, a process it started (a data worker) computes: the file is not stuck
    rank = _session_leader(tmp_path, "-m", "tests.tools.probes.rank_with_busy_child")
    try:
        time.sleep(0.5)
        before = runner.session_cpu_seconds({rank.pid})
        time.sleep(1.0)
        # its child's CPU is counted (a share of a core, whatever else the machine runs)
        assert runner.session_cpu_seconds({rank.pid}) - before > 0.05
        assert not any(_watched(tmp_path, window=1.5))
    finally:
        os.killpg(rank.pid, 9)


def test_a_deselect_entry_without_parameters_covers_every_case_of_the_test():
    table = {f"{F}::test_pp": ("deselected", "needs mamba-ssm"),
             f"{F}::test_pp[pp4]": ("deselected", "this case's own reason")}
    assert classify.listed(table, f"{F}::test_pp[pp2]") == ("deselected", "needs mamba-ssm")
    assert classify.listed(table, f"{F}::test_pp[pp4]")[1] == "this case's own reason"
    assert classify.listed(table, f"{F}::test_other") is None
    events = {0: [{"event": "deselected", "nodeids": [f"{F}::test_pp[pp2]", f"{F}::test_pp[a]"]}]}
    records = runner.deselected_records(events, table)
    assert set(records) == {f"{F}::test_pp[pp2]", f"{F}::test_pp[a]"}
    assert records[f"{F}::test_pp[a]"]["message"] == "needs mamba-ssm"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_file_whose_ranks_deadlock_is_stopped_once_they_sit_idle(tmp_path, lm_path):
    """Ranks that left a collective at different tests wait for each other for ever: the file
    stops after the idle window, not at its timeout, with the test where they parted hung."""
    test_file = _test_file(tmp_path, "diverging.py", "test_diverging.py")
    begin = time.monotonic()
    result = runner.run_file(sys.executable, lm_path, str(test_file), 2, timeout=600,
                                  env_extra={}, stall=10)
    assert time.monotonic() - begin < 300
    assert result["status"] == "stalled: every rank idle for 10 s"
    outcomes = {n.split("::")[1]: t["outcome"] for n, t in result["tests"].items()}
    assert outcomes == {"test_before": "passed", "test_diverges": "hung", "test_after": "not run",
                        "test_never_reached": "not run"}
    assert result["tests"][next(n for n in result["tests"] if "diverges" in n)]["message"] == (
        "ranks [0] failed it ([call] >           raise AssertionError(\"rank 0 leaves the "
        "collective\") | AssertionError: rank 0 leaves the collective) while ranks [1] never "
        "finished it (stalled: every rank idle for 10 s)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_out_of_step_all_finish_and_a_collection_error_stops_only_its_class(tmp_path,
                                                                                   lm_path):
    """Without a process group ranks do not run in step: one that gets through the file first
    with a failure must not make torchrun stop the others; and a class pytest cannot collect is
    one failure, not the end of the file."""
    test_file = _test_file(tmp_path, "out_of_step.py", "test_out_of_step.py")
    result = runner.run_file(sys.executable, lm_path, str(test_file), 2, timeout=600,
                                  env_extra={}, stall=60)
    assert result["status"] == "finished", result["output_tail"]
    outcomes = {n.split("::", 1)[1]: t["outcome"] for n, t in result["tests"].items()}
    assert outcomes["test_fails_on_rank_0"] == "failed"
    assert outcomes["test_later_on_rank_1"] == "passed", result["tests"]
    assert [o for n, o in outcomes.items() if "Uncollectable" in n] == ["failed"], outcomes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks; reads /proc")
def test_forked_ranks_have_torchruns_environment_store_and_group(tmp_path, lm_path):
    test_file = _test_file(tmp_path, "forked_ranks.py", "test_forked.py")
    result = runner.run_file(sys.executable, lm_path, str(test_file), 2, timeout=600,
                                  env_extra={}, stall=60, launcher="fork")
    assert result["status"] == "finished", result["output_tail"]
    assert result["launcher"] == "fork"
    outcomes = {n.split("::", 1)[1]: t["outcome"] for n, t in result["tests"].items()}
    assert outcomes == dict.fromkeys(["test_a_rank_has_what_torchrun_gives_it",
                                      "test_the_store_outlives_the_rank_that_leaves_first",
                                      "test_a_group_on_the_store"], "passed"), result["tests"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks; reads /proc")
@pytest.mark.parametrize("launcher", tables.LAUNCHERS)
def test_a_killed_rank_stops_the_file_and_is_named_as_under_torchrun(tmp_path, lm_path,
                                                                      launcher):
    test_file = _test_file(tmp_path, "killed_rank.py", "test_killed.py")
    begin = time.monotonic()
    result = runner.run_file(sys.executable, lm_path, str(test_file), 2, timeout=600,
                                  env_extra={}, stall=300, launcher=launcher)
    assert time.monotonic() - begin < 110  # not rank 0's two minutes: it was stopped
    assert result["status"] == "rank killed (signal 9)", result["output_tail"]
    assert result["returncode"] != 0


def test_the_page_gives_the_limit_most_files_ran_with(tmp_path):
    """One slow file rerun with a longer limit (the last --update's) does not make the page say
    every file had it: the header gives the usual limit, the odd file its own."""
    def result(name, timeout):
        return {"file": name, "status": "finished", "seconds": 1.0, "timeout": timeout,
                "tests": {f"{name}::t": {"outcome": "passed", "message": "", "seconds": 0.5}}}
    release = {"megatron_core": "0.18.2", "tag": "core_v0.18.2"}
    run = {"release": release, "nproc": 8, "timeout": 1800.0, "date": "2026-12-03",
           "machine": "machine: test",
           "files": [result("a", 900.0), result("b", 900.0), result("c", 1800.0)]}
    (tmp_path / "core_v0.18.2.json").write_text(json.dumps(run))
    page = render.render(tmp_path)
    assert "8 ranks, 900 s per file" in page and "--timeout 900" in page
    assert [(f["file"], f["status"], f["limit"]) for f in render.details(run)["files"]] == [
        ("a", "finished", 900.0), ("b", "finished", 900.0), ("c", "finished", 1800.0)]


def test_the_committed_summary_and_details_are_what_the_results_give():
    """docs/conformance.md and docs/conformance/details/ are generated: a result changed without
    rendering them again (python -m tools.conformance --render-only) fails here."""
    results = REPO / "docs" / "conformance"
    assert render.stale(results, REPO / "docs" / "conformance.md") == []
    page = (REPO / "docs" / "conformance.md").read_text()
    assert len(page.split()) < 1500, "the page is a summary; the details are data files"
    for tag in sorted(p.stem for p in results.glob("*.json")):
        assert f"(conformance/details/{tag}.json)" in page and (results / "details" /
                                                                 f"{tag}.json").is_file()


def test_check_names_a_stale_missing_or_extra_generated_file(tmp_path, capsys):
    results, page = tmp_path / "conformance", tmp_path / "conformance.md"
    results.mkdir()
    tests = {f"{F}::test_a": {"outcome": "passed", "message": "", "seconds": 0.5},
             f"{F}::test_b": {"outcome": "failed", "message": "AssertionError", "seconds": 0.5}}
    run = {"release": {"megatron_core": "0.16.1", "tag": "core_v0.16.1"}, "nproc": 2,
           "timeout": 60.0, "machine": "machine: test", "date": "2026-12-01",
           "files": [{"file": F, "status": "finished", "seconds": 1.0, "tests": tests}]}
    (results / "core_v0.16.1.json").write_text(json.dumps(run))
    check = ["--check", "--results", str(results), "--markdown", str(page)]
    assert cli.main(check) == 1 and "conformance.md" in capsys.readouterr().err  # never written
    assert cli.main(["--render-only", "--results", str(results), "--markdown", str(page)]) == 0
    assert cli.main(check) == 0
    # a result changed and not rendered: the page and the release's details are stale
    tests[f"{F}::test_b"]["outcome"] = "passed"
    (results / "core_v0.16.1.json").write_text(json.dumps(run))
    capsys.readouterr()
    assert cli.main(check) == 1
    err = capsys.readouterr().err
    assert "conformance.md" in err and "details/core_v0.16.1.json" in err
    assert cli.main(["--render-only", "--results", str(results), "--markdown", str(page)]) == 0
    assert "**2 of 2 runnable tests pass (100.0%).**" in page.read_text()
    # details of a release without results
    (results / "details" / "core_v0.17.1.json").write_text("{}")
    assert cli.main(check) == 1 and "core_v0.17.1.json (no such release)" in \
        capsys.readouterr().err
