"""Collectives by kind, as the fake world records them and device profiles price them."""

#: the kinds whose recorded tensor is one rank's shard of the whole
SHARDED = ("all_gather", "reduce_scatter")


def kind_of(op: str) -> str:
    """The collective's kind, as device profiles price it."""
    if op in ("isend", "irecv", "send", "recv"):
        return "p2p"
    if op.startswith("all_gather") or op == "_all_gather_base":
        return "all_gather"
    if op.startswith("reduce_scatter") or op == "_reduce_scatter_base":
        return "reduce_scatter"
    if op.startswith("all_to_all"):
        return "all_to_all"
    if op in ("broadcast", "reduce"):
        return "broadcast"
    return "all_reduce"
