"""Request Analyzer (JITServe §4.1): output-length upper bounds and compound-program sub-deadlines.

- `LengthPredictor`: QRF upper bound on output length, table-served, trained online.
- `PatternStore`: pattern-graph history, prefix-pruned Gaussian-kernel matching, D_s = phi(s) * D.
- `oracle_plan`, `uniform_plan`: phi from a true graph / the no-history fallback.
- `workload`: seeded synthetic lengths and programs from the papers' tables.
"""

from jitserve.scheduler.analyzer.features import SLO_TYPE_CODE, slo_type_code
from jitserve.scheduler.analyzer.length import (
    LengthPredictor,
    LengthPredictorConfig,
    RequestFeatures,
    training_rows,
)
from jitserve.scheduler.analyzer.patterns import (
    LLMCostModel,
    Match,
    NodeKind,
    PatternConfig,
    PatternGraph,
    PatternNode,
    PatternStore,
    StagePlan,
    k_medoids,
    oracle_plan,
    phi_from_stage_times,
    plan_from_phi,
    plan_from_stage_times,
    uniform_plan,
)

__all__ = [
    "SLO_TYPE_CODE",
    "LLMCostModel",
    "LengthPredictor",
    "LengthPredictorConfig",
    "Match",
    "NodeKind",
    "PatternConfig",
    "PatternGraph",
    "PatternNode",
    "PatternStore",
    "RequestFeatures",
    "StagePlan",
    "k_medoids",
    "oracle_plan",
    "phi_from_stage_times",
    "plan_from_phi",
    "plan_from_stage_times",
    "slo_type_code",
    "training_rows",
    "uniform_plan",
]
