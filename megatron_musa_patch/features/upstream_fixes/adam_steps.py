"""The step torch's Adam state is at when it has none yet (shared by the two step fixes)."""

from __future__ import annotations

from typing import Iterable, Optional


def shared_step(states: Iterable[dict]) -> Optional[float]:
    """The step the states that have one share, else 0 (none has stepped yet); None when their
    steps differ, which megatron-core refuses itself."""
    steps = {float(state["step"]) for state in states if "step" in state}
    if len(steps) > 1:
        return None
    return steps.pop() if steps else 0.0
