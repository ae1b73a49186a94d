"""Upstream's fusion defaults on every device: the ``megatron_musa_patch.lib.ops`` ops plugged into
megatron-core's fusion points where the CUDA extensions (Apex, TransformerEngine, Megatron's
fused kernels) that upstream expects are missing, so no ``--no-*-fusion`` flag is needed.

One plugin per fusion, each with its own switch (``MEGATRON_MUSA_PATCH_DISABLE=fused_ops.rope``;
``fused_ops`` means all of them):

* ``fused_ops.wgrad_accumulation`` -- ``--gradient-accumulation-fusion``;
* ``fused_ops.norm`` -- ``--persist-layer-norm`` and ``--sequence-parallel`` on the local norms,
  and Apex's ``FusedLayerNorm`` without its CUDA extensions;
* ``fused_ops.softmax`` -- ``--masked-softmax-fusion``;
* ``fused_ops.rope`` -- ``--rope-fusion``;
* ``fused_ops.swiglu`` -- ``--bias-swiglu-fusion`` through ``ops.swiglu``.

``--bias-gelu-fusion`` and ``--bias-dropout-fusion`` already work everywhere (``@jit_fuser``
functions): untouched. A fusion that is switched off (or failed) stops the run at argument
validation with the ``--no-*`` flag to add instead of letting upstream fail later
(the declarations' ``flag_needs``).
"""
