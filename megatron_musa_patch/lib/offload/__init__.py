"""CPU-offload optimizer and precision-aware optimizer off CUDA and without TransformerEngine.

The feature plugin (``features/offload/cpu_offload.py``) registers the patches and checks the flags;
the logic lives here, one job per module:

* ``partition``      -- which share of the parameters has its optimizer step on the host, and
                        the host copies (pinned where the device row has page-locked memory)
                        that the host optimizer steps on. The device row decides what "on the
                        accelerator" means, not ``Tensor.is_cuda``.
* ``hybrid``         -- the patches on megatron-core's ``HybridDeviceOptimizer`` and on the
                        distributed optimizer's use of it: the split above, state placement,
                        master weights kept in step with checkpoints, fp32 shards it can take.
* ``precision_adam`` -- ``PrecisionAwareAdamW``: AdamW with master weights and moments in the
                        dtypes ``--main-params-dtype`` / ``--exp-avg-dtype`` /
                        ``--exp-avg-sq-dtype`` ask for, reading ``decoupled_grad`` like TE's
                        ``FusedAdam`` (math in fp32).
* ``dtypes``         -- which dtype choices are numerically sane, for flags and configs alike.
* ``counting``       -- where each parameter's optimizer state lives (tests, benchmark, log).

Nothing here imports Megatron at module import time.
"""
