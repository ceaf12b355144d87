"""The operator's apply step against the emulated API server: create once, then write nothing while
the manifest is unchanged, replace when it changes, and never take over an object it does not own."""

from __future__ import annotations

from typing import Any

import pytest

from jitserve.operator import api
from jitserve.operator.kube import ApiError, ChildConflictError, apply


def configmap(name: str, owner_uid: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "default",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
        "data": {"k": value},
    }


@pytest.fixture
def owner(kube: Any, request: pytest.FixtureRequest) -> str:
    name = f"owner-{request.node.name}".lower().replace("_", "-")[:60]
    created = kube.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}}
    )
    return created["metadata"]["uid"]


def test_apply_is_idempotent_and_updates_on_change(kube: Any, owner: str) -> None:
    outcome, live = apply(kube, configmap("child-a", owner, "1"), owner)
    assert outcome == "created" and api.SPEC_HASH_ANNOTATION in live["metadata"]["annotations"]
    rv = live["metadata"]["resourceVersion"]

    outcome, again = apply(kube, configmap("child-a", owner, "1"), owner)
    assert outcome == "unchanged" and again["metadata"]["resourceVersion"] == rv  # nothing written

    outcome, changed = apply(kube, configmap("child-a", owner, "2"), owner)
    assert outcome == "updated" and changed["data"] == {"k": "2"}
    assert changed["metadata"]["uid"] == live["metadata"]["uid"]  # replaced in place, not recreated


def test_apply_refuses_objects_it_does_not_own(kube: Any, owner: str) -> None:
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "someone-elses", "namespace": "default"},
        }
    )
    with pytest.raises(ChildConflictError, match="not owned"):
        apply(kube, configmap("someone-elses", owner, "1"), owner)


def test_stale_writes_conflict(kube: Any, owner: str) -> None:
    _, live = apply(kube, configmap("child-b", owner, "1"), owner)
    kube.replace({**live, "data": {"k": "by someone else"}})
    with pytest.raises(ApiError) as err:
        kube.replace({**live, "data": {"k": "stale"}})  # carries the old resourceVersion
    assert err.value.status == 409


def test_deleting_the_owner_collects_its_children(
    kube: Any, owner: str, request: pytest.FixtureRequest
) -> None:
    apply(kube, configmap("child-c", owner, "1"), owner)
    owner_name = f"owner-{request.node.name}".lower().replace("_", "-")[:60]
    kube.delete("v1", "ConfigMap", "default", owner_name)
    assert kube.get("v1", "ConfigMap", "default", "child-c") is None
