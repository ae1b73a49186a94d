"""Checkpoints that a crash cannot make unusable, and resume that is exact
(Megatron-LM's ``megatron.training.checkpointing``). One plugin per concern, each with its own
switch (``reliability.checkpoint_safety`` means all of them):

* ``atomic_tracker`` -- the tracker is replaced atomically;
* ``tracker_check`` -- a tracker that cannot be resumed from is an error;
* ``no_rewrite_of_loaded`` -- no in-place rewrite of the loaded checkpoint;
* ``legacy_format_experts`` -- ``--ckpt-format torch`` refused where it would leave shards
  unsaved;
* ``exact_resume_rng`` -- the data iterators do not shift the CPU row's dropout stream;
* ``async_snapshot`` -- an async save of host-memory tensors writes the state of its iteration.
"""

from .atomic_tracker import AtomicTextFile  # noqa: F401 - used by tests and tools
from .common import CheckpointError  # noqa: F401
from .no_rewrite_of_loaded import loaded_latest_unchanged  # noqa: F401
from .tracker_check import check_tracker, checkpoint_dirs  # noqa: F401
