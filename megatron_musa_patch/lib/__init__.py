"""The logic the features plug into Megatron, written without Megatron's names for features:
ops and their kernels (``ops``), the CPU-offload optimizer (``offload``), fine-grained
recompute (``recompute``), DeepSeek-style MoE balancing (``moe_balance``), FLOPs and peak
numbers for MFU (``metrics``), restarts and hang detection (``elastic``), ``torch.compile`` with
one fallback policy (``compiling``)."""
