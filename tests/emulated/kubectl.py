"""Test helpers: the real kubectl pointed at the emulated cluster, and bounded polling."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# The real kubectl 1.35 that `make tools` installs (the system kubectl may be an older wrapper).
TOOLS_KUBECTL = Path(__file__).resolve().parents[2] / ".cache" / "tools" / "kubectl" / "kubectl"


class Kubectl:
    """The real kubectl against the emulated API server (no OpenAPI there: --validate=false)."""

    def __init__(self, kubeconfig: Path, binary: str | Path = "kubectl") -> None:
        self.kubeconfig = kubeconfig
        self.binary = str(binary)

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:  # noqa: A002
        cmd = [self.binary, f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def apply(self, manifest: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        if isinstance(manifest, Path):
            return self("apply", "--validate=false", "-f", str(manifest), check=check)
        return self("apply", "--validate=false", "-f", "-", input=manifest, check=check)


def wait_for(fn: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll until fn() is truthy; the timeout only bounds a hang, it is not what a test asserts."""
    deadline = time.monotonic() + timeout
    value = fn()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}; last value: {value!r}")
        time.sleep(0.05)
        value = fn()
    return value
