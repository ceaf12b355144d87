"""The engine adapter: JITServe inside a vLLM engine process (`jitserve engine`, package `jitserve.engine`).

Everything here is process-bound (vLLM, files, threads, environment variables); the pure decisions it
drives live in `jitserve.scheduler` (the core), which never imports this package.

- `vllm_adapter`: `JITServeScheduler`, the vLLM `AsyncScheduler` subclass (`--scheduler-cls`);
- `cli`: `jitserve engine`, which builds and execs the vLLM command;
- `runner`: the frame loop around a core `Policy` (table sync, plans, drops, state snapshots);
- `classes`: the SLO classes file the operator's ConfigMap provides, re-read when it changes;
- `speed`: online step-time and prefill-rate measurement (`EngineSpeed`);
- `accounting`: per-class goodput over a sliding window, via `jitserve.scheduler.goodput`;
- `state`: the `EngineState` JSON the pod reports, its atomic file channel and Prometheus rendering;
- `http`: the ASGI middleware that serves that state from vLLM's API server process;
- `version`: the supported vLLM versions.

The `vllm_xargs` keys (the router -> engine contract) are the core's: `jitserve.scheduler.contracts.xargs`.
`jitserve.engine.vllm_adapter` is the only module that imports vLLM.
"""
