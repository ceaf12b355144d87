"""The contracts between JITServe's processes, declared once and imported by every side.

| module | contract | written by -> read by |
|---|---|---|
| `xargs` | per-request `vllm_xargs` keys: `render_xargs`, `parse_xargs` | router -> engine |
| `classes_configmap` | classes ConfigMap: `render_classes`, `ClassSnapshot` | operator -> router, engine |
| `replica_report` | `ReplicaState` from the numbers: `assemble_replica_state` | engine, simulator -> router |
| `router_metrics` | per-class series names on the router's `/metrics` | router -> operator |
| `gmax_params` | GMAX tunables: `FrameSteps`, `Cutoff`, `StarvationDelta` | operator -> engine |

Pure like the rest of the core: stdlib, pydantic and numpy only, no I/O and no environment.
"""
