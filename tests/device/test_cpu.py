"""Contract of the CPU row: every CUDA site Megatron hits behaves as on a device.

The layer is activated in this process for the module's tests and undone afterwards, which
also checks that ``deactivate`` restores torch.
"""

import ast
import os
import subprocess
import sys
import time

import pytest
import torch

import megatron_musa_patch
from megatron_musa_patch.base.errors import UnsupportedOnDeviceError

from tests.conftest import REPO, run_probe, subprocess_env

ORIGINAL = {"empty": torch.empty, "device": torch.device, "to": torch.Tensor.to,
            "is_available": torch.cuda.is_available, "type": torch.Tensor.type,
            "Generator": torch.Generator}


@pytest.fixture(scope="module")
def cpu_layer():
    mp = pytest.MonkeyPatch()
    mp.setenv("MEGATRON_MUSA_PATCH_DEVICE", "cpu")
    state = megatron_musa_patch.activate(allow_late=True)
    yield state
    megatron_musa_patch.deactivate()
    mp.undo()


def test_device_queries(cpu_layer):
    assert cpu_layer.device.name == "cpu"
    assert torch.cuda.is_available() and torch.cuda.is_initialized()
    assert torch.cuda.device_count() >= 1
    before = torch.cuda.current_device()
    torch.cuda.set_device(1)
    assert torch.cuda.current_device() == 1
    torch.cuda.set_device(before)
    props = torch.cuda.get_device_properties(0)
    assert props.total_memory > 0 and props.name.startswith("CPU")
    assert torch.cuda.get_device_capability() == (0, 0)


def test_the_device_is_the_local_rank_set_after_activation():
    """A launcher that forks its ranks from one process sets LOCAL_RANK after the layer is
    active: each rank's device is still its own, until set_device says otherwise."""
    proc = run_probe("tests.device.probes.cpu_local_rank",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", LOCAL_WORLD_SIZE="4"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["3", "1"]


@pytest.mark.parametrize("spec", ["cuda", "cuda:1", 0, 1])
def test_factories_and_moves_land_on_cpu(cpu_layer, spec):
    device = spec if isinstance(spec, int) else torch.device(spec)
    assert device == torch.device("cpu") or isinstance(spec, int)
    for make in (lambda: torch.empty(2, device=spec), lambda: torch.zeros(2, device=spec),
                 lambda: torch.tensor([1.0], device=spec), lambda: torch.arange(3, device=spec),
                 lambda: torch.ones(2).to(spec), lambda: torch.ones(2).to(device=spec),
                 lambda: torch.ones(2).cuda(spec), lambda: torch.ones(2).new_zeros(3, device=spec),
                 lambda: torch.ones(2).to(spec, torch.float16)):
        assert make().device.type == "cpu"
    layer = torch.nn.Linear(2, 2).cuda()
    assert layer.to("cuda").weight.device.type == "cpu"


def test_torch_device_is_still_a_type(cpu_layer):
    assert torch.device is not ORIGINAL["device"]
    cuda = torch.device("cuda", 3)
    assert isinstance(cuda, torch.device) and isinstance(cuda, ORIGINAL["device"])
    assert cuda == torch.device("cpu") and torch.device("cpu").type == "cpu"
    assert torch.ones(1).device == torch.device("cuda")


def test_generators_for_cuda_or_an_index_are_host_generators(cpu_layer):
    # Megatron's inference sampler: torch.Generator(device=torch.cuda.current_device())
    made = [torch.Generator(device=torch.cuda.current_device()), torch.Generator("cuda"),
            torch.Generator(device=torch.device("cuda", 1)), torch.Generator()]
    assert [g.device.type for g in made] == ["cpu"] * 4
    assert all(isinstance(g, torch.Generator) for g in made + [torch.default_generator])
    draws = [torch.randn(3, generator=g.manual_seed(7)) for g in made[:2]]
    assert torch.equal(*draws)


def test_tensor_type_strings(cpu_layer):
    assert torch.ones(2).type() == "torch.cuda.FloatTensor"
    assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    half = torch.ones(2).type("torch.cuda.HalfTensor")
    assert half.dtype == torch.float16 and half.device.type == "cpu"
    # .is_cuda keeps telling the truth on CPU: nothing is on an accelerator
    assert torch.ones(1).is_cuda is False


def test_streams_and_events(cpu_layer):
    side = torch.cuda.Stream()
    default = torch.cuda.current_stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
    assert torch.cuda.current_stream() is default
    context = torch.cuda.stream(side)  # entered twice, as Megatron's grad sync does
    for _ in range(2):
        with context:
            assert torch.cuda.current_stream() is side
        assert torch.cuda.current_stream() is default
    side.wait_stream(default)
    event = side.record_event()
    assert event.query()
    default.wait_event(event)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert 15 <= start.elapsed_time(end) <= 2000  # milliseconds, like CUDA's
    torch.ones(2).record_stream(side)  # no-op, must not raise
    torch.cuda.synchronize()


def test_rng_state_round_trips_through_the_device_generator(cpu_layer):
    torch.cuda.manual_seed(5)
    state = torch.cuda.get_rng_state()
    first = torch.rand(4, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(first, torch.rand(4, device="cuda"))
    assert torch.cuda.default_generators[0] is torch.default_generator
    assert torch.cuda.initial_seed() == 5


def test_memory_statistics_are_marked_as_process_rss(cpu_layer):
    stats = torch.cuda.memory_stats()
    assert stats["mmp.source"] == "process_rss"
    assert torch.cuda.memory_allocated() > 20 * 2**20  # a Python process with torch loaded
    blob = torch.ones(64 * 2**20, dtype=torch.uint8) + 1  # 64 MiB touched
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated() - 4096
    del blob
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total


def test_nvtx_autocast_pinning_and_dataloader(cpu_layer):
    torch.cuda.nvtx.range_push("step")
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("step"):
        pass
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.bfloat16
    x = torch.empty(3, pin_memory=True)
    assert x.pin_memory() is x
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=True)
    assert loader.pin_memory is False


def test_unsupported_features_say_what_to_remove(cpu_layer):
    with pytest.raises(UnsupportedOnDeviceError, match="cpu device.*--cuda-graph-impl"):
        torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedOnDeviceError, match="memory pools"):
        torch.cuda.MemPool()
    with pytest.raises(UnsupportedOnDeviceError, match="CUDA graphs"):
        with torch.cuda.graph(None):
            pass


