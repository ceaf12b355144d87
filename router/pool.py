"""The set of engine replicas: discovery targets in, polled health and state, candidates out.

Discovery (static list or Kubernetes pods) calls `set_targets`; the poller keeps each replica's state
fresh by calling `GET /jitserve/state` (and, for engines without it, `GET /health`), and learns the
served model names from `GET /v1/models`. Everything runs on the router's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

import aiohttp
from pydantic import ValidationError

from jitserve.router.replicas import Defaults, Health, Replica, effective_state
from jitserve.scheduler.placement import ReplicaState

log = logging.getLogger("jitserve.router.pool")

STATE_PATH = "/jitserve/state"


class Pool:
    def __init__(
        self,
        defaults: Defaults = Defaults(),
        poll_interval_s: float = 0.5,
        poll_timeout_s: float = 1.0,
        down_after: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.defaults = defaults
        self.poll_interval_s = poll_interval_s
        self.poll_timeout_s = poll_timeout_s
        self.down_after = down_after
        self.clock = clock
        self.replicas: dict[str, Replica] = {}
        self.changed = asyncio.Event()  # set whenever a replica becomes usable (wakes waiting requests)
        self._models_polls: dict[str, int] = {}

    # -- discovery -----------------------------------------------------------------------------------
    def set_targets(self, targets: dict[str, str]) -> None:
        """name -> base URL. New names start pending (usable after their first good poll)."""
        for name in list(self.replicas):
            if name not in targets or self.replicas[name].url != targets[name]:
                del self.replicas[name]  # requests in flight keep their own reference
        for name, url in targets.items():
            if name not in self.replicas:
                self.replicas[name] = Replica(name=name, url=url.rstrip("/"))

    # -- candidates ----------------------------------------------------------------------------------
    def models(self) -> set[str]:
        out: set[str] = set()
        for r in self.replicas.values():
            if not r.down:
                out |= r.models
        return out

    def candidates(
        self, model: str, exclude: frozenset[str] = frozenset()
    ) -> tuple[list[Replica], list[ReplicaState]]:
        now_mono, now_wall = self.clock(), time.time()
        reps: list[Replica] = []
        states: list[ReplicaState] = []
        for r in self.replicas.values():
            if r.name in exclude or not r.serves(model):
                continue
            s = effective_state(r, now_wall, now_mono, self.defaults)
            if s is not None:
                reps.append(r)
                states.append(s)
        return reps, states

    def health_counts(self) -> dict[str, int]:
        now = self.clock()
        counts = {h.value: 0 for h in Health}
        for r in self.replicas.values():
            counts[r.health(now, self.defaults.stale_after_s).value] += 1
        return counts

    # -- proxy feedback ------------------------------------------------------------------------------
    def dispatched(self, r: Replica) -> None:
        r.inflight += 1
        r.sent_since_state += 1
        r.chosen_total += 1

    def released(self, r: Replica) -> None:
        r.inflight = max(r.inflight - 1, 0)

    def connect_failed(self, r: Replica) -> None:
        """A request could not reach the pod: stop placing there until a poll succeeds again."""
        r.down = True
        r.healthy = False

    # -- polling -------------------------------------------------------------------------------------
    async def poll_once(self, client: aiohttp.ClientSession) -> None:
        reps = list(self.replicas.values())
        await asyncio.gather(*(self._poll(client, r) for r in reps), return_exceptions=True)

    async def run(self, client: aiohttp.ClientSession) -> None:
        while True:
            started = self.clock()
            await self.poll_once(client)
            # Never less than half an interval: when polls are slow (a starved CPU, slow pods), polling
            # back to back would only add load where it hurts most.
            elapsed = self.clock() - started
            await asyncio.sleep(max(self.poll_interval_s - elapsed, self.poll_interval_s / 2))

    async def _get(self, client: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.poll_timeout_s, sock_read=self.poll_timeout_s
        )
        async with client.get(url, timeout=timeout) as resp:
            return resp.status, await resp.read()

    async def _poll(self, client: aiohttp.ClientSession, r: Replica) -> None:
        # aiohttp, like the data path: httpx cost about 1 ms of CPU per poll here (docs/decisions/router.md)
        was_usable = r.healthy and not r.down
        try:
            status, content = await self._get(client, r.url + STATE_PATH)
            if status == 200:
                state = ReplicaState.model_validate_json(content)
                r.state, r.state_at, r.sent_since_state = state, self.clock(), 0
                r.models = r.models | {state.model}
            elif status in (404, 503):
                # 404: a plain engine without JITServe state; 503: a JITServe engine before its first
                # frame (frames run only once requests arrive). Either way: healthy if /health answers.
                r.state = None
                health, _ = await self._get(client, r.url + "/health")
                if health >= 400:
                    raise ValueError(f"GET /health answered {health}")
            else:
                raise ValueError(f"GET {STATE_PATH} answered {status}")
            await self._maybe_poll_models(client, r)
        except aiohttp.SocketTimeoutError:
            # Busy, not down: the pod accepted the poll but answered late. Its report ages into "stale"
            # and placement falls back to the router's own counts until it answers again.
            return
        except (aiohttp.ClientError, TimeoutError, ValidationError, ValueError) as exc:
            r.failures += 1
            # connection refused (nothing listens: a killed pod) counts at once; a connect timeout does not
            if r.failures >= self.down_after or isinstance(exc, aiohttp.ClientConnectorError):
                if not r.down:
                    log.warning("replica %s (%s) is down: %r", r.name, r.url, exc)
                r.down, r.healthy = True, False
            return
        r.failures, r.healthy, r.down = 0, True, False
        if not was_usable:
            log.info("replica %s (%s) is up (%s)", r.name, r.url, "state" if r.state else "no state")
            self.changed.set()

    async def _maybe_poll_models(self, client: aiohttp.ClientSession, r: Replica) -> None:
        # Served names (aliases included) rarely change: ask on first contact, then every 20 polls.
        n = self._models_polls.get(r.name, 0)
        self._models_polls[r.name] = n + 1
        if n % 20 != 0 and r.models:
            return
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, AttributeError, TypeError):
            status, content = await self._get(client, r.url + "/v1/models")
            if status == 200:
                data = json.loads(content).get("data", [])
                ids = {m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}
                if ids:
                    r.models = frozenset(ids | ({r.state.model} if r.state else set()))
