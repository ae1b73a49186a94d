"""One rank's pipeline state across schedule calls, shared by the zero-bubble schedule and the
timeline (``Session.state_for(RUN_KEY, PipelineRun)``): the held-back weight gradients, the
schedule call in progress and what it records."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

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
    #: the timeline's labels of the next forward and backward pass: micro-batch and model chunk
    forwards: int = 0
    backwards: int = 0
    chunk: int = 0
    #: ``--pipeline-v-schedule`` (None: megatron-core's placement and schedules)
    v_schedule: Optional[str] = None
    #: the V schedules' orders by (schedule, ranks, micro-batches), computed once each
    v_plans: Dict[Tuple[str, int, int], Dict[int, list]] = dataclasses.field(
        default_factory=dict)
    #: the V schedules' second pipeline group (transfers down the pipeline)
    down_group: Any = None