def test_unsupported_classes_can_be_named_in_annotations(cpu_layer):
    # transformers' continuous batching annotates `-> torch.cuda.CUDAGraph | None` at import
    annotation = torch.cuda.CUDAGraph | None
    assert torch.cuda.CUDAGraph in annotation.__args__
    assert not isinstance(object(), (torch.cuda.CUDAGraph, torch.cuda.MemPool, torch.cuda.graph))


def test_collectives_map_nccl_to_gloo(cpu_layer, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda:0"))
    try:
        assert dist.get_backend() == "gloo"
        group = dist.new_group([0], backend="nccl")
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=group)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_torch_subgroup_helpers_map_nccl_too(cpu_layer, tmp_path):
    """HyperCommGrid makes its groups with new_subgroups_by_enumeration(backend="nccl"), which
    calls distributed_c10d.new_group itself, past the torch.distributed.new_group record."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        # upstream, without it: NCCL refuses (torch 2.15 already refuses the CPU device index)
        with pytest.raises((RuntimeError, ValueError), match="NCCL|setBoundDeviceId"):
            distributed_c10d.new_subgroups_by_enumeration([[0]], backend="nccl")
        group, _ = dist.new_subgroups_by_enumeration([[0]], backend="nccl")
        assert dist.get_backend(group) == "gloo"
        group, _ = dist.new_subgroups(1, None, None, "nccl")  # backend given by position
        assert dist.get_backend(group) == "gloo"
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=group)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_gather_and_scatter_take_any_shapes_of_the_right_sizes(cpu_layer, tmp_path):
    """Megatron gathers 2-D shards into flat buffers (``gather_split_1d_tensor``, the grad
    buffers): NCCL takes that, gloo wants the large tensor in dim-0 chunks of the shard's
    shape and raises without the layer (checked below on torch's own function)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        shard = torch.arange(8.0).view(2, 4)
        flat = torch.full((8,), -1.0)
        with pytest.raises(RuntimeError, match="invalid tensor size"):
            distributed_c10d.all_gather_into_tensor.__wrapped__(flat, shard)
        dist.all_gather_into_tensor(flat, shard)
        assert flat.tolist() == list(range(8))  # written into the caller's buffer
        out = torch.zeros(2, 4)
        dist.reduce_scatter_tensor(out, torch.arange(8.0))
        assert out.flatten().tolist() == list(range(8))
        scalar = torch.tensor(3.0)
        gathered = torch.zeros(1)
        dist.all_gather_into_tensor(gathered, scalar)
        assert gathered.tolist() == [3.0]
        with pytest.raises(RuntimeError):  # wrong sizes: gloo's own error, as without the layer
            dist.all_gather_into_tensor(torch.zeros(7), shard)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("disable", ["", "device.release_dropped_groups"])
def test_destroy_model_parallel_releases_its_groups(disable):
    proc = run_probe("tests.device.probes.cpu_groups", env=subprocess_env(
        MEGATRON_MUSA_PATCH_DEVICE="cpu", MEGATRON_MUSA_PATCH_DISABLE=disable or None))
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    made = counts[0][0]
    assert made > 10  # WORLD and the groups of one initialisation
    if disable:  # upstream: each initialisation's groups (all but its gloo ones) stay behind
        assert counts[1][1] > counts[0][1] > 1 and counts[2][0] > made
    else:
        assert counts == [(made, 1)] * 3


def run_ranks(probe, argv_of_rank, env, count=2):
    """One process of the probe module ``probe`` per rank, all started before any is waited for
    (they meet in a process group), as ``run_probe`` starts one: ``[(returncode, stdout,
    stderr)]`` by rank."""
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH"))
                                                if p)}
    procs = [subprocess.Popen([sys.executable, "-m", probe, *argv_of_rank(rank)], env=env,
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for rank in range(count)]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]


