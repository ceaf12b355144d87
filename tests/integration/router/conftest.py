"""Router test fixtures: FAKE engines (router_fakes.py) and the real router served in-process.

The real-engine fixtures (`engine`, `engines`, `tiny_model_dir`) are the engine's session fixtures in
tests/fixtures; they are registered by tests/conftest.py. Until that file exists they are imported
here, so the router's SDK tests run against the same two real engines either way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))  # router_fakes

if not (ROOT / "tests" / "conftest.py").exists():
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.engines import engine, engines  # noqa: F401,E402
    from tests.fixtures.tiny_model import tiny_model_dir  # noqa: F401,E402

from router_fakes import FakeEngine, RunningRouter  # noqa: E402


@pytest.fixture
def fake_engines() -> Iterator[tuple[FakeEngine, FakeEngine]]:
    """Two FAKE engines, idle, serving `fake-model`."""
    a, b = FakeEngine("a").start(), FakeEngine("b").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def start_router() -> Iterator[Callable[..., RunningRouter]]:
    """Start the real router (jitserve.router.cli.build) with the given CLI arguments."""
    started: list[RunningRouter] = []

    def start(*argv: str, ready: int = 0) -> RunningRouter:
        r = RunningRouter(["--poll-interval", "0.05", "--seed", "0", *argv]).start()
        started.append(r)
        if ready:
            r.wait_ready(ready)
        return r

    yield start
    for r in started:
        r.stop()
