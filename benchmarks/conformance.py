"""Megatron-LM's own unit tests run through the layer: the device layer's conformance suite.

Runs chosen files of an unpacked Megatron-LM checkout's ``tests/unit_tests`` on N CPU ranks
(torchrun, the layer activated by ``MEGATRON_MUSA_PATCH=1``), one file at a time with a timeout
per file, and classifies every test: passed, failed (with its cause and where it belongs),
off CUDA by design (needs TransformerEngine, CUDA tensors or CUDA graphs: it cannot pass on CPU or
MUSA), skipped by upstream's own condition, hung or not run (its file hit the timeout or a rank
died). The results of each release go to ``<results>/<tag>.json``; ``docs/conformance.md`` is
generated from every release's results there, never edited by hand.

    python benchmarks/conformance.py --lm-path /path/Megatron-LM-core_v0.16.1            # default set
    python benchmarks/conformance.py --lm-path ... --set ci --nproc 8 --timeout 300       # CI slice
    python benchmarks/conformance.py --lm-path ... --set all --timeout 900   # every test_*.py file
    python benchmarks/conformance.py --lm-path ... tests/unit_tests/tensor_parallel/test_random.py
    python benchmarks/conformance.py --render-only                  # docs/conformance.md again

``--python`` picks the interpreter (a venv with the package and the release's megatron-core).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "conformance_worker.py"
FORK_LAUNCHER = HERE / "conformance_launch.py"
LAUNCHERS = ("torchrun", "fork")
LAUNCHED_BY = {"torchrun": "started by torchrun",
               "fork": "forked from one process (conformance_launch.py)"}

#: the files the issue names (tensor parallelism, RNG, initialisation, attention, MLP, blocks,
#: pipeline schedules, parallel state, gradient buffers, routers, dispatchers, MTP, RoPE and the
#: CPU-offload optimizer)
DEFAULT_SET = (
    "tensor_parallel/test_mappings.py",
    "tensor_parallel/test_random.py",
    "tensor_parallel/test_initialization.py",
    "tensor_parallel/test_cross_entropy.py",
    "tensor_parallel/test_data.py",
    "tensor_parallel/test_layers.py",
    "tensor_parallel/test_tensor_parallel_utils.py",
    "transformer/test_attention.py",
    "transformer/test_mlp.py",
    "transformer/test_transformer_block.py",
    "transformer/test_rope.py",
    "transformer/test_multi_token_prediction.py",
    "transformer/moe/test_routers.py",
    "transformer/moe/test_token_dispatcher.py",
    "transformer/moe/test_aux_loss.py",
    "pipeline_parallel/test_schedules.py",
    "distributed/test_param_and_grad_buffer.py",
    "test_parallel_state.py",
    "test_optimizer_cpu_offloading.py",
)
#: a few minutes on 2 cores: the device layer's RNG, collectives and initialisation
CI_SET = (
    "tensor_parallel/test_mappings.py",
    "tensor_parallel/test_random.py",
    "tensor_parallel/test_initialization.py",
)


def every_test_file(lm_path: Path):
    """Every test file of the checkout's tests/unit_tests, relative to it, in path order."""
    root = lm_path / "tests" / "unit_tests"
    return sorted(str(p.relative_to(root)) for p in root.rglob("test_*.py"))


#: files that are not distributed (no process group): every rank would run the same test, so
#: 8 ranks only multiply the memory (8 copies of BigNet's optimizer states)
SINGLE_PROCESS = {"test_optimizer_cpu_offloading.py"}

#: (pattern on a failure's message or a skip's reason, why it cannot pass off CUDA)
OFF_CUDA = (
    (r"TESpecProvider|transformer_engine|Transformer ?Engine|\bTE\b|is_te_min_version|TELinear"
     r"|name 'TE\w+' is not defined"
     r"|\bTE(Norm|Linear|LayerNorm|ColumnParallel|RowParallel|DotProduct|GroupedLinear|Spec)\w*"
     r"|TEDotProductAttention|HAVE_TE"
     r"|_fp8_inference_wrapped_modules",  # fp8_utils defines it only with TE
     "needs TransformerEngine"),
    (r"CUDA graph|cuda_graph|CudaGraph|cudagraph|torch\.cuda\.graph", "needs CUDA graphs"),
    (r"'cpu' == 'cuda'|device\.type == .cuda.|is_cuda|device\(type='cuda'"
     r"|Expected all tensors to be on the same device|cuda:\d"
     # expects a device tensor to be refused where host memory is required
     r"|match=\"must be on the CPU\"\): \| Failed: DID NOT RAISE",
     "checks that tensors are on a CUDA device"),
    (r"\bapex\b|Apex", "needs Apex"),
    # without TE upstream puts a MagicMock in its place (extensions/transformer_engine.py)
    (r"Mock object has no attribute|MagicMock"
     # build_module given that mock (TELinear) as a spec's module: it unpacks it as a path
     r"|base_path, name = module_path \| ValueError: not enough values to unpack "
     r"\(expected 2, got 0\)"
     # ... or calls it: a mock's side effect, run dry
     r"|result = next\(effect\) \| StopIteration",
     "needs TransformerEngine (a mock without it)"),
    (r"SymmetricMemory|symm_mem|NVSHMEM|nvshmem",
     "needs CUDA symmetric memory (NVSHMEM / NCCL windows)"),
    (r"len\(\w*_kernels\)",  # profiler_utils.collect_linked_kernels: ProfilerActivity.CUDA
     "counts the CUDA kernels torch's profiler links to an operation (a CPU run has none)"),
    (r"flash_attn|FlashAttention", "needs flash-attn"),
    (r"_nccl_version|nccl_allocator\.so|Unknown CUDA arch \(0\.0",
     "needs NCCL (the allocator tests ask torch's CUDA build for its version, and the GPU's "
     "architecture)"),
    (r"No module named '(triton|mamba_ssm|causal_conv1d)'|needs Megatron's triton kernels"
     r"|MambaSSM is not installed"
     # Triton's launcher looks for the CUDA driver (torch's CUDA build brings Triton along)
     r"|libcuda\.so"
     # flash-linear-attention: Triton GPU kernels (GatedDeltaNet)
     r"|FLA is not installed",
     "needs Triton / mamba-ssm's GPU kernels (not in a CPU build of torch)"),
    (r"[Nn]ot enough (GPU|CUDA)|requires? (a )?(GPU|CUDA)|CUDA is not available",
     "needs CUDA devices"),
)

