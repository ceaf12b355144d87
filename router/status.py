"""`GET /jitserve/status`: goodput windows per class, open requests, the best-effort queue, and each
replica as the router sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jitserve.router.service import Router


def status(router: Router) -> dict[str, Any]:
    now = router.clock()
    router.programs.expire(now, force=True)
    pool, queue = router.pool, router.best_effort.queue
    return {
        "classes": router.accounting.status(now),
        "window_seconds": router.config.status_window_s,
        "inflight": router.inflight,
        "best_effort": {
            "queued": queue.queued,
            "active": queue.active,
            "slots": router.best_effort.slots(),
            "capacity": queue.capacity,
        },
        "programs": len(router.programs),
        "replicas": {
            r.name: {
                "url": r.url,
                "health": r.health(now, pool.defaults.stale_after_s).value,
                "unresponsive": r.unresponsive,
                "inflight": r.inflight,
                "chosen_total": r.chosen_total,
                "models": sorted(r.models),
                # the pod's last report, as placement sees it before its own adjustments
                "state": None
                if r.state is None
                else {
                    "running": r.state.running,
                    "waiting": r.state.waiting,
                    "queue_delay_s": r.state.queue_delay_s,
                    "age_s": round(now - r.state_at, 3),
                },
            }
            for r in pool.replicas.values()
        },
        "class_source": router.classes.table.source,
        "class_error": router.classes.last_error,
    }
