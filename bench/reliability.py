"""Reliability benchmark (issue 14): the fault suite's scenarios, run once each, with their figures.

The scenarios are the fault suite's own (tests/faults/fault_scenarios.py, imported, not copied): real
`jitserve router` and `jitserve operator` processes, FAKE stream-faithful engines in processes of their
own (kill -9, SIGSTOP), the emulated API server. Printed per scenario: requests and how each ended,
requests lost (must be 0), the longest any client waited for a byte against the documented bound,
router RSS before / peak / after, and the operator's convergence time after SIGKILL. Usage:
  python bench/reliability.py [--only NAME ...] [--burst 2000] [--pools 8] [--json out.json]
Results: docs/benchmarks/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults import fault_scenarios as fs  # noqa: E402

MB = 2**20


def scenarios(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "engine-kill": fs.engine_killed,
        "engine-sigstop": fs.engine_stopped,
        "router-kill": fs.router_killed,
        "burst": lambda: fs.burst(args.burst),
        "operator-kill": lambda: fs.operator_killed(args.pools),
    }


def row(res: fs.ScenarioResult, wall_s: float) -> dict[str, Any]:
    visible = {"completed", "error_event", "http_error", "left", "broken"}
    return {
        "scenario": res.name,
        "requests": len(res.outcomes),
        "outcomes": res.kinds,
        "error_codes": res.codes(),
        "lost": sum(o.kind not in visible for o in res.outcomes),
        "max_client_wait_s": round(res.max_wait_s, 3) if res.outcomes else None,
        "documented_bound_s": res.bound_s,
        "rss_before_mb": round(res.rss_before / MB, 1) if res.rss_before else None,
        "rss_peak_mb": round(res.rss_peak / MB, 1) if res.rss_peak else None,
        "rss_after_mb": round(res.rss_after / MB, 1) if res.rss_after else None,
        "figures": res.figures,
        "wall_s": round(wall_s, 1),
    }


def fmt(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", help="scenarios to run (default all)")
    parser.add_argument("--burst", type=int, default=2000, help="streams in the burst")
    parser.add_argument(
        "--pools", type=int, default=8, help="ServingPools applied before the operator is killed"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    rows = []
    for name, run in scenarios(args).items():
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        res = run()
        rows.append(row(res, time.monotonic() - t0))
        print(f"{name}: done in {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)

    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print()
    head = ["scenario", "requests", "how they ended", "lost", "max client wait", "documented bound"]
    print("| " + " | ".join([*head, "router RSS before / peak / after"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ended = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())) or "-"
        if r["error_codes"]:
            ended += " (" + ", ".join(f"{k} {v}" for k, v in sorted(r["error_codes"].items())) + ")"
        rss = " / ".join(fmt(r[k]) for k in ("rss_before_mb", "rss_peak_mb", "rss_after_mb")) + " MB"
        cells = [r["scenario"], r["requests"], ended, r["lost"], fmt(r["max_client_wait_s"], " s")]
        cells += [fmt(r["documented_bound_s"], " s"), rss if r["rss_before_mb"] else "-"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print()
    for r in rows:
        f = r["figures"]
        if "convergence_s" in f:
            print(
                f"operator: SIGKILLed with {f['children_at_kill']}/{f['children_expected']} children made; "
                f"restarted, every pool Ready at its generation {f['convergence_s']:.1f} s later; "
                f"duplicate children {len(f['duplicates'])}, missing {len(f['missing'])}"
            )
        if "engine_abort_after_router_kill_s" in f:
            st = f["engine_stats"]
            print(
                f"router kill: the engine saw {st['aborted']}/{st['requests']} streams aborted "
                f"({f['engine_abort_after_client_left_s']:.2f} s after a client left, "
                f"{f['engine_abort_after_router_kill_s']:.2f} s after kill -9 of the router); "
                f"a new router then: {f['new_router_serves']}"
            )
    print()
    for r in rows:
        print(f"{r['scenario']}: {json.dumps(r['figures'], default=str)} (wall {r['wall_s']} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    return 1 if any(r["lost"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
