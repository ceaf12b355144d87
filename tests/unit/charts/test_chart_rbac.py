"""The operator's RBAC: enough for everything the operator does, nothing more, and escalation-safe.

Kubernetes lets a subject create a Role only if it holds every permission in it (or has `escalate`),
so the operator's rules must cover every Role the operator renders for routers. The tests derive what
the operator needs from the operator's own code (children, the REST adapter, kopf's handlers) so a
new child kind or a new router permission fails here until the chart grants it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_helpers import NAMESPACE, by_kind, render

from jitserve.operator import api
from jitserve.operator.children import CHILD_KINDS, Pool, router_role
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.slo import PAPER_CLASSES

Rule = dict[str, Any]
CORE_PLURALS = {"ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Service": "services"}
PLURALS = {
    **CORE_PLURALS,
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Deployment": "deployments",
    "NetworkPolicy": "networkpolicies",
}


def allows(rules: list[Rule], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """RBAC's own matching: group, resource and verb must each be listed (or '*'); resourceNames,
    when a rule has them, must include the object's name."""
    for rule in rules:
        if not (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", [])):
            continue
        if not (resource in rule.get("resources", []) or "*" in rule.get("resources", [])):
            continue
        if not (verb in rule.get("verbs", []) or "*" in rule.get("verbs", [])):
            continue
        names = rule.get("resourceNames")
        if names and (name is None or name not in names):
            continue
        return True
    return False


def _roles(values: dict[str, Any], tmp: Path) -> tuple[list[Rule], list[Rule], list[dict[str, Any]]]:
    """(cluster-scoped rules, pool rules, all bindings) of a rendering."""
    docs = render(values, tmp)
    roles = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole")}
    cluster = next(r for n, r in roles.items() if n.endswith("-cluster"))["rules"]
    pools = next(r for n, r in roles.items() if n.endswith("-pools"))["rules"]
    return cluster, pools, by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")


def _router_role(auth_secret: str | None) -> dict[str, Any]:
    spec = ServingPoolSpec.model_validate(
        {
            "model": {"source": "huggingface", "name": "org/model", "servedName": "m"},
            "sloClasses": {"allowed": ["latency"]},
            "router": {"authSecret": auth_secret} if auth_secret else {},
        }
    )
    return router_role(Pool("p", "team-a", "uid", spec, {"latency": PAPER_CLASSES["latency"]}, "latency"))


def test_allows_matches_like_rbac() -> None:
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get"]}]
    assert allows(rules, "", "configmaps", "get", "a")
    assert not allows(rules, "", "configmaps", "get", "b")
    assert not allows(rules, "", "configmaps", "list", "a")
    assert not allows(rules, "apps", "configmaps", "get", "a")


@pytest.mark.parametrize("auth_secret", [None, "api-keys"])
def test_operator_holds_every_permission_it_grants_routers(auth_secret: str | None, tmp_path: Path) -> None:
    _, pools, _ = _roles({}, tmp_path)
    role = _router_role(auth_secret)
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        assert allows(pools, group, resource, verb, name), (group, resource, verb, name)


def test_without_secret_access_only_authsecret_pools_are_refused(tmp_path: Path) -> None:
    _, pools, _ = _roles({"rbac": {"routerAuthSecrets": False}}, tmp_path)
    assert not allows(pools, "", "secrets", "get", "api-keys")
    for rule in _router_role(None)["rules"]:  # pools without an auth Secret still work
        for resource in rule["resources"]:
            for verb in rule["verbs"]:
                assert allows(
                    pools, rule["apiGroups"][0], resource, verb, (rule.get("resourceNames") or [None])[0]
                )


def test_operator_can_manage_every_child_kind(tmp_path: Path) -> None:
    """kube.apply does get, create, replace (PUT = update) and delete (unwanted children)."""
    _, pools, _ = _roles({}, tmp_path)
    for api_version, kind in CHILD_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        for verb in ("get", "list", "watch", "create", "update", "delete"):
            assert allows(pools, group, PLURALS[kind], verb), (kind, verb)


def test_operator_can_do_what_its_kopf_handlers_need(tmp_path: Path) -> None:
    cluster, pools, _ = _roles({}, tmp_path)
    # Watched resources (handlers.py) are listed and watched; pools are patched (kopf's annotations).
    for verb in ("get", "list", "watch", "patch"):
        assert allows(pools, api.GROUP, api.SERVINGPOOL_PLURAL, verb)
    for verb in ("get", "list", "watch"):
        assert allows(cluster, api.GROUP, api.SLOCLASS_PLURAL, verb)
        assert allows(cluster, "apiextensions.k8s.io", "customresourcedefinitions", verb)
    assert allows(pools, api.GROUP, f"{api.SERVINGPOOL_PLURAL}/status", "patch")
    assert allows(cluster, api.GROUP, f"{api.SLOCLASS_PLURAL}/status", "patch")
    assert allows(pools, api.GROUP, f"{api.SERVINGPOOL_PLURAL}/finalizers", "update")
    assert allows(pools, "", "events", "create")
    # operator/events.py counts a repeated Event with a merge patch (its count kept in memory, no read).
    assert allows(pools, "", "events", "patch")


def test_no_wildcards_and_no_escalation_verbs(tmp_path: Path) -> None:
    cluster, pools, _ = _roles({}, tmp_path)
    for rule in cluster + pools:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate"}
    # Nothing beyond reading: no writes to pods, secrets, CRDs or namespaces.
    for resource in ("pods", "secrets", "endpoints"):
        assert not any(allows(pools, "", resource, v) for v in ("create", "update", "patch", "delete"))
    assert not any(
        allows(cluster, "apiextensions.k8s.io", "customresourcedefinitions", v)
        for v in ("create", "update", "delete")
    )
    # SLOClasses belong to the platform team: the operator only writes their status.
    assert not any(allows(cluster, api.GROUP, api.SLOCLASS_PLURAL, v) for v in ("create", "update", "delete"))


def test_cluster_wide_by_default(tmp_path: Path) -> None:
    _, _, bindings = _roles({}, tmp_path)
    assert {b["kind"] for b in bindings} == {"ClusterRoleBinding"}
    assert sorted(b["roleRef"]["name"] for b in bindings) == [
        "jitserve-operator-cluster",
        "jitserve-operator-pools",
    ]
    for b in bindings:
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "jitserve-operator", "namespace": NAMESPACE}
        ]


def test_watch_namespaces_binds_pool_rules_only_there(tmp_path: Path) -> None:
    cluster, _, bindings = _roles({"operator": {"watchNamespaces": ["team-a", "team-b"]}}, tmp_path)
    pool_bindings = [b for b in bindings if b["roleRef"]["name"].endswith("-pools")]
    assert {b["kind"] for b in pool_bindings} == {"RoleBinding"}
    assert sorted(b["metadata"]["namespace"] for b in pool_bindings) == ["team-a", "team-b"]
    # kopf checks that listed namespaces exist; cluster-wide mode needs no namespace access.
    assert allows(cluster, "", "namespaces", "list")
    cluster_default, _, _ = _roles({}, tmp_path)
    assert not allows(cluster_default, "", "namespaces", "list")


def test_rbac_follows_the_service_account_name(tmp_path: Path) -> None:
    docs = render({"serviceAccount": {"name": "custom-sa"}}, tmp_path)
    (sa,) = by_kind(docs, "ServiceAccount")
    assert sa["metadata"]["name"] == "custom-sa"
    for binding in by_kind(docs, "ClusterRoleBinding"):
        assert binding["subjects"][0]["name"] == "custom-sa"
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "custom-sa"