#: (pattern on a failure's message, what of upstream's CI machine the test needs): data its CI
#: image mounts, a download (nothing here reaches the network), or a package that this
#: release's Python cannot install. Counted apart from the runnable tests, like those off CUDA:
#: they fail the same way on a CUDA machine without it
UPSTREAM_CI = (
    (r"/opt/data|/home/gitlab-runner"
     r"|tokenizers/test_tokenizer\.py.*Tokenizer (metadata file|path) doesn't exist"
     # its --vocab-file is /opt/data's GPT-2 vocabulary: the workers' tokenizer fails first
     r"|test_preprocess_data_gpt.*'NoneType' object has no attribute 'finalize'",
     "reads data upstream's CI image mounts (/opt/data)"),
    (r"huggingface\.co|HFValidationError|NameResolutionError|Max retries exceeded"
     r"|Temporary failure in name resolution|Failed to resolve|Network is unreachable",
     "downloads from the network"),
    (r"No module named '(torchvision|httpx|openai)'",
     "needs a package upstream's CI image has (torchvision / httpx / openai, of its dev "
     "extra)"),
    (r"msc://",
     "needs multi-storage-client (msc:// URLs; upstream's dev extra, in its CI image)"),
    (r"No module named 'nvidia_resiliency_ext|async_strategy=\"nvrx\"",
     "needs nvidia-resiliency-ext (upstream's dev extra, in its CI image)"),
    (r"No module named '(pretrain_hybrid|pretrain_mamba|pretrain_vlm|hybrid_builders|"
     r"mamba_builders|examples|tests\.performance_tests)'",
     "imports a script of the full Megatron-LM checkout that the release archive of "
     "../shared/upstream leaves out"),
    (r"modelopt_gpt_(mamba|hybrid)_builder|No module named 'modelopt'",
     "needs nvidia-modelopt (NVIDIA's Model Optimizer), which upstream's CI image has"),
    (r"Emerging Optimizers is not installed",
     "needs emerging-optimizers (Muon), which installs only on Python >= 3.12"),
)

CI_DATA = "needs upstream's CI environment"

#: (pattern on "<nodeid> <failure message>", its cause, the issue or upstream bug it belongs
#: to) -- what remains once the layer's fixes are in; found by reading each failure
KNOWN_CAUSES = (
    (r"ProcessGroupGloo::allgather: invalid tensor size",
     "gloo's all_gather wants every output of the input's shape (NCCL takes any views of the "
     "right size, and outputs of different sizes)",
     "ours: a regression of collectives.all_gather_into_tensor_shapes or all_gather_uneven"),
    (r"test_padding_mask_with_z_loss.* where False = <built-in method equal",
     "bitwise equality of a rounding residue: the padded tokens' logit gradient is zero only "
     "in exact arithmetic, and torch's CPU kernels leave a residue in some entries (on 1 rank "
     "with only the layer's required features: 8 of 256, |g| <= 6e-8), so the router weight's "
     "gradient differs from the unpadded run's by 5e-7 relative",
     "not ours: the test needs the device's kernels to cancel exactly"),
    (r"s\[\"step\"\]\.item\(\) for s in inner_state_dict|not torch\.is_tensor\(p_state\[\"step\"\]\)"
     r".*KeyError: 'step'",
     "without Apex/TE the optimizers read or load a per-parameter 'step' that torch's Adam "
     "creates only at its first step; the tests fill the moments themselves (exp_avg, "
     "exp_avg_sq), so those parameters have state but no step",
     "ours: a regression of upstream_fixes.distopt_step_counters or optimizer_step_on_load"),
    (r"torch\.Generator\(device=torch\.cuda\.current_device\(\)\).*Cannot access accelerator",
     "torch.Generator(device=0) asks torch for accelerator 0, which the CPU row does not have",
     "ours: a regression of the device swap's torch.Generator record"),
    (r"test_weighted_bias_swiglu\[input_dtype0\].*allclose\(x\.grad",
     "the layer's bias_swiglu_impl is more exact than the reference it is compared with: on "
     "the CPU small inputs take upstream's unfused path (autograd's silu backward, fp32 "
     "inside), while weighted_bias_swiglu_impl evaluates 1 + a(1 - sigmoid(a)) in bf16, which "
     "cancels near a = -1.28; the worst element: float64 0.02256, the layer 0.0226, the "
     "reference 0.0244 (upstream's own bias_swiglu_impl shares the reference's formula, so "
     "the two agree without the layer)",
     "not ours: the test's bf16 tolerance holds only between two copies of one formula"),
    (r"test_safe_globals\.py.*tmp_dist_ckpt",
     "the test saves on rank 0 and barriers only when a process group exists, which in "
     "upstream's CI an earlier file of the same pytest session made; run as a file of its own "
     "the other ranks read (or write into) the shared directory before rank 0 has made it",
     "not ours: upstream's test depends on the files run before it"),
    (r"test_hyper_comm_grid\.py.*Default process group has not been initialized",
     "the test mocks new_subgroups_by_enumeration but then asks dist.get_rank(), which needs a "
     "process group an earlier file of upstream's pytest session made; run as a file of its "
     "own there is none", "not ours: upstream's test depends on the files run before it"),
    (r"test_experimental_log_once\.py.*Expected exactly one log record",
     "without a process group the test expects the message on every rank, but megatron-core "
     "logs it on rank 0 only (2 ranks: rank 0 passes, rank 1 fails); in upstream's pytest "
     "session an earlier file made a group, and the test's rank-0-only branch applies",
     "not ours: upstream's test depends on the files run before it"),
    (r"test_read_metadata_non_distributed.*names iteration \d+, but",
     "the layer's checkpoint_safety.tracker_check refuses, with the fix in its message, a "
     "tracker that names a checkpoint directory that does not exist; the test writes such a "
     "tracker and expects read_metadata to return its number",
     "ours, by design: MEGATRON_MUSA_PATCH_DISABLE=checkpoint_safety.tracker_check gives "
     "upstream's behaviour"),
    (r"test_open_is_builtin_open.*_open_with_atomic_tracker",
     "the layer's checkpoint_safety.atomic_tracker hands out, in place of maybe_msc.open (the "
     "builtin open without MSC), an open that writes latest_checkpointed_iteration.txt aside and "
     "renames it into place; the test asserts identity with the builtin",
     "ours, by design: MEGATRON_MUSA_PATCH_DISABLE=checkpoint_safety.atomic_tracker gives "
     "upstream's behaviour"),
    (r"'FileSystemWriter' object has no attribute 'metadata_path'",
     "megatron-core 0.16's remove_sharded_tensors renames FileSystemWriter.metadata_path, "
     "which torch's writer no longer has (it has _get_metadata_path())",
     "ours: a regression of upstream_fixes.writer_metadata_path"),
    (r"test_missing_keys_raises_error_during_validation.*caplog\.text == ''.*dcp_logger",
     "torch's distributed-checkpoint logger (which torch sets to DEBUG) records a line when "
     "a load starts; the test expects the captured log to be empty. The layer sets no log "
     "level or propagation", "not ours: upstream's test against this torch"),
    (r"num microbatches calculator is already initialized",
     "state left by a test before it in the file that failed without its clean-up (upstream's "
     "tests reset the calculator only when they pass)",
     "not ours: see the first failure of the file"),
    (r"Cannot use ReduceOp\.PREMUL_SUM with Gloo",
     "megatron-fsdp's gradient_reduce_div_fusion (on by default for non-bf16 gradients) "
     "reduces with torch.distributed._make_nccl_premul_sum, an op of NCCL's that gloo, the CPU "
     "row's collectives, does not have; upstream's other branch (scale the gradients, then "
     "SUM) is the same reduction",
     "ours: a regression of fsdp_reduce_unfused, which takes that branch on the CPU row"),
    (r"test_integrity\.py::TestIntegrity::test_save_verify_integrity_manifest_(directly|error)"
     r".*(hash mismatch \(expected e3b0c442|DID NOT RAISE)",
     "a race in the test: every rank rewrites the same metadata.json (open 'w' truncates it) "
     "with no barrier before rank 0 hashes it, so on 8 ranks sharing 2 cores rank 0 can hash "
     "it while another rank has just emptied it (e3b0c442... is SHA-256 of no bytes); the "
     "manifest then names an empty file, which the rewritten file does not match (directly), "
     "or matches while a rank rewrites it (error: did not raise). The same test passed on "
     "0.18.2 here (timing); upstream's 0.19 test writes the file on rank 0 only, the fix",
     "not ours: upstream's test races when its ranks do not run in step"),
    (r"Timed out|timed out|TimeoutError|DistStoreError|wait timeout",
     "a collective or store wait ran past upstream's 1-minute timeout while 8 ranks share the "
     "machine's cores", "not yet shown whether the layer adds to it"),
)