@pytest.mark.parametrize("disable", ["", "device.lazy_gloo_groups"])
def test_groups_connect_on_first_use_as_with_nccl(disable, tmp_path):
    env = subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu",
                         MEGATRON_MUSA_PATCH_DISABLE=disable or None)
    ranks = run_ranks("tests.device.probes.cpu_lazy_group",
                      lambda rank: (str(rank), str(tmp_path / "store")), env)
    assert all(code == 0 for code, _, _ in ranks), [err[-2000:] for _, _, err in ranks]
    answers = [out.strip().splitlines()[-1] for _, out, _ in ranks]
    # rank 1 sees whether rank 0's new_group returned before rank 1 made the group
    assert answers[1] == ("eager 3.0" if disable else "lazy 3.0"), answers
    assert answers[0] == "made 3.0"


def test_deactivate_restores_torch():
    megatron_musa_patch.deactivate()
    try:
        assert torch.empty is ORIGINAL["empty"] and torch.device is ORIGINAL["device"]
        assert torch.Generator is ORIGINAL["Generator"]
        assert torch.Tensor.to is ORIGINAL["to"] and torch.Tensor.type is ORIGINAL["type"]
        assert torch.cuda.is_available is ORIGINAL["is_available"]
        assert not torch.cuda.is_available()
    finally:
        megatron_musa_patch.activate(allow_late=True)  # the module fixture undoes it again


def test_rng_tracker_drives_dropout_without_false_warnings():
    proc = run_probe("tests.device.probes.cpu_rng_tracker",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_cpu_initialization_draws_from_the_host_generator():
    """torch.manual_seed(42) then model_parallel_cuda_manual_seed(41): use_cpu_initialization
    stays on 42, as on a GPU (upstream's tensor_parallel/test_initialization.py, TP1 vs TP4), and
    the device generator (dropout's) is where the device seed put it."""
    proc = run_probe("tests.device.probes.cpu_host_rng",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_all_gather_takes_shards_of_different_sizes_as_nccl_does(tmp_path):
    """NCCL gathers outputs of different sizes (Megatron-FSDP's ``uneven_dtensor_to_full_
    tensor``); gloo refuses any output unlike the input (shown on torch's own function)."""
    env = subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu")
    for code, out, err in run_ranks("tests.device.probes.cpu_uneven_gather",
                                    lambda rank: (str(tmp_path / "store"), str(rank)), env):
        assert code == 0, err[-3000:]
        lines = out.splitlines()
        assert lines[0].startswith("torch's own: ProcessGroupGloo::allgather: invalid tensor size")
        assert lines[1:] == ["gathered [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0, 13.0, 14.0]]",
                             "async [[[1.0, 1.0]], [[2.0, 2.0], [2.0, 2.0]]]",
                             "even [[0.0, 0.0], [1.0, 1.0]]"]


def test_autograd_all_to_all_works_on_a_subgroup_as_on_nccl(tmp_path):
    """torch's autograd ``all_to_all`` on gloo scatters from ``src=i`` (a global rank) where i is
    a rank of the group, so on groups other than the world it names ranks outside the group, and
    its backward sends tensors of different sizes, which gloo's scatter refuses (Megatron's
    ``gather_from_context_parallel_ranks_dynamic_res``); through the layer both go through, forward
    and backward."""
    env = subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu")
    ranks = run_ranks("tests.device.probes.cpu_subgroup_all_to_all",
                      lambda rank: (str(tmp_path / "store"), str(rank)), env, count=4)
    for rank, (code, out, err) in enumerate(ranks):
        assert code == 0, err[-3000:]
        lines = out.splitlines()
        members = (0, 2) if rank % 2 == 0 else (1, 3)
        mine = members.index(rank)
        # rank 0's group is [0, 2]: torch's own loop asks for global rank 1 as the second source
        assert lines[0] == ("torch's own: Global rank 1" if rank % 2 == 0 else
                            "torch's own: Global rank 0"), lines[0]
        expected = [[(src + 1) * 10.0 + mine] * (i + 1) for i, src in enumerate(members)]
        assert lines[1] == f"received {expected}"
        # group rank j scales what it received from me by 2 j + mine + 1 in the loss
        assert lines[2] == f"grads {[[float(2 * j + mine + 1)] * (mine + 1) for j in range(2)]}"
