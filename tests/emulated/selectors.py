"""Label and field selectors of list/watch requests, as the emulated API server understands them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Mapping[str, Any]], bool]


def _label_checks(expr: str) -> list[Check]:
    checks: list[Check] = []
    # Split on commas outside parentheses: "a in (x,y),b!=c".
    for term in re.split(r",(?![^()]*\))", expr or ""):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            checks.append(lambda labels, k=key, o=op, vs=values: (labels.get(k) in vs) == (o == "in"))
        elif m := re.fullmatch(r"(\S+?)\s*(!=|==|=)\s*(\S*)", term):
            key, op, value = m[1], m[2], m[3]
            checks.append(lambda labels, k=key, o=op, v=value: (labels.get(k) == v) == (o != "!="))
        elif term.startswith("!"):
            checks.append(lambda labels, k=term[1:]: k not in labels)
        else:
            checks.append(lambda labels, k=term: k in labels)
    return checks


def _field_checks(expr: str) -> list[Check]:
    checks: list[Check] = []
    for term in (expr or "").split(","):
        if m := re.fullmatch(r"\s*metadata\.(name|namespace)\s*(!=|==|=)\s*(\S*)\s*", term):
            checks.append(lambda meta, f=m[1], o=m[2], v=m[3]: (meta.get(f) == v) == (o != "!="))
    return checks


def matcher(params: Mapping[str, str]) -> Callable[[Mapping[str, Any] | None], bool]:
    """labelSelector (=, ==, !=, in, notin, exists, !exists) and fieldSelector (metadata.name/namespace)."""
    labels = _label_checks(params.get("labelSelector", ""))
    fields = _field_checks(params.get("fieldSelector", ""))

    def match(obj: Mapping[str, Any] | None) -> bool:
        meta = (obj or {}).get("metadata") or {}
        return all(c(meta.get("labels") or {}) for c in labels) and all(c(meta) for c in fields)

    return match
