"""The device table and everything that reads it.

``rows`` holds one :class:`~.base.DeviceMapping` per device (what Megatron's CUDA spellings mean
there, whether the row rewrites CUDA, its collective backend), ``names`` their names without
torch; ``select`` picks the row a run takes; ``torch_api``/``adapter`` map torch's CUDA API onto
it; ``torchada_import`` imports torchada before torch. This module imports nothing, so
``torchada_import`` can run before torch.
"""
