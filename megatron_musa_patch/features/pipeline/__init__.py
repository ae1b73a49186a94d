"""Pipeline schedules: ZB-H1 on megatron-core's 1F1B, and each step's recorded timeline."""