#: test_model_swap's MoE parameters: 0.16-0.18, and 0.19's (a MoE mode added)
_MODEL_SWAP_MOE_0_16 = ("1-1-2-1-1-4-4", "1-1-2-1-1-1-4", "1-1-1-1-1-2-4", "1-1-2-1-2-2-4")
_MODEL_SWAP_MOE_0_19 = tuple(
    f"{case}-{mode}" for case, modes in (
        ("1-1-2-1-1-4-4", ("None",)), ("1-1-2-1-1-1-4", ("None", "latent")),
        ("1-1-1-1-1-2-4", ("None", "latent_mtp")), ("1-1-2-1-2-2-4", ("None",)),
        ("2-1-2-1-1-1-4", ("None", "latent", "latent_mtp")),
        ("1-1-1-2-1-2-4", ("None", "latent", "latent_mtp")), ("4-1-1-2-1-2-4", ("None",)),
        ("2-1-2-4-1-1-4", ("None",)), ("4-1-1-1-1-4-4", ("None",)), ("1-1-4-4-1-1-4", ("None",)))
    for mode in modes)

#: tests that off CUDA would harm the machine or hang their file, so they are deselected (and
#: listed as off CUDA by design, with this reason) rather than run: nodeid -> why
NOT_RUN_OFF_CUDA = {
    "tests/unit_tests/dist_checkpointing/models/test_mlp_glu.py::TestParallelMLPWithGLU::"
    "test_oom_is_handled":
        "fills 60% of each rank's device memory and expects torch.cat to raise "
        "OutOfMemoryError; on the CPU row the 8 ranks share the host's memory, which Linux "
        "overcommits, so the kernel's OOM killer ends a rank instead (seen once: SIGKILL)",
    **{f"tests/unit_tests/inference/test_communication_utils.py::"
       f"TestCommunicationWithCustomPPGroup::test_broadcast_comparison[{layout}]":
       "broadcast_from_last_pipeline_stage asserts tensor.is_cuda on the last stage only, so "
       "off CUDA those ranks fail while the others wait in the broadcast for ever (the file "
       "hung here, and the test after it never ran)" for layout in ("1-8", "2-4", "4-2")},
    "tests/unit_tests/distributed/mfsdp_v2/test_fully_shard.py::"
    "test_overlaps_communication_and_compute":
        "measures how collectives overlap GEMM kernels in torch's CUDA profiler, on four "
        "16384 x 16384 bf16 layers per rank (2 GB each before sharding, so that the GEMMs "
        "dominate launch jitter): 8 ranks outgrew this machine's 23 GB, and the kernel's OOM "
        "killer ended a rank at 3.3 GB (seen once)",
    "tests/unit_tests/distributed/mfsdp_v2/test_symmetric_memory.py::"
    "test_fully_shard_symmetric_memory_matches_default_and_profiles_nccl":
        "trains its model first without symmetric memory (240 s for one case on 8 ranks here), "
        "then with torch's symmetric memory, which has no CPU backend ('SymmetricMemory MemPool "
        "did not find backend for device type cpu', seen), and counts NCCL kernels in the CUDA "
        "profiler: the file ran past 900 s in its second case",
    "tests/unit_tests/inference/contexts/test_fused_kv_append_kernel.py::"
    "TestKVAppendLargeBlockIdx::test_kv_append_block_idx_overflow":
        "launches a Triton GPU kernel on an 8.6 GB KV cache per rank, which it allocates when "
        "torch.cuda.mem_get_info reports 10 GiB free; each of the 8 CPU ranks sees the host's "
        "free memory, and the kernel's OOM killer ended a rank (seen once)",
    "tests/unit_tests/determinism/correctness/test_hybrid_model.py::"
    "TestHybridModelDeterminism::test_bit_exact_under_parallelism":
        "every case builds HybridModel's Mamba layers, which need mamba-ssm's GPU kernels; off "
        "CUDA the pipeline stages holding a Mamba layer fail while a stage without one waits "
        "for them in the pipeline's receive for ever (seen with pp4: ranks 2 and 3 in "
        "recv_forward, the others in the teardown's barrier)",
    **{f"tests/unit_tests/transformer/test_transformer_block_custom_pgs.py::"
       f"TestTransformerBlockWithProcessGroups::test_mlp_with_custom_pgs[{case}]":
       "builds its MLPs from TE's linears (TELayerNormColumnParallelLinear), so it fails off "
       "CUDA; first it builds a 4096 x 16384 reference MLP and master weights, about 2.8 GB per "
       "rank: 8 ranks sharing this machine's 23 GB, and the kernel's OOM killer ended a rank "
       "(seen once: SIGKILL)"
       for case in ("8-8-1-False", "8-1-8-False", "8-2-4-False", "8-4-2-False", "8-2-4-True",
                    "8-4-2-True")},
    **{f"tests/unit_tests/resharding/test_model_swap.py::test_swap_gpt_parametrized[{case}-"
       f"{backend}]":
       "its MoE cases need TE's grouped MLP (upstream skips them without TE), but only after "
       "building the source and destination process-group collections (about 110 groups): "
       "97-256 s per case on 8 ranks and 2 cores, where the file's earlier, dense cases built "
       "theirs in 1-26 s (why is not yet found); the file ran past 900 s in them"
       for case in (*_MODEL_SWAP_MOE_0_16, *_MODEL_SWAP_MOE_0_19)
       for backend in ("nccl", "gloo")},
}


