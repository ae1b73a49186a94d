"""The planner's logic: one rank's step measured on fake tensors, device profiles, the step time
and pipeline schedules priced from them, layouts to search (``mmp plan``)."""
