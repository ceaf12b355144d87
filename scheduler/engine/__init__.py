"""Engine-side JITServe: everything the vLLM adapter needs that does not itself import vLLM.

- `xargs`: the `vllm_xargs` keys a request (or the router) sets, parsed into an SLO in one place;
- `classes`: the SLO classes file the operator's ConfigMap provides, re-read when it changes;
- `speed`: online step-time and prefill-rate measurement (`EngineSpeed`);
- `accounting`: per-class goodput over a sliding window, via `jitserve.scheduler.goodput`;
- `runner`: the frame loop around a `Policy` (table sync, plans, drops, state snapshots);
- `state`: the `EngineState` JSON the pod reports, its atomic file channel and Prometheus rendering;
- `http`: the ASGI middleware that serves that state from vLLM's API server process;
- `version`: the supported vLLM versions.

`jitserve.scheduler.vllm_adapter` is the only module that imports vLLM.
"""