#: tests that need upstream's CI data and would take their file past its limit failing for the
#: want of it, so they are deselected (and listed as needing upstream's CI environment)
NOT_RUN_WITHOUT_CI_DATA = {
    f"tests/unit_tests/data/test_preprocess_data.py::test_preprocess_data_{kind}":
        f"reads the tokenizer files under /opt/data/tokenizers that upstream's CI image "
        f"mounts; without them it still starts 10 tokenizer workers per rank (80 processes "
        f"on this machine's 2 cores) before it fails: {seconds}"
    for kind, seconds in (("gpt", "145 s here"), ("bert", "the file's 300 s limit ran out in "
                                                         "it"))}
NEEDS_CI_ENVIRONMENT = "deselected: needs upstream's CI environment"
#: tests that fail here on some ranks only and so leave the others in a collective the rest of
#: the file then pairs wrongly (every later test hangs): deselected so the file runs, and counted
#: as failed with the cause, which is upstream's -> (why, belongs to)
NOT_RUN_DERAILS = {
    "tests/unit_tests/dist_checkpointing/test_serialization.py::TestSerialization::"
    "test_remove_sharded_tensors": (
        "a race in the test: every rank lists the checkpoint's files and metadata after save() "
        "with no barrier before rank 0 removes the prefixed ones, so on 8 ranks sharing 2 cores "
        "some ranks list after the removal (seen: 7 files of 8, the metadata without the "
        "prefix, the directory gone) and fail before their barrier, which then pairs with "
        "another; test_empty_load after it hung with 5 ranks in a barrier and 3 in save()'s "
        "all_gather (py-spy). The removal itself passes: upstream_fixes.writer_metadata_path's "
        "test", "not ours: upstream's test races when its ranks do not run in step"),
}
DERAILS = "deselected: derails its file"
#: outcome recorded -> the tests deselected with it
NOT_RUN = {"deselected": NOT_RUN_OFF_CUDA, NEEDS_CI_ENVIRONMENT: NOT_RUN_WITHOUT_CI_DATA,
           DERAILS: {n: why for n, (why, _) in NOT_RUN_DERAILS.items()}}


# ---------------------------------------------------------------------------- running a file
#: how long every rank of a file may sit idle (no event written, next to no CPU used) before
#: the file is taken as deadlocked and stopped, rather than at its timeout: ranks that left a
#: collective at different tests (one failed where the others wait) never resume, and a file's
#: timeout is sized for its slowest real work. Measured here: 8 ranks stuck in a barrier use
#: 0.4 CPU seconds a minute between them; one rank at work uses 60.
STALL_SECONDS = 240.0
#: the CPU the ranks may use in that window and still count as idle: 5% of one core
STALL_CPU_SHARE = 0.05
POLL_SECONDS = 5.0
PROC = Path("/proc")


class IdleWatch:
    """Whether a file's ranks have been idle for ``window`` seconds: no rank wrote an event,
    and the ranks with everything they started (each leads a session of its own) used less
    than ``STALL_CPU_SHARE`` of a core, read from /proc."""

    def __init__(self, out: Path, window: float):
        self.out, self.window = out, window
        self.samples = []  # (monotonic time, CPU seconds of the ranks' sessions, event bytes)
        self.sessions = set()

    def idle(self, now: float) -> bool:
        if not PROC.is_dir():  # no way to tell idle from busy: only the timeout stops a file
            return False
        sessions = set()
        for pid_file in self.out.glob("rank*.pid"):
            try:
                sessions.add(int(pid_file.read_text()))
            except ValueError:  # being written
                pass
        if sessions != self.sessions:  # ranks started: the window starts with them, not with
            # the launcher's start-up before them (their CPU then counted as none)
            self.sessions, self.samples = sessions, []
        events = sum(f.stat().st_size for f in self.out.glob("rank*.jsonl"))
        self.samples.append((now, session_cpu_seconds(sessions), events))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.pop(0)
        then, cpu_then, events_then = self.samples[0]
        return (bool(sessions) and now - then >= self.window and events == events_then
                and self.samples[-1][1] - cpu_then < STALL_CPU_SHARE * (now - then))


