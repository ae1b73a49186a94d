"""docs/your-own-data.md, run as written: its marked command blocks (``<!-- recipe: NAME -->``
before a fenced bash block) are taken from the page itself, so the page and this test cannot
drift. Only the variables the page's settings block defines are changed, to toy sizes on 2 CPU
ranks, on a corpus made here offline. The training run is stopped after its first checkpoint as
a preempted job would be, and the page's resume (the same command again) must continue from it
with the uninterrupted run's losses."""

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, subprocess_env
from tests.harness.stock import LOSS

PAGE = REPO / "docs" / "your-own-data.md"
BLOCK = re.compile(r"^<!-- recipe: (\w+) -->\n```bash\n(.*?)^```$", re.M | re.S)
#: the page's defaults are a 1B model on 8 devices; these are the toy sizes, each one a variable
#: the settings block defines
TOY = dict(VOCAB_SIZE=600, NPROC=2, TP=2, PP=1, NUM_LAYERS=2, HIDDEN_SIZE=64,
           FFN_HIDDEN_SIZE=128, NUM_HEADS=4, NUM_QUERY_GROUPS=2, SEQ_LENGTH=64,
           MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=4, TRAIN_ITERS=4, SAVE_INTERVAL=2,
           EVAL_ITERS=1, EVAL_INTERVAL=2, LOG_INTERVAL=1)
WORDS = ("the a model data token layer rank device train loss step save load shard text corpus "
         "weight bias norm head query key value expert router batch").split()


def recipe_blocks():
    """{name: the commands of each marked block}, in page order."""
    return {name: body for name, body in BLOCK.findall(PAGE.read_text())}


def make_corpus(folder):
    """A folder as the page describes one: JSON lines and plain text, offline, fixed seed."""
    rng = random.Random(0)

    def document():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) + "."
    folder.mkdir()
    with open(folder / "part-1.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"id": i, "text": document()}) + "\n")
    (folder / "part-2.txt").write_text("\n".join(document() for _ in range(200)) + "\n")


def run_blocks(names, cwd, lm_path, timeout=900):
    blocks = recipe_blocks()
    script = "set -euo pipefail\n" + "\n".join(blocks[n] for n in names)
    env = subprocess_env(MEGATRON_LM_PATH=str(lm_path), MEGATRON_MUSA_PATCH_DEVICE="cpu",
                         CORPUS="corpus", WORK="run", **TOY)
    # the page calls `mmp`: the one of this interpreter's environment
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' + '.join(names)} exited {proc.returncode}:\n{log[-5000:]}"
    return log


def losses(log):
    return {int(i): float(v) for i, v in LOSS.findall(log)}


def test_the_page_has_the_blocks_and_only_documented_sizes_change():
    blocks = recipe_blocks()
    assert list(blocks) == ["settings", "tokenizer", "data", "train"]
    for name in (*TOY, "CORPUS", "WORK"):  # a default the test overrides is on the page
        assert re.search(rf"^{name}=\${{{name}:-[^}}]+}}", blocks["settings"], re.M), name
    train = blocks["train"]
    for flag in ("--data-path $DATA_PATH", "--tokenizer-type HuggingFaceTokenizer",
                 '--tokenizer-model "$TOKENIZER"', '--split "$SPLIT"', "--transformer-impl local",
                 '--save "$WORK/checkpoints"', '--load "$WORK/checkpoints"',
                 '--eval-iters "$EVAL_ITERS"', '--eval-interval "$EVAL_INTERVAL"'):
        assert flag in train, flag
    assert "$MEGATRON_LM_PATH/pretrain_gpt.py" in train and train.startswith("DATA_PATH=$(mmp")


@pytest.mark.stock
@pytest.mark.ci
def test_the_recipe_trains_saves_and_resumes(lm_path, tmp_path):
    make_corpus(tmp_path / "corpus")
    log = run_blocks(["settings", "tokenizer", "data", "train"], tmp_path, lm_path)
    run = tmp_path / "run"
    assert (run / "tokenizer" / "tokenizer.json").is_file()
    assert sorted(p.name for p in (run / "data").glob("*.idx")) == [
        "part-1.jsonl_document.idx", "part-2.txt_document.idx"]
    first = losses(log)
    assert sorted(first) == [1, 2, 3, 4], log[-3000:]
    assert all(math.isfinite(v) and 0 < v < 2 * math.log(TOY["VOCAB_SIZE"]) for v in
               first.values()), first
    assert re.search(r"validation loss at iteration 2 .*lm loss value: [0-9.E+]+", log), \
        "evaluation every EVAL_INTERVAL"
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (checkpoints / "iter_0000002").is_dir() and (checkpoints / "iter_0000004").is_dir()

    # a job preempted after its save at iteration 2: the page's resume is the same command
    shutil.rmtree(checkpoints / "iter_0000004")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    log = run_blocks(["settings", "train"], tmp_path, lm_path)
    assert re.search(r"successfully loaded checkpoint from .*checkpoints.* at iteration 2", log), \
        log[-3000:]
    resumed = losses(log)
    assert sorted(resumed) == [3, 4], log[-3000:]
    assert resumed == pytest.approx({i: first[i] for i in (3, 4)}, rel=1e-6)
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
