"""The operator's read of a pool's goodput against a real `jitserve router` that requires API keys: the
operator holds no key, `/jitserve/status` refuses it, and the keyless `/metrics` it now reads carries the
same per-class figures (docs/decisions/operator.md, "Goodput without a key")."""

from __future__ import annotations

import asyncio

import httpx

from jitserve.operator.decisions import parse_router_report
from jitserve.operator.reconciler import DEFAULT_ROUTER_STATUS_URL, _http_get_json
from tests.faults.fault_scenarios import body, session, stack, stream_one


def test_the_operator_reads_goodput_from_a_router_with_keys_without_a_key(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha team-a\n")
    with stack([("a", 4, 0.0)], "--auth-file", str(keys)) as (r, _):

        async def served() -> str:
            async with session() as s:
                s.headers["Authorization"] = "Bearer sk-alpha"
                return (await stream_one(s, r.url, body(0, 4, slo=True))).kind

        assert asyncio.run(served()) == "completed"
        assert httpx.get(r.url + "/jitserve/status").status_code == 401  # no key: refused
        host, port = r.url.split("://")[1].split(":")
        # the operator's default URL, with the Service's DNS name replaced by this router's address
        url = DEFAULT_ROUTER_STATUS_URL.replace("{service}.{namespace}.svc.cluster.local", host).format(
            port=port
        )
        rows = parse_router_report(_http_get_json(url))
        keyed = httpx.get(r.url + "/jitserve/status", headers={"Authorization": "Bearer sk-alpha"}).json()
        assert [row["name"] for row in rows] == sorted(keyed["classes"]) == ["deadline"]
        assert rows[0]["goodput"] > 0 and rows[0]["attainment"] == keyed["classes"]["deadline"]["attainment"]
        assert (
            rows[0]["goodput"] == keyed["classes"]["deadline"]["goodput"]
        )  # window sums of the same seconds
