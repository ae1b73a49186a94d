"""Megatron's own checkpoint file names, which the layer reads or writes (standard library only)."""

#: in a checkpoint directory: the iteration of its newest complete save (or ``release``)
TRACKER = "latest_checkpointed_iteration.txt"
#: in every ``torch_dist`` iteration directory: megatron-core's dist_checkpointing config
DIST_METADATA = "metadata.json"
#: in a ``torch_dist`` iteration directory up to megatron-core 0.18: the common state, args included
COMMON_STATE = "common.pt"
#: in each ``mp_rank_*`` folder of a ``torch`` iteration directory: that rank's state
RANK_STATE = "model_optim_rng.pt"
