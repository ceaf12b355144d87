"""Builders for core tests: request tables filled with simple, explicit requests."""

from __future__ import annotations

import pytest

from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO


def deadline_request(rid: str, deadline: float, input_len: int = 100, ub: int = 100, arrival: float = 0.0):
    return NewRequest(
        request_id=rid,
        slo=SLO.deadline_slo(deadline=deadline, waiting_time=1e4),
        arrival=arrival,
        input_len=input_len,
        max_tokens=max(ub, 1),
        len_ub=ub,
    )


@pytest.fixture
def table() -> RequestTable:
    return RequestTable(capacity=4)
