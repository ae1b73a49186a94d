"""``mmp plan --calibrate``: this machine's device measured into a profile file.

The ranks of one node (``--nproc-per-node``) run ``plan_calibrate_rank`` under ``mmp run`` at
once; their figures replace the base profile's speeds (``--device``: the profile whose memory and
links describe this machine; ``cpu`` when no accelerator is present), and the file records the
machine, the date and the command, so a plan made with it says what it was measured on.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

from megatron_musa_patch.base.errors import MegatronMusaPatchError


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0) + ", "
    except Exception:  # noqa: BLE001 - the machine is described without it
        gpu = ""
    return f"{gpu}{cpu}, {os.cpu_count()} cores, {platform.node()}"


def calibrate(options) -> int:
    from megatron_musa_patch.lib.plan import profile as profiles

    base_name = options.device
    base = profiles.load(base_name)
    out_path = options.output or f"mmp-profile-{base.name}.json"
    rank_script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "plan_calibrate_rank.py")
    nproc = options.nproc_per_node
    command = ["mmp", "plan", "--calibrate", "--device", base_name, "--nproc-per-node",
               str(nproc), "--output", out_path]
    print(f"mmp plan: measuring {nproc} rank{'s' if nproc > 1 else ''} of this machine "
          f"(GEMM, memory bandwidth, op cost, collectives; about a minute) ...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="mmp-calibrate-") as tmp:
        result = os.path.join(tmp, "measured.json")
        env = dict(os.environ, MMP_PLAN_CALIBRATE_OUT=result)
        done = subprocess.run([sys.executable, "-m", "megatron_musa_patch.cli.main", "run",
                               "--standalone", "--nproc-per-node", str(nproc), rank_script],
                              env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not os.path.exists(result):
            raise MegatronMusaPatchError(
                "mmp plan --calibrate: the measuring ranks failed:\n"
                + done.stdout.decode(errors="replace")[-3000:])
        with open(result, encoding="utf-8") as f:
            measured = json.load(f)
    with open(base.path, encoding="utf-8") as f:
        data = json.load(f)
    import torch

    measured.update({"machine": machine(), "date": datetime.date.today().isoformat(),
                     "command": " ".join(command), "torch": torch.__version__,
                     "ranks_per_node": nproc})
    data["measured"] = measured
    data["sources"] = dict(data["sources"], measured=f"mmp plan --calibrate on {machine()}, "
                                                     f"{measured['date']}")
    tmp_path = out_path + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp_path, out_path)
    g16 = max(v for _, v in measured["gemm"]["16"])
    g32 = max(v for _, v in measured["gemm"]["32"])
    print(f"mmp plan: wrote {out_path}: GEMM up to {g16 / 1e12:.3f} TFLOP/s (16-bit), "
          f"{g32 / 1e12:.3f} (32-bit); add "
          f"{measured['elementwise_bytes_per_s']['16'] / 1e9:.1f} GB/s (16-bit); "
          f"{measured['op_overhead_s'] * 1e6:.1f} us per op. Use it: mmp plan --device "
          f"{out_path} ...")
    return 0
