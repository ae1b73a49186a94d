"""What throughput logging computes: model FLOPs per iteration (``flops``) and peak FLOP/s per
device (``peak_flops``)."""
