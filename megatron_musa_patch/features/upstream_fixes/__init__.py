"""Fixes for upstream bugs on paths NVIDIA's own setups rarely take (every device, CUDA
included). Each fix is its own plugin, named ``upstream_fixes.<fix>``, with its own switch
(``MEGATRON_MUSA_PATCH_DISABLE=upstream_fixes.<fix>``; ``upstream_fixes`` means all of them)
and its own record in ``mmp doctor``:

* ``activation_logging_without_te`` -- activation logging hands ``isinstance`` TE's layer
  "classes", which are ``MagicMock`` instances without TE;
* ``checkpoint_without_output_fp8`` -- ``CheckpointWithoutOutput`` takes its fp8 branch without TE;
* ``moe_te_general_gemm`` -- ``moe_utils`` tests a name it defines only with TE;
* ``te_version`` -- ``is_te_min_version`` compares ``None`` with a version without TE;
* ``adam_step_after_init_state`` -- torch's Adam refuses to step moments that megatron-core's
  ``init_state_fn`` filled before any step (it makes no ``step``), which the fused ones take;
* ``distopt_step_counters`` -- the distributed optimizer's per-parameter ``step`` without
  Apex/TE, around checkpoint loads;
* ``distopt_load_no_grad`` -- loading fp32 distributed-optimizer state into views of
  grad-requiring parameters;
* ``expert_bias_out_of_place`` -- MoE experts with biases add their bias in place to an autograd
  view;
* ``experts_reduced_over_expert_dp`` -- experts split unlike the dense layers without expert
  parallelism diverge across tensor-parallel ranks;
* ``ft_warmup_iters`` -- ``--enable-ft-package`` hands nvidia-resiliency-ext 0.4.1 (the newest that
  installs before glibc 2.39) a ``num_warmup_iters`` it does not take;
* ``log_loss_reset`` -- a job's first log line on the log interval does not reset the loss
  accumulator, so the next line averages two intervals;
* ``optimizer_lr_unset`` -- the torch optimizers megatron-core falls back to without Apex/TE
  reject ``OptimizerConfig``'s default ``lr=None``, which the fused ones keep;
* ``optimizer_step_on_load`` -- torch's Adam refuses moments saved before any step (megatron-core's
  non-distributed optimizers save no step at step 0), which the fused ones take;
* ``vision_norm_without_te`` -- ``CLIPViTModel``'s default norms without TE
  (``torch.nn.LayerNorm``) cannot be built with ``config=``;
* ``writer_metadata_path`` -- 0.16's ``remove_sharded_tensors`` reads a ``metadata_path`` that
  torch's checkpoint writer no longer has;
* ``writer_threads_together`` -- from 0.17, a rank's ``torch_dist`` writer threads start only after
  the last bucket is written, so the buckets are written one after another.

Each module's docstring says what upstream does and what the fix changes.
"""
