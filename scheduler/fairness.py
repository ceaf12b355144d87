"""Recent SLO attainment per SLO type and per tenant: the fairness terms GMAX mixes in (§4.2).

JITServe §4.2, "Extending to Other Objectives": priority'(r) = (1 - f) x priority(r) + f x Fair(r), "as
f -> 1, requests with lower fairness attainment gain higher priority". Here Fair(r) is 1 minus the
recent attainment (requests that met their SLO / requests that ended, drops included) of r's SLO type,
so a type the engine has been failing is served ahead of one it has been serving well
(docs/decisions/core.md, "Every class: attainment fairness"). Per tenant, the same measure is
Algorithm 1's Fair(r), with f the request's class's `fairnessWeight` ("Tenant fairness").

Pure bookkeeping over outcomes the adapters report through the frame driver: the engine (real
outcomes) and the simulator (modelled ones) feed the same tracker, and the time is theirs.
"""

from __future__ import annotations

import numpy as np

from jitserve.scheduler.requests import COMPOUND, SLO_TYPE_CODE, has_later_stages
from jitserve.scheduler.window import SlidingSums

TYPES = len(SLO_TYPE_CODE)


def counted_outcome(
    slo_type: int, met: bool, finished_at: float | None, stage_due: float, program_due: float
) -> bool | None:
    """The outcome Fair(r) counts for a request that ended, or None when it decides nothing yet: its own
    SLO's verdict `met`, except for a compound stage, which counts its program's outcome once. A stage
    that did not finish (`finished_at` None: dropped or cancelled) loses its program: missed. One that
    finished with stages after it (its program's deadline `program_due` later than its own sub-deadline
    `stage_due`) leaves the verdict to the program's last stage: None. The last stage counts met if it
    finished by its deadline, which is the program's.

    A compound program meets its SLO only as a whole; counted per stage, its early stages met their share
    far more often than programs met their deadline, and Fair(r) ranked the compound type last while
    its programs missed (docs/decisions/core.md, "Fair(r) counts a compound program once"). The engine and
    the simulator both count through here."""
    if slo_type != COMPOUND:
        return met
    if finished_at is None:
        return False
    if has_later_stages(stage_due, program_due):
        return None
    return met and finished_at <= stage_due + 1e-9


class Attainment:
    """Met / ended per key (a small int: an SLO type code, a tenant id) over the last `window_s`
    seconds, in `buckets` time buckets. `keys` bounds the keys when they are known in advance."""

    def __init__(
        self, keys: int | None = None, window_s: float = 60.0, buckets: int = 12, name: str = "key"
    ) -> None:
        self.keys = keys
        self.name = name  # what a key is, for errors
        self._sums: SlidingSums[int] = SlidingSums(2, window_s, buckets)  # (met, ended) per key
        self._seen = 0  # 1 + the largest key recorded

    def record(self, key: int, met: bool, now: float) -> None:
        """One request of `key` ended at `now`; `met`: it met its SLO."""
        if key < 0 or (self.keys is not None and key >= self.keys):
            bound = f"[0, {self.keys})" if self.keys is not None else ">= 0"
            raise ValueError(f"{self.name}: must be in {bound}, got {key}")
        self._sums.add(key, (float(met), 1.0), now)
        self._seen = max(self._seen, key + 1)

    def counts(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(met, ended) per key over the window ending at `now`: `keys` entries, or one per key up to
        the largest ever recorded."""
        size = self.keys if self.keys is not None else self._seen
        met, ended = np.zeros(size), np.zeros(size)
        for key, (m, e) in self._sums.sums(now).items():
            met[key], ended[key] = m, e
        return met, ended

    def fair(self, now: float) -> np.ndarray:
        """Fair(r) per key: 1 - recent attainment; 0 for a key with no outcome in the window (no
        evidence that it is being failed)."""
        met, ended = self.counts(now)
        return np.where(ended > 0, 1.0 - met / np.maximum(ended, 1.0), 0.0)


class TypeAttainment(Attainment):
    """Attainment per SLO type (the table's type codes): the reservation's Fair(r)."""

    def __init__(self, window_s: float = 60.0, buckets: int = 12) -> None:
        super().__init__(TYPES, window_s, buckets, name="slo_type")


class TenantAttainment(Attainment):
    """Attainment per tenant (the table's tenant ids): Algorithm 1's Fair(r), weighted by each
    request's class (`SLOClass.fairnessWeight`)."""

    def __init__(self, window_s: float = 60.0, buckets: int = 12) -> None:
        super().__init__(None, window_s, buckets, name="tenant")
