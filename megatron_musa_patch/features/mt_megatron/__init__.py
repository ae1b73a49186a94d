"""MT-Megatron's command line and switches, so scripts written for it run as they are.

One plugin per concern (``MEGATRON_MUSA_PATCH_DISABLE=mt_megatron.router_flags``; ``mt_megatron``
means all of them):

* ``mt_megatron.router_flags`` -- MT's MoE router spellings as aliases of upstream's:
  ``--moe-router-use-sigmoid``, ``--moe-router-topk-limited-devices``,
  ``--moe-router-num-node-group``, ``--moe-noaux-gamma``;
* ``mt_megatron.wait_after_ckpt`` -- ``--wait-after-ckpt S``: wait S seconds after each save;
* ``mt_megatron.tp_only_amax_red`` -- ``--tp-only-amax-red``: upstream's config field (FP8 amax
  reduced over the TP group only), refused without FP8;
* ``mt_megatron.virtual_pipeline`` -- the tutorial's ``--num-layers-per-virtual-pipeline-stage``
  with ``--decoder-first/last-pipeline-num-layers``, which Megatron-LM 0.16 asserts for: passed on
  as ``--num-virtual-stages-per-pipeline-rank`` where the stages split alike;
* ``mt_megatron.env_switches`` -- MT's environment switches (``ENABLE_ZERO_BUBBLE``, ``USE_EPX``,
  ...): honoured where the layer does the same thing, named in one warning otherwise.

The other MT flags live with the features that implement them: ``--attn-recompute``,
``--mlp-recompute``, ``--recompute-variance`` (``recompute``), ``--q-rms-recompute``,
``--mla-rms-recompute`` (``recompute.mla_rms``), ``--mlp-rms-recompute`` (``recompute.mlp_rms``),
the device-level MoE losses (``moe_mla_mtp.moe_device_balance``), ``--moe-complementary-seq-aux-loss``
(``moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss``), ``--moe-router-norm-topk-prob``
(``moe_mla_mtp.moe_device_balance.topk_prob_norm``), the MTP spellings (``moe_mla_mtp.mtp_flags``).
"""
