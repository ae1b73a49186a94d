"""Which upstream test files run, and the rules that classify their tests: data, no logic."""

from __future__ import annotations

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

#: the categories the pass rate counts (the tests that need neither TE nor CUDA), and those
#: listed as remaining
RUNNABLE = ("passed", "failed", "hung", "not run")
REMAINING = ("failed", "hung", "not run")

#: how the ranks are started, and how the page says it
LAUNCHERS = ("torchrun", "fork")
LAUNCHED_BY = {"torchrun": "started by torchrun",
               "fork": "forked from one process (conformance_launch.py)"}
