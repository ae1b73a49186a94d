"""CPU offload: the optimizer's state and step on the host (``offload.cpu_offload``)."""
