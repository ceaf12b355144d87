"""The command lines of the pods the operator creates: the one place to align with the engine and
router CLIs (`jitserve engine --help`, `jitserve router --help`)."""

from __future__ import annotations

from jitserve.operator import api
from jitserve.operator.models import ModelSource, ServingPoolSpec
from jitserve.scheduler.contracts.classes_configmap import CLASSES_KEY

# Where a pool's PersistentVolumeClaim of weights is mounted in the engine pod.
MODELS_MOUNT = "/models"
# Where the pool's classes ConfigMap is mounted (kubelet refreshes it; the engine re-reads on change).
CLASSES_MOUNT = "/etc/jitserve/classes"


def model_argument(spec: ServingPoolSpec) -> str:
    """What `--model` gets: the Hugging Face id, the path inside the mounted claim, or the URI."""
    model = spec.model
    if model.source is ModelSource.PVC:
        assert model.pvc is not None  # guaranteed by ModelSpec's validator
        path = model.pvc.path.strip("/")
        return f"{MODELS_MOUNT}/{path}" if path else MODELS_MOUNT
    if model.source is ModelSource.URI:
        assert model.uri is not None
        return model.uri
    assert model.name is not None
    return model.name


def engine_args(spec: ServingPoolSpec, default_class: str) -> list[str]:
    """`jitserve engine ...` (engine/cli.py): JITServe's flags, then '--' and vLLM's."""
    sched = spec.scheduler
    args = [
        "engine",
        "--model", model_argument(spec),
        "--port", str(api.ENGINE_PORT),
        "--served-model-name", spec.model.servedName,
        "--policy", "jitserve",
        "--frame-steps", str(sched.frameSteps),
        "--cutoff", repr(sched.cutoff),
        "--starvation-delta", repr(sched.starvationDelta),
        "--class-fairness", repr(sched.classFairness),
        "--preemption", sched.preemption.value,
        "--classes-file", f"{CLASSES_MOUNT}/{CLASSES_KEY}",
        "--default-class", default_class,
    ]  # fmt: skip
    if sched.maxNumSeqs is not None:
        args += ["--max-num-seqs", str(sched.maxNumSeqs)]
    vllm_args = list(spec.engine.extraArgs)
    # A pod with several GPUs is useless to vLLM without tensor parallelism; the user's value wins.
    if spec.gpus > 1 and not any(a.startswith(("--tensor-parallel-size", "-tp")) for a in vllm_args):
        vllm_args = ["--tensor-parallel-size", str(spec.gpus), *vllm_args]
    if vllm_args:
        args += ["--", *vllm_args]
    return args


def router_args(pool: str, namespace: str, spec: ServingPoolSpec, default_class: str) -> list[str]:
    """`jitserve router ...` for one pool: which engines, which classes, which port."""
    args = [
        "router",
        "--port",
        str(spec.router.port),
        "--engine-selector",
        api.selector_string(api.selector_labels(pool, "engine")),
        "--namespace",
        namespace,
        "--classes-configmap",
        api.classes_configmap_name(pool),
        "--default-class",
        default_class,
    ]
    if spec.router.authSecret:
        args += ["--auth-secret", spec.router.authSecret]
    if spec.scheduler.k is not None:
        args += ["--k", str(spec.scheduler.k)]
    return args
