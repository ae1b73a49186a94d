"""Pipeline schedules beside megatron-core's: the zero-bubble ones and their timeline."""
