"""The ConfigMap of SLO classes a pool uses: rendered by the operator, parsed by the router and the engine.

Format:

    data:
      classes.json: '{"latency": {"type": "latency", "ttftSeconds": 2.0, ...}, ...}'
      default: latency

`classes.json` maps each class name to its SLOClassSpec (camelCase, defaults filled in) and `default`
names the class of requests that carry none. The router reads the ConfigMap through the API; the engine
reads it mounted as files (`classes.json`, `default`), or a file of the data's shape, or a bare class
map. Each reader decides what default applies when the data names none (its flag, a mounted `default`
file, a class marked `default: true`); `marked_default` and `check_default` are the shared steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from jitserve.scheduler.slo import SLOClassSpec

CLASSES_KEY = "classes.json"
DEFAULT_KEY = "default"


def render_classes(classes: Mapping[str, SLOClassSpec], default: str) -> dict[str, str]:
    """Class name -> spec, and the default class -> the ConfigMap's data."""
    payload = {name: classes[name].model_dump(mode="json", exclude_none=True) for name in sorted(classes)}
    # sort_keys: the same classes always give the same bytes, so the child's hash is stable.
    return {
        CLASSES_KEY: json.dumps(payload, sort_keys=True, separators=(",", ":")),
        DEFAULT_KEY: default,
    }


def parse_class_map(raw: Any, where: str) -> dict[str, SLOClassSpec]:
    """Class name -> spec dict, validated; ValueError names `where`, the class and the field."""
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"{where}: expected a non-empty object of class name -> SLOClass spec")
    classes: dict[str, SLOClassSpec] = {}
    for name, spec in raw.items():
        try:
            classes[str(name)] = SLOClassSpec.model_validate(spec)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(map(str, err["loc"]))
            raise ValueError(f"{where}: class {name!r}: {loc}: {err['msg']}") from None
    return classes


def parse_classes(data: Mapping[str, Any], where: str) -> tuple[dict[str, SLOClassSpec], str | None]:
    """The ConfigMap's data -> (classes, the default it names or None); ValueError if malformed.

    `classes.json` may be the JSON text (a ConfigMap) or the map itself (a file of the data's shape)."""
    if CLASSES_KEY not in data:
        raise ValueError(f"{where}: missing key {CLASSES_KEY!r}")
    raw = data[CLASSES_KEY]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: {CLASSES_KEY} is not JSON: {exc}") from None
    classes = parse_class_map(raw, where)
    default = data.get(DEFAULT_KEY) or None
    check_default(classes, default, where)
    return classes, default


def parse_classes_document(raw: Any, where: str) -> tuple[dict[str, SLOClassSpec], str | None]:
    """A classes file's JSON: the ConfigMap's data shape (`parse_classes`) or a bare class map."""
    if isinstance(raw, Mapping) and CLASSES_KEY in raw:
        return parse_classes(raw, where)
    return parse_class_map(raw, where), None


def check_default(classes: Mapping[str, SLOClassSpec], default: str | None, where: str) -> None:
    if default is not None and default not in classes:
        raise ValueError(f"{where}: default class {default!r} is not among {sorted(classes)}")


def marked_default(classes: Mapping[str, SLOClassSpec]) -> str | None:
    """The class marked `default: true` (the first by name if several are), else None."""
    marked = sorted(name for name, spec in classes.items() if spec.default)
    return marked[0] if marked else None
