"""GMAX's tunables as the processes carry them: the ServingPool spec (operator) and the engine's flags.

One annotated type per parameter declares its bounds and meaning; the default is GMAXParams' (the
core's single declaration of GMAX's defaults, scheduler/gmax.py). The operator's CRD field and the
engine's flag both use these types, so a pool spec the API server accepts is one the engine accepts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from jitserve.scheduler.gmax import GMAXParams

GMAX_DEFAULTS = GMAXParams()

FrameSteps = Annotated[int, Field(ge=1, le=10_000, description="Delta: engine steps per scheduling frame")]
Cutoff = Annotated[
    float, Field(gt=0, le=1, description="p: GMAX's initial cutoff on the cumulative priority (tuned online)")
]
StarvationDelta = Annotated[
    float,
    Field(
        ge=0, le=1000, description="goodput tokens added to a waiting request's priority per frame it waits"
    ),
]
ClassFairness = Annotated[
    float,
    Field(
        ge=0,
        le=1,
        description="f of the attainment fairness term in GMAX's reservation: (1-f) x margin density + "
        "f x (1 - the SLO type's recent attainment); 0 ranks by margin density alone",
    ),
]
