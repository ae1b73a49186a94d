"""One rank's pipeline state across schedule calls, shared by the zero-bubble schedule and the
timeline (``Session.state_for(RUN_KEY, PipelineRun)``): the held-back weight gradients, the
schedule call in progress and what it records."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .timeline import Timeline
from .weight_gradients import WeightGradients
from .zero_bubble import ZeroBubbleH1

RUN_KEY = "pipeline.run"


@dataclasses.dataclass
class PipelineRun:
    store: WeightGradients = dataclasses.field(default_factory=WeightGradients)
    #: the zero-bubble decisions of the schedule call in progress (None: plain 1F1B)
    zero_bubble: Optional[ZeroBubbleH1] = None
    #: the timeline of the schedule call in progress (None: not recorded)
    timeline: Optional[Timeline] = None
    #: schedule calls that trained (not forward-only), this run
    calls: int = 0
    forwards: int = 0
    backwards: int = 0
