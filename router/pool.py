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
import numpy as np
from pydantic import ValidationError

from jitserve.router.config import Defaults, RouterConfig
from jitserve.router.replicas import MEMBERSHIP, Health, Replica
from jitserve.scheduler.placement import ReplicaState

log = logging.getLogger("jitserve.router.pool")

STATE_PATH = "/jitserve/state"
_C = RouterConfig()  # the defaults, declared once


class Pool:
    def __init__(
        self,
        defaults: Defaults = Defaults(),
        poll_interval_s: float = _C.poll_interval_s,
        poll_timeout_s: float = _C.poll_timeout_s,
        down_after: int = _C.down_after,
        clock: Callable[[], float] = time.monotonic,
        unresponsive_timeout_s: float = _C.unresponsive_timeout_s,
    ) -> None:
        self.defaults = defaults
        self.poll_interval_s = poll_interval_s
        self.poll_timeout_s = poll_timeout_s
        self.down_after = down_after
        self.clock = clock
        # a pod whose /health gives no answer within this (after a poll or a request timed out on it)
        # is down: its requests end, nothing new goes there until a poll answers again
        self.unresponsive_timeout_s = unresponsive_timeout_s
        self.replicas: dict[str, Replica] = {}
        self.changed = asyncio.Event()  # set whenever a replica becomes usable (wakes waiting requests)
        self.on_poll: Callable[[], None] | None = None  # called after each round of polls
        self.on_unresponsive: Callable[[], None] | None = None  # called when a pod is found hung
        self.client: aiohttp.ClientSession | None = None  # the polls' session (probes use it too)
        self._models_polls: dict[str, int] = {}
        self._probes: set[asyncio.Task[None]] = set()
        # Per model, the replicas that may serve it (healthy, not down), rebuilt only after a replica's
        # health, down flag or models changed (replicas.MEMBERSHIP), never per request.
        self._serving: dict[str, list[Replica]] = {}
        self._models: frozenset[str] = frozenset()
        self._index_version = -1
        self._turn = 0  # rotates the order placement sees, so exact ties take turns

    @classmethod
    def from_config(cls, config: RouterConfig, clock: Callable[[], float] = time.monotonic) -> Pool:
        return cls(
            config.defaults,
            poll_interval_s=config.poll_interval_s,
            poll_timeout_s=config.poll_timeout_s,
            down_after=config.down_after,
            clock=clock,
            unresponsive_timeout_s=config.unresponsive_timeout_s,
        )

    # -- discovery -----------------------------------------------------------------------------------
    def set_targets(self, targets: dict[str, str]) -> None:
        """name -> base URL. New names start pending (usable after their first good poll)."""
        for name in list(self.replicas):
            if name not in targets or self.replicas[name].url != targets[name]:
                del self.replicas[name]  # requests in flight keep their own reference
        for name, url in targets.items():
            if name not in self.replicas:
                self.replicas[name] = Replica(name=name, url=url.rstrip("/"))
        self._index_version = -1

    # -- candidates ----------------------------------------------------------------------------------
    def _index(self) -> dict[str, list[Replica]]:
        if self._index_version != MEMBERSHIP.version:
            serving: dict[str, list[Replica]] = {}
            models: set[str] = set()
            for r in self.replicas.values():
                if r.down:
                    continue
                models |= r.models
                if r.healthy:
                    for m in r.models:
                        serving.setdefault(m, []).append(r)
            self._serving, self._models = serving, frozenset(models)
            self._index_version = MEMBERSHIP.version
        return self._serving

    def models(self) -> frozenset[str]:
        """Model names of the replicas that are not down (kept with the per-model index)."""
        self._index()
        return self._models

    def serving(self, model: str) -> list[Replica]:
        """Replicas that may take requests for `model` now (fresh, stale or stateless)."""
        return self._index().get(model, [])

    def candidates(
        self,
        model: str,
        exclude: frozenset[str] = frozenset(),
        k: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> tuple[list[Replica], list[ReplicaState]]:
        """K replicas for `model` sampled first (all of them when `k` is None), then only their states
        read: the cost is O(K), not O(replicas). The same draw as `place(k=k)` makes, so handing
        `place` these K states with k=None decides as `place` over all of them would. The order is
        rotated per call: `place` breaks exact ties (stateless engines with nothing open, say) by
        position, and a fixed order would herd them all onto the first replica."""
        reps = self.serving(model)
        if exclude:
            reps = [r for r in reps if r.name not in exclude]
        m = len(reps)
        if m == 0:
            return [], []
        if k is not None and k < m:
            rng = rng or np.random.default_rng()
            reps = [reps[j] for j in np.sort(rng.choice(m, size=max(k, 1), replace=False))]
        turn = self._turn = (self._turn + 1) % len(reps)
        if turn:
            reps = reps[turn:] + reps[:turn]
        return self._with_states(reps)

    def states(self, model: str) -> list[ReplicaState]:
        """The placement states of every replica that may take requests for `model` (O(replicas)); unlike
        `candidates`, it leaves the rotation of placement's order alone."""
        return self._with_states(self.serving(model))[1]

    def _with_states(self, reps: list[Replica]) -> tuple[list[Replica], list[ReplicaState]]:
        """The replicas of `reps` that have a placement state now, and those states, in order."""
        now_mono, now_wall = self.clock(), time.time()
        out_reps: list[Replica] = []
        states: list[ReplicaState] = []
        for r in reps:
            s = r.placement_state(now_wall, now_mono, self.defaults)
            if s is not None:
                out_reps.append(r)
                states.append(s)
        return out_reps, states

    def health_counts(self) -> dict[str, int]:
        now = self.clock()
        counts = {h.value: 0 for h in Health}
        for r in self.replicas.values():
            counts[r.health(now, self.defaults.stale_after_s).value] += 1
        return counts

    # -- proxy feedback ------------------------------------------------------------------------------
    def dispatched(self, r: Replica, prompt_tokens: int = 0) -> None:
        r.inflight += 1
        r.sent_since_state += 1
        r.prompt_tokens_since_state += prompt_tokens
        r.chosen_total += 1

    def released(self, r: Replica) -> None:
        r.inflight = max(r.inflight - 1, 0)

    def usable(self) -> list[Replica]:
        now = self.clock()
        ok = (Health.FRESH, Health.STALE, Health.STATELESS)
        return [r for r in self.replicas.values() if r.health(now, self.defaults.stale_after_s) in ok]

    def connect_failed(self, r: Replica, exc: BaseException | None = None) -> None:
        """A request could not reach the pod. Refused (nothing listens: a killed pod): stop placing there
        until a poll succeeds again. A connect *timeout* may as well be this router's own overload
        (thousands of connects at once, a starved event loop): the pod is probed, and only a probe
        that gets no answer either marks it down."""
        if exc is not None and isinstance(exc, TimeoutError):
            self.suspect(r)
            return
        if not r.down:
            log.warning("replica %s (%s) is down: %r", r.name, r.url, exc)
        r.down = True
        r.healthy = False

    def suspect(self, r: Replica) -> None:
        """Something timed out on `r`: probe its /health (once at a time) with a generous timeout."""
        if r.probing or r.down or self.client is None:
            return
        r.probing = True
        task = asyncio.get_running_loop().create_task(self._probe(self.client, r))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, client: aiohttp.ClientSession, r: Replica) -> None:
        started = self.clock()
        try:
            timeout = aiohttp.ClientTimeout(total=self.unresponsive_timeout_s)
            async with client.get(r.url + "/health", timeout=timeout) as resp:
                await resp.read()
            # Any answer: the pod is alive, only slow (its polls judge its state and health as usual).
        except aiohttp.ClientConnectorError as exc:  # refused: nothing listens any more
            self.connect_failed(r, exc)
        except TimeoutError:
            if r.last_byte >= started:
                return  # its streams delivered bytes meanwhile: busy, not hung
            if self.replicas.get(r.name) is r:
                self.mark_unresponsive(r)
        except aiohttp.ClientError:
            pass  # an odd answer is the polls' to count
        finally:
            r.probing = False

    def mark_unresponsive(self, r: Replica, why: str = "") -> None:
        """`r` stopped answering (SIGSTOP, a stuck GPU, a dead node): down, and every request on it
        ends now (retried elsewhere where the client has nothing yet; an error event otherwise)."""
        if not r.down:
            why = why or f"no answer to GET /health within {self.unresponsive_timeout_s:g}s"
            log.warning(
                "replica %s (%s) is down: %s; ending its %d request(s)", r.name, r.url, why, len(r.attempts)
            )
        if not r.unresponsive and self.on_unresponsive is not None:
            self.on_unresponsive()
        r.down, r.healthy, r.unresponsive = True, False, True
        for attempt in list(r.attempts):
            attempt.abort()

    # -- polling -------------------------------------------------------------------------------------
    async def poll_once(self, client: aiohttp.ClientSession) -> None:
        self.client = client
        reps = list(self.replicas.values())
        await asyncio.gather(*(self._poll(client, r) for r in reps), return_exceptions=True)
        if self.on_poll is not None:
            self.on_poll()

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
                if self._stalled(r, state):
                    return  # its scheduler stopped stepping: down until its report moves again
                r.state, r.state_at, r.sent_since_state = state, self.clock(), 0
                r.prompt_tokens_since_state = 0
                if state.model not in r.models:
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
        except TimeoutError:
            # Busy or hung? A late answer (or a connect that timed out: perhaps only this router is
            # overloaded) is not "down" by itself. Its report ages into "stale" and placement falls back
            # to the router's own counts; a probe with a generous timeout decides whether it is hung.
            self.suspect(r)
            return
        except (aiohttp.ClientError, ValidationError, ValueError) as exc:
            r.failures += 1
            # connection refused (nothing listens: a killed pod) counts at once
            if r.failures >= self.down_after or isinstance(exc, aiohttp.ClientConnectorError):
                if not r.down:
                    log.warning("replica %s (%s) is down: %r", r.name, r.url, exc)
                r.down, r.healthy = True, False
            return
        r.failures, r.healthy, r.down, r.unresponsive = 0, True, False, False
        if not was_usable:
            log.info("replica %s (%s) is up (%s)", r.name, r.url, "state" if r.state else "no state")
            self.changed.set()

    def _stalled(self, r: Replica, state: ReplicaState) -> bool:
        """A JITServe engine whose HTTP server answers but whose scheduler is stuck (a hung GPU call):
        the engine refreshes its report's `updated_at` about every second while it is idle or stepping
        (engine/state.py), so a report that has not moved for --unresponsive-timeout while
        requests of ours sit on it and none of its streams sent a byte is a stuck engine. (Its /health
        still answers: vLLM's does not look at the engine core's progress.)"""
        now = self.clock()
        if r.state is None or state.updated_at != r.state.updated_at:
            r.state_moved_at = now
            return False
        if r.unresponsive:
            return True  # marked hung before: it stays down until its report moves again
        window = self.unresponsive_timeout_s
        if r.inflight > 0 and now - r.state_moved_at >= window and now - r.last_byte >= window:
            self.mark_unresponsive(r, f"its state report has not moved for {now - r.state_moved_at:.0f}s")
            return True
        return False

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
