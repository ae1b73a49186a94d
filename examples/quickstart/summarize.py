"""Loss curve and throughput from Megatron-style training logs (pretrain_gpt.py or train_core.py).

    ... | python summarize.py --follow            # one short line per iteration, as they come
    python summarize.py run1.log run2.log [--json summary.json]

The second form reads the logs of a run and its resumption in order, prints the loss curve (a
table and a text plot) and the median tokens/s per device and MFU, and exits 1 when there are
no iterations or the loss did not fall.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from typing import Dict, List

# a log filter: the package's number formatting without activating the layer (torch, devices)
os.environ.setdefault("MEGATRON_MUSA_PATCH_AUTOACTIVATE", "0")
from megatron_musa_patch.lib.metrics.figures import percent  # noqa: E402

ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")
FIELDS = {
    "loss": re.compile(r"lm loss: ([0-9.Ee+-]+)"),
    "ms": re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)"),
    "tokens_per_s": re.compile(r"tokens/s/device: ([0-9.]+)"),
    "mfu": re.compile(r"MFU: ([0-9.]+)%"),
}
NOTES = re.compile(r"megatron_musa_patch throughput:|megatron-core path:|loaded checkpoint|"
                   r"saved checkpoint|error:")


def parse_line(line: str):
    match = ITERATION.search(line)
    if match is None:
        return None
    row = {"iteration": int(match.group(1)), "of": int(match.group(2))}
    for key, pattern in FIELDS.items():
        found = pattern.search(line)
        row[key] = float(found.group(1)) if found else None
    return row


def follow(stream) -> None:
    for line in stream:
        row = parse_line(line)
        if row is not None:
            mfu = f"MFU {percent(row['mfu'])}" if row["mfu"] is not None else "MFU n/a"
            tokens = f"{row['tokens_per_s']:8.0f} tokens/s/device" \
                if row["tokens_per_s"] is not None else ""
            loss = f"{row['loss']:.4f}" if row["loss"] is not None else "-"
            print(f"  iter {row['iteration']:4d}/{row['of']}  loss {loss}  {tokens}  {mfu}  "
                  f"({row['ms']:.0f} ms)", flush=True)
        elif NOTES.search(line):
            print("  " + line.strip()[:300], flush=True)


def plot(losses: Dict[int, float], height: int = 8) -> List[str]:
    """A text plot: one column per iteration, rows from the highest loss to the lowest."""
    its = sorted(losses)
    top, bottom = max(losses.values()), min(losses.values())
    span = (top - bottom) or 1.0
    row_of = {i: min(height - 1, int((top - losses[i]) / span * height)) for i in its}
    lines = []
    for level in range(height):
        cells = "".join("*" if row_of[i] == level else " " for i in its)
        lines.append(f"  {top - span * level / height:7.3f} |{cells}")
    lines.append(f"  {'':7} +{'-' * len(its)}")
    lines.append(f"  {'':7}  iteration {its[0]} .. {its[-1]}")
    return lines


def summarize(paths: List[str]) -> dict:
    rows: Dict[int, dict] = {}
    first_of_each = set()
    for path in paths:
        with open(path, errors="replace") as f:
            parsed = [r for r in map(parse_line, f) if r is not None]
        if parsed:
            first_of_each.add(parsed[0]["iteration"])
        for row in parsed:
            rows[row["iteration"]] = row
    losses = {i: r["loss"] for i, r in sorted(rows.items()) if r["loss"] is not None}
    # the first iteration of each job carries its start-up cost: not a throughput sample
    steady = [r for i, r in rows.items() if i not in first_of_each]
    pick = lambda key: [r[key] for r in steady if r[key] is not None]  # noqa: E731
    median = lambda values: statistics.median(values) if values else None  # noqa: E731
    return {"losses": losses, "iterations": sorted(rows),
            "tokens_per_s_per_device": median(pick("tokens_per_s")), "mfu_percent": median(
                pick("mfu")), "ms_per_iteration": median(pick("ms"))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="*")
    p.add_argument("--follow", action="store_true", help="filter stdin as training runs")
    p.add_argument("--json", help="write the summary here too")
    opts = p.parse_args(argv)
    if opts.follow:
        follow(sys.stdin)
        return 0
    result = summarize(opts.logs)
    losses = result["losses"]
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=1)
    if not losses:
        print("summarize: no training iterations in " + ", ".join(opts.logs), file=sys.stderr)
        return 1
    its = sorted(losses)
    print("loss curve:")
    step = max(1, len(its) // 10)
    shown = dict.fromkeys(its[::step] + its[-1:])
    print("  " + "  ".join(f"{i}:{losses[i]:.3f}" for i in shown))
    print("\n".join(plot(losses)))
    tail = statistics.mean(losses[i] for i in its[-5:])
    print(f"loss {losses[its[0]]:.3f} at iteration {its[0]} -> {tail:.3f} (mean of the last "
          f"{min(5, len(its))})")
    if result["tokens_per_s_per_device"] is not None:
        mfu = result["mfu_percent"]
        print(f"throughput (median over iterations): {result['tokens_per_s_per_device']:.0f} "
              f"tokens/s per device, {result['ms_per_iteration']:.0f} ms per iteration, MFU "
              + (percent(mfu) if mfu is not None else "n/a"))
    if not tail < losses[its[0]]:
        print("summarize: the loss did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