def session_cpu_seconds(sessions: set) -> float:
    """User and system CPU seconds of the live processes of these sessions (Linux /proc)."""
    ticks = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) in sessions:  # session id; utime and stime are fields 14 and 15
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_file(python: str, lm_path: Path, test_file: str, nproc: int, timeout: float,
             env_extra: dict, stall: float = STALL_SECONDS, launcher: str = "torchrun") -> dict:
    with tempfile.TemporaryDirectory(prefix="mmp-conformance-") as out:
        env = dict(os.environ)
        env.update(MEGATRON_MUSA_PATCH="1", MEGATRON_LM_PATH=str(lm_path),
                   MMP_CONFORMANCE_OUT=out, OMP_NUM_THREADS="1", **env_extra)
        env.setdefault("MEGATRON_MUSA_PATCH_DEVICE", "cpu")
        if launcher == "fork":  # conformance_launch.sizes_env: in place at its start-up, else
            # it starts itself again (the start-up hook's import of torch twice per file)
            env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
        deselected = {n: (outcome, why) for outcome, table in NOT_RUN.items()
                      for n, why in table.items() if n.split("::", 1)[0] == test_file}
        pytest_args = [test_file, *(f"--deselect={n}" for n in deselected)]
        command = ([python, str(FORK_LAUNCHER), f"--nproc={nproc}", "--", *pytest_args]
                   if launcher == "fork" else
                   [python, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", str(WORKER), *pytest_args])
        begin = time.monotonic()
        # output to a file, not a pipe: a rank left behind must not keep the run waiting
        log_path = Path(out) / "output.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, cwd=str(lm_path), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            watch = IdleWatch(Path(out), stall)
            while True:
                try:
                    proc.wait(timeout=POLL_SECONDS)
                    status = "finished"
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if now - begin >= timeout:
                        status = "timeout"
                    elif watch.idle(now):
                        status = f"stalled: every rank idle for {stall:.0f} s"
                    else:
                        continue
                    _kill(proc, Path(out))
                    break
        output = log_path.read_text(errors="replace")
        seconds = time.monotonic() - begin
        events = {}
        for rank_file in sorted(Path(out).glob("rank*.jsonl")):
            rank = int(rank_file.stem[4:])
            events[rank] = [json.loads(line) for line in rank_file.read_text().splitlines()
                            if line.strip()]
    killed = [code for code in re.findall(r"exitcode\s*:\s*(-\d+)", output)
              if code in ("-9", "-6", "-11")]  # not -15: torchrun's stop of the other ranks
    if status == "finished" and killed:
        status = f"rank killed (signal {-int(killed[0])})"
    tests = merge(events, status)
    tests.update(deselected_records(events, deselected))
    return {"file": test_file, "nproc": nproc, "launcher": launcher, "timeout": timeout,
            "status": status,
            "returncode": proc.returncode, "seconds": round(seconds, 1), "tests": tests,
            "output_tail": output[-2500:]}


def deselected_records(events: dict, deselected: dict) -> dict:
    """The records of the tests the runner deselected that the file has: pytest reports those
    (another release's parameters match nothing, and must not be counted). An entry may name
    a test without its parameters: like pytest's --deselect, it is a prefix of node ids."""
    found = {n for rank_events in events.values() for event in rank_events
             if event["event"] == "deselected" for n in event["nodeids"]}
    records = {}
    for nodeid in sorted(found):
        entry = listed(deselected, nodeid)
        if entry is not None:
            outcome, why = entry
            records[nodeid] = {"outcome": outcome, "message": why, "seconds": 0.0}
    return records


def listed(table: dict, nodeid: str):
    """``table``'s value for ``nodeid``: its own entry, else the longest entry that is a prefix
    of it (as pytest's --deselect matches), else None."""
    if nodeid in table:
        return table[nodeid]
    prefixes = [n for n in table if nodeid.startswith(n)]
    return table[max(prefixes, key=len)] if prefixes else None


def _kill(proc, out: Path) -> None:
    """torchrun's process group, and the ranks with what they started (each rank leads a
    session of its own: a test's worker pool, e.g. preprocess_data's, is in its group)."""
    for pid_file in out.glob("rank*.pid"):
        try:
            pid = int(pid_file.read_text())
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # not a group leader any more: the rank alone
                os.kill(pid, signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def merge(events: dict, status: str) -> dict:
    """nodeid -> {outcome, message, seconds}: a test passed where every rank passed it, failed
    where one rank failed it (the lowest such rank's message), skipped as rank 0 skipped it."""
    collected, flaky = [], set()
    for rank in sorted(events):
        for event in events[rank]:
            if event["event"] == "collected" and not collected:
                collected, flaky = event["nodeids"], set(event.get("flaky", ()))
    per_test = collections.defaultdict(dict)  # nodeid -> rank -> (outcome, message, seconds)
    started = collections.defaultdict(set)
    errors, module_skips = {}, {}
    for rank, rank_events in sorted(events.items()):
        for event in rank_events:
            if event["event"] == "start":
                started[event["nodeid"]].add(rank)
            elif event["event"] == "collect_error":
                errors.setdefault(event["nodeid"], event["message"])
            elif event["event"] == "collect_skip":
                module_skips.setdefault(event["nodeid"], event["message"])
            elif event["event"] == "report":
                outcome, message, seconds = per_test[event["nodeid"]].get(rank, ("passed", "", 0))
                seconds += event["duration"]
                if event["outcome"] == "failed" and outcome != "failed":
                    outcome, message = "failed", f"[{event['when']}] {event['message']}"
                elif event["outcome"] == "skipped" and outcome == "passed":
                    outcome, message = "skipped", event["message"]
                per_test[event["nodeid"]][rank] = (outcome, message, seconds)
    ranks = sorted(events)
    result = {}
    unfinished_seen = False
    for nodeid in collected:
        by_rank = per_test.get(nodeid, {})
        finished = [r for r in ranks if r in by_rank and _complete(events[r], nodeid)]
        failed = [r for r in finished if by_rank[r][0] == "failed"]
        seconds = max((by_rank[r][2] for r in by_rank), default=0.0)
        left = [r for r in ranks if r not in finished]
        if failed and left and status != "finished" and not unfinished_seen:
            # the failing ranks went on; the file stopped in this test, not in the next one
            outcome, message = "hung", (f"ranks {failed} failed it ({by_rank[failed[0]][1]}) "
                                        f"while ranks {left} never finished it ({status})")
            unfinished_seen = True
        elif failed:
            outcome, message = "failed", by_rank[failed[0]][1]
        elif len(finished) < len(ranks):
            ran = bool(started.get(nodeid))
            why = "timeout" if status == "timeout" else status
            if ran and not unfinished_seen:
                outcome, message = "hung", f"running when the file stopped ({why})"
                unfinished_seen = True
            else:
                outcome, message = "not run", f"the file stopped before it ({why})"
        elif by_rank[ranks[0]][0] == "skipped":
            outcome, message = "skipped", by_rank[ranks[0]][1]
        else:
            outcome, message = "passed", ""
        result[nodeid] = {"outcome": outcome, "message": message[:600],
                          "seconds": round(seconds, 2)}
        if nodeid in flaky:
            result[nodeid]["flaky"] = True
    for nodeid, message in errors.items():
        result[nodeid] = {"outcome": "failed", "message": f"[collect] {message}"[:600],
                          "seconds": 0.0}
    for nodeid, message in module_skips.items():
        result.setdefault(nodeid, {"outcome": "skipped", "message": message[:600],
                                   "seconds": 0.0})
    return result


def _complete(rank_events, nodeid) -> bool:
    return any(e["event"] == "report" and e["nodeid"] == nodeid and e["when"] == "teardown"
               for e in rank_events)


# ---------------------------------------------------------------------------- classifying
#: test names that say what they need, and files whose every test needs it (read in their source)
OFF_CUDA_NAMES = ((r"::test_te_|_te_\w*\[|::test_\w*_te\b|\[te\b|-te[-\]]|TE\w*Spec"
                    r"|\[transformer_engine",
                    "needs TransformerEngine"),
                  (r"cuda_graph|cudagraph", "needs CUDA graphs"),
                  # builds its model from get_t5_*_with_transformer_engine_block_spec; without
                  # TE it stops at typed_torch's not_none
                  (r"t5/test_t5_inference_wrapper\.py|test_encoder_decoder_text_generation_"
                   r"controller\.py", "needs TransformerEngine"),
                  # every model of these files is built from get_gpt_layer_with_transformer_
                  # engine_spec; after the first, the failures show as the microbatch
                  # calculator the failed test left initialised
                  (r"pipeline_parallel/test_pipeline_layout\.py|dist_checkpointing/test_"
                   r"pipeline_parallel_layout\.py", "needs TransformerEngine"),
                  # the even parametrisations build with use_transformer_engine=True ("TE")
                  (r"test_heterogeneous_gpt_model\.py::.*\[heterogeneous_gpt_model[02468]-",
                   "needs TransformerEngine"),
                  # hybrid_flex_router takes TE's linears whenever megatron.core.extensions.
                  # transformer_engine imports, which it does without TE (MagicMock stand-ins)
                  (r"elastification/test_hybrid_flex_router\.py",
                   "needs TransformerEngine (FlextronRouter builds TE's linears; without TE they "
                   "are upstream's MagicMock stand-ins)"),
                  # torch.cuda.max_memory_allocated is the caching allocator's peak on CUDA; the
                  # CPU row can only report the process's peak resident memory
                  (r"mfsdp_v2/test_fully_shard\.py::test_fully_shard_reduces_peak_training_"
                   r"memory",
                   "compares peaks of CUDA's caching allocator; the CPU row reports the process's "
                   "peak resident memory, which holds torch, Megatron and what malloc keeps"),
                  (r"test_symmetric_memory\.py::test_fully_shard_zero_cta",
                   "tests NCCL's zero-CTA all-gather on the copy engine; its barrier names the "
                   "CUDA device's index (None for the CPU)"),
                  # without tilelang upstream sets lighting_indexer_indices to None
                  (r"test_dsa_tilelang_kernels\.py::test_lighting_indexer_indices",
                   "needs TileLang's GPU kernels (without tilelang the indexer's entry points "
                   "are None)"),
                  # parametrised with TESpecProvider's linears: MagicMock stand-ins without TE,
                  # which pytest cannot name (a collection error of the class)
                  (r"test_multi_latent_attention\.py::TestSequenceParallelMLAAttention",
                   "needs TransformerEngine (parametrised with TESpecProvider's linears, "
                   "MagicMock stand-ins without TE)"),
                  # get_mlp_module_spec()'s default is the TE spec (use_te=True): without TE
                  # its linear layers are None
                  (r"models/test_multimodal_projector\.py",
                   "needs TransformerEngine (builds get_mlp_module_spec()'s default TE spec)"),
                  # _can_manage_tensor_for_offload takes only device.type == "cuda"
                  (r"test_fine_grained_activation_offloading\.py::test_chunk_offload_handler_"
                   r"respects_tensor_opt_out_flags",
                   "activation offloading manages only tensors whose device.type is 'cuda' (it "
                   "moves device memory to the host; on the CPU row they are host tensors)"),
                  # release_storage() then reallocate_storage() must give the buffer its old
                  # address back
                  (r"mfsdp_v2/test_dbuffer\.py::test_release_and_reallocate_storage_preserves_"
                   r"buffer_views",
                   "relies on CUDA's caching allocator handing a freed block back at the same "
                   "address (host memory is malloc's, which need not)"),
                  # call the Triton kernels of fused_mla_yarn_rope_apply / fused_indices_
                  # converter; without Triton upstream puts a no-op decorator in place of
                  # @triton.jit, so launching one fails
                  (r"fusions/test_mla_yarn_rope_apply\.py|moe/test_multihot_indices_"
                   r"converter\.py",
                   "needs Triton / mamba-ssm's GPU kernels (not in a CPU build of torch)"))


#: what the other ranks report when one of them is stopped
LOST_PEERS = r"DistNetworkError|Broken pipe|Connection reset|Connection was likely closed"


def classify(test: dict, nodeid: str = "", file_status: str = "finished") -> tuple:
    """(category, reason, belongs to) of one merged test."""
    outcome, message = test["outcome"], test["message"]
    if test.get("flaky"):  # counted apart whatever its outcome: upstream's CI does not run it
        return "flaky upstream", f"{outcome} here" + (f": {message}" if message else ""), \
            "upstream marks it flaky; its CI deselects it"
    if outcome == "passed":
        return "passed", "", ""
    if outcome in NOT_RUN:  # the reason is the runner's, as it reads now
        message = listed(NOT_RUN[outcome], nodeid) or message
    if outcome == "deselected":
        return "off CUDA by design", message, "upstream's test needs CUDA; not run here"
    if outcome == NEEDS_CI_ENVIRONMENT:
        return CI_DATA, message, "not ours: no such data or network here; not run here"
    if outcome == DERAILS:
        return "failed", message, (listed(NOT_RUN_DERAILS, nodeid) or (None, "not ours"))[1] + \
            "; not run here"
    if file_status != "finished" and outcome == "failed" and re.search(LOST_PEERS, message):
        return "not run", f"lost its peers when the file was stopped ({file_status})", \
            "see the file's time line"
    for pattern, why in OFF_CUDA_NAMES:
        if outcome in ("failed", "skipped") and re.search(pattern, nodeid):
            return "off CUDA by design", why, "upstream's test needs CUDA"
    for pattern, why in OFF_CUDA:
        if outcome in ("failed", "skipped") and re.search(pattern, message):
            return "off CUDA by design", why, "upstream's test needs CUDA"
    for pattern, why in UPSTREAM_CI:
        if outcome == "failed" and re.search(pattern, f"{nodeid} {message}"):
            return CI_DATA, why, "not ours: no such data or network here"
    if outcome == "skipped":
        return "skipped", message or "upstream's skip condition", ""
    if outcome in ("hung", "not run"):
        return outcome, message, "see the file's time line"
    for pattern, cause, where in KNOWN_CAUSES:
        if re.search(pattern, f"{nodeid} {message}"):
            return "failed", cause, where
    return "failed", message, "not yet classified"


#: the categories the pass rate counts (the tests that need neither TE nor CUDA), and those
#: listed as remaining
RUNNABLE = ("passed", "failed", "hung", "not run")
REMAINING = ("failed", "hung", "not run")


def verdicts(files):
    """(file result, nodeid, category, reason, belongs to) of every test of ``files``."""
    for file_result in files:
        for nodeid, test in file_result["tests"].items():
            yield (file_result, nodeid, *classify(test, nodeid, file_result["status"]))


def pass_rate(counts) -> tuple:
    """(passed, runnable, percent or None) from a Counter of categories."""
    runnable = sum(counts[c] for c in RUNNABLE)
    return counts["passed"], runnable, (100.0 * counts["passed"] / runnable if runnable else None)


# ---------------------------------------------------------------------------- the release
def describe_release(python: str, lm_path: Path) -> dict:
    code = ("import json, sys\nfrom pathlib import Path\n"
            "from megatron_musa_patch.upstream import installed, ranges, tables\n"
            "core = installed.megatron_core_version()\n"
            "lm = installed.megatron_lm_version(Path(sys.argv[1]))\n"
            "row = ranges.row_of(tables.MEGATRON, core)\n"
            "import torch\n"
            "print(json.dumps({'megatron_core': str(core), 'megatron_lm': str(lm),\n"
            "    'tag': row.lm_tag if row else 'unsupported', 'series': row.series if row else '',\n"
            "    'python': sys.version.split()[0], 'torch': torch.__version__}))")
    proc = subprocess.run([python, "-c", code, str(lm_path)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("MEGATRON_MUSA_PATCH")})
    if proc.returncode != 0:
        sys.exit(f"conformance: error: {python} cannot tell the release (is the package "
                 f"installed there?):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the report
def render(results_dir: Path) -> str:
    sys.path.insert(0, str(HERE))
    from machine import describe  # noqa: E402

    runs = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    lines = ["# Conformance: Megatron-LM's unit tests through the layer", "",
             "Generated by `benchmarks/conformance.py` from `docs/conformance/*.json`; do not "
             "edit by hand (run `python benchmarks/conformance.py --render-only`).", "",
             "Each file of upstream's `tests/unit_tests` ran on CPU ranks through the layer "
             "(`MEGATRON_MUSA_PATCH=1`), one file at a time with a timeout; the ranks "
             "started by `torchrun`, or forked from one process that has imported "
             "megatron-core (`--launcher fork`: the same tests, a quarter of the start-up). "
             "*Off CUDA by design*: the test needs TransformerEngine, CUDA tensors or CUDA "
             "graphs, so it cannot pass on CPU or MUSA. The pass rate counts the tests that "
             "need neither: passed / (passed + failed + hung + not run); tests upstream marks "
             "flaky (its CI deselects them) are counted apart, whatever they did, and so are "
             "those that need what upstream's CI image has: the data it mounts, downloads, a "
             "package this release's Python cannot install (they fail the same way on a CUDA "
             "machine without it).", ""]
    for run in runs:
        rel = run["release"]
        setups = collections.Counter((f.get("machine") or run["machine"],
                                      f.get("launcher", "torchrun")) for f in run["files"])
        where_run = "; ".join(f"{machine}, ranks {LAUNCHED_BY[launcher]}"
                              + (f" ({n} file{'s' * (n != 1)})" if len(setups) > 1 else "")
                              for (machine, launcher), n in sorted(setups.items()))
        # the limit most files ran with: the run-wide one is the last --update's, which may
        # have been a longer limit for one slow file
        limits = collections.Counter(f.get("timeout", run["timeout"]) for f in run["files"])
        usual_limit = max(limits, key=limits.get, default=run["timeout"])
        lines += [f"## megatron-core {rel['megatron_core']}, Megatron-LM {rel['tag']}", "",
                  f"{where_run}; {run['nproc']} ranks, {usual_limit:.0f} s per file; "
                  f"last run {run['date']}.", ""]
        counts = collections.Counter()
        by_dir = collections.defaultdict(collections.Counter)
        failures, flaky, off_cuda, ci_only = [], [], collections.Counter(), []
        for file_result, nodeid, category, reason, where in verdicts(run["files"]):
            directory = os.path.dirname(file_result["file"].replace("tests/unit_tests/", "",
                                                                    1)) or "."
            counts[category] += 1
            by_dir[directory][category] += 1
            if category == "off CUDA by design":
                off_cuda[reason] += 1
            elif category in REMAINING:
                failures.append((nodeid, category, reason, where))
            elif category == "flaky upstream":
                flaky.append((nodeid, reason))
            elif category == CI_DATA:
                ci_only.append((nodeid, reason))
        passed, runnable, percent = pass_rate(counts)
        rate = f"{percent:.1f}%" if percent is not None else "n/a"
        lines += [f"**{passed} of {runnable} runnable tests pass ({rate})**; "
                  f"{counts['off CUDA by design']} off CUDA by design, {counts['skipped']} "
                  f"skipped by upstream's own conditions, {counts['flaky upstream']} marked "
                  f"flaky by upstream (its CI does not run them; listed below), "
                  f"{counts[CI_DATA]} need what upstream's CI image has (data, downloads, a "
                  f"package; listed below).",
                  "", "| directory | passed | failed | off CUDA by design | skipped | hung | "
                  "not run | flaky upstream | needs upstream's CI environment |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for directory in sorted(by_dir):
            c = by_dir[directory]
            lines.append(f"| `{directory}` | {c['passed']} | {c['failed']} | "
                         f"{c['off CUDA by design']} | {c['skipped']} | {c['hung']} | "
                         f"{c['not run']} | {c['flaky upstream']} | {c[CI_DATA]} |")
        lines += ["", "Files (status, wall time, slowest tests):", ""]
        for file_result in run["files"]:
            slow = sorted(file_result["tests"].items(), key=lambda kv: -kv[1]["seconds"])[:3]
            slow_text = ", ".join(f"`{n.split('::', 1)[-1]}` {t['seconds']:.1f} s"
                                  for n, t in slow if t["seconds"] >= 1.0)
            ranks = file_result.get("nproc", run["nproc"])
            limit = file_result.get("timeout", run["timeout"])
            lines.append(f"- `{file_result['file']}`"
                         + (f" ({ranks} rank: not distributed)" if ranks != run["nproc"] else "")
                         + (f" ({limit:.0f} s limit)" if limit != usual_limit else "")
                         + f": {file_result['status']}, "
                         f"{file_result['seconds']:.0f} s, {len(file_result['tests'])} tests"
                         + (f"; slowest: {slow_text}" if slow_text else ""))
        if off_cuda:
            lines += ["", "Off CUDA by design:", ""]
            lines += [f"- {why}: {n}" for why, n in off_cuda.most_common()]
        lines += ["", "Remaining failures, hangs and tests not run:", ""]
        if not failures:
            lines.append("- none")
        for nodeid, category, reason, where in failures:
            lines.append(f"- `{nodeid}` ({category}): {_one_line(reason)} -- *{where}*")
        if ci_only:
            lines += ["", "Need what upstream's CI image has: its data, the network or a "
                          "package (they fail the same way on CUDA without it):", ""]
            lines += [f"- `{nodeid}`: {why}" for nodeid, why in ci_only]
        if flaky:
            lines += ["", "Marked flaky by upstream (`flaky` / `flaky_in_dev`; "
                          "`tests/unit_tests/run_ci_test.sh` deselects them), what they did here:",
                      ""]
            lines += [f"- `{nodeid}`: {_one_line(reason)}" for nodeid, reason in flaky]
        lines.append("")
    if not runs:
        lines += ["No results yet.", ""]
    lines += [f"Rendered on {describe()}.", ""]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= 300 else text[:297] + "..."


def updated(previous: dict, run: dict) -> dict:
    """``previous`` with ``run``'s files in place of its results for the same files (new files
    appended); results of another release cannot be mixed in. Each file keeps the ranks, the
    timeout and the machine it ran with (older results: the run's)."""
    if previous.get("release") != run["release"]:
        sys.exit(f"conformance: error: --update: the stored results are of release "
                 f"{previous.get('release')!r}, this run of {run['release']!r}; write them "
                 f"elsewhere (--results) or rerun them all")
    run_wide = {"nproc": previous.get("nproc"), "timeout": previous.get("timeout"),
                "machine": previous.get("machine")}
    fresh = {f["file"]: f for f in run["files"]}
    files = [fresh.pop(f["file"], None) or {**run_wide, **f} for f in previous["files"]]
    return {**run, "files": files + list(fresh.values())}


# ---------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (paths inside the checkout)")
    parser.add_argument("--lm-path", type=Path, default=os.environ.get("MEGATRON_LM_PATH"),
                        help="unpacked Megatron-LM checkout (default: MEGATRON_LM_PATH)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--nproc", type=int, default=8, help="ranks (upstream assumes 8)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file")
    parser.add_argument("--stall", type=float, default=STALL_SECONDS,
                        help="stop a file once every rank has sat idle this long (deadlocked; "
                             "0: only the timeout stops it)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="torchrun",
                        help="how the ranks start: torchrun, or forked from one process that "
                             "has imported megatron-core (a file's start-up in seconds, not a "
                             "minute, on a small machine; the CPU row only)")
    parser.add_argument("--set", choices=("default", "ci", "all"), default="default",
                        help="the issue's files, CI's slice, or every test_*.py of the tree")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "conformance")
    parser.add_argument("--markdown", type=Path, default=REPO / "docs" / "conformance.md")
    parser.add_argument("--no-write", action="store_true",
                        help="print the summary only; keep docs/ as it is (CI)")
    parser.add_argument("--update", action="store_true",
                        help="replace only these files' results in the release's results "
                             "(same --nproc and --timeout); the summary covers them all")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--min-pass-rate", type=float, default=None,
                        help="exit 1 when the runnable tests' pass rate is below this (percent)")
    args = parser.parse_args(argv)
    if args.render_only:
        args.markdown.write_text(render(args.results))
        print(f"conformance: wrote {args.markdown}")
        return 0
    if not args.lm_path or not (Path(args.lm_path) / "tests" / "unit_tests").is_dir():
        parser.error(f"--lm-path {args.lm_path}: not a Megatron-LM checkout with tests/unit_tests "
                     f"(unpack an archive of ../shared/upstream/ and point --lm-path at it)")
    lm_path = Path(args.lm_path).resolve()
    # the files run from the checkout: a relative interpreter path (.venv/bin/python) is made
    # absolute, without resolving the venv's symlink (the venv is what it names)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)
    chosen = args.files or [f"tests/unit_tests/{f}" for f in
                            {"ci": CI_SET, "default": DEFAULT_SET}.get(args.set) or
                            every_test_file(lm_path)]
    missing = [f for f in chosen if not (lm_path / f).is_file()]
    if missing:
        parser.error(f"not in {lm_path}: {', '.join(missing)}")
    release = describe_release(args.python, lm_path)
    sys.path.insert(0, str(HERE))
    from machine import describe  # noqa: E402

    machine = describe(release["python"], release["torch"])  # the ranks' interpreter
    print(f"conformance: megatron-core {release['megatron_core']} with {lm_path.name}, "
          f"{args.nproc} ranks, {args.timeout:.0f} s per file; {machine}", flush=True)
    results_file = args.results / f"{release['tag']}.json"
    stored = (json.loads(results_file.read_text())
              if args.update and results_file.is_file() else None)
    if stored is not None:  # another release's results: say so before the first file runs
        updated(stored, {"release": release, "files": []})
    files = []
    for number, test_file in enumerate(chosen, 1):
        nproc = 1 if os.path.basename(test_file) in SINGLE_PROCESS else args.nproc
        result = run_file(args.python, lm_path, test_file, nproc, args.timeout, {},
                          args.stall or float("inf"), args.launcher)
        files.append({**result, "machine": machine})
        tally = collections.Counter(category for _, _, category, _, _ in verdicts([result]))
        print(f"[{number}/{len(chosen)}] {test_file}: {result['status']} in "
              f"{result['seconds']:.0f} s: " + ", ".join(f"{n} {c}" for c, n in
                                                        sorted(tally.items())), flush=True)
        if not result["tests"]:
            print(result["output_tail"], flush=True)
        run = {"release": release, "nproc": args.nproc, "timeout": args.timeout,
               "machine": machine, "date": time.strftime("%Y-%m-%d"), "files": list(files)}
        if stored is not None:
            run = updated(stored, run)
        if not args.no_write:  # after every file: a run stopped half-way keeps what finished
            args.results.mkdir(parents=True, exist_ok=True)
            results_file.write_text(json.dumps(run, indent=1))
    counts = collections.Counter()
    for _, nodeid, category, reason, _ in verdicts(run["files"]):
        counts[category] += 1
        if category in REMAINING:
            print(f"  {category}: {nodeid}: {_one_line(reason)}")
    passed, runnable, percent = pass_rate(counts)
    rate = 100.0 if percent is None else percent  # nothing runnable fails no bar
    print(f"conformance: {passed} of {runnable} runnable tests pass ({rate:.1f}%)")
    if not args.no_write:
        args.markdown.write_text(render(args.results))
        print(f"conformance: wrote {results_file} and {args.markdown}")
    if args.min_pass_rate is not None and rate < args.min_pass_rate:
        print(f"conformance: error: pass rate {rate:.1f}% is below --min-pass-rate "
              f"{args.min_pass_rate}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
