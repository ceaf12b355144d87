"""The SLO classes the router resolves requests against, swappable at run time.

Sources, in the order `jitserve router` applies them: the paper's classes (built in), a JSON file
(`--classes-file`), and the operator's ConfigMap (`--classes-configmap`), which is watched so an edited
SLOClass reaches a running router without a restart. The ConfigMap format is the operator's contract
(operator/classes_configmap.py): `classes.json` maps class name -> SLOClassSpec, `default` names the
class of requests that carry none. This reader tolerates a missing `default` (the flag then decides)
and reports a malformed payload instead of crashing, keeping the last good classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec

CLASSES_KEY = "classes.json"
DEFAULT_KEY = "default"


@dataclass(frozen=True)
class ClassTable:
    """An immutable snapshot: requests resolve against one snapshot even if a new one lands meanwhile."""

    classes: dict[str, SLOClassSpec] = field(default_factory=lambda: dict(PAPER_CLASSES))
    default: str | None = None
    source: str = "built-in"

    def default_class(self) -> str | None:
        if self.default is not None and self.default in self.classes:
            return self.default
        marked = sorted(name for name, spec in self.classes.items() if spec.default)
        return marked[0] if marked else None


def parse_classes(raw: Mapping[str, Any], where: str) -> dict[str, SLOClassSpec]:
    """class name -> spec dict, validated; ValueError names the class and the field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object of class name -> SLOClass spec")
    classes: dict[str, SLOClassSpec] = {}
    for name, spec in raw.items():
        try:
            classes[str(name)] = SLOClassSpec.model_validate(spec)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(map(str, err["loc"]))
            raise ValueError(f"{where}: class {name!r}: {loc}: {err['msg']}") from None
    if not classes:
        raise ValueError(f"{where}: no classes")
    return classes


def table_from_configmap(data: Mapping[str, str], default_flag: str | None, where: str) -> ClassTable:
    if CLASSES_KEY not in data:
        raise ValueError(f"{where}: missing key {CLASSES_KEY!r}")
    try:
        raw = json.loads(data[CLASSES_KEY])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: {CLASSES_KEY} is not JSON: {exc}") from None
    classes = parse_classes(raw, where)
    default = data.get(DEFAULT_KEY) or default_flag
    if default is not None and default not in classes:
        raise ValueError(f"{where}: default class {default!r} is not among {sorted(classes)}")
    return ClassTable(classes, default, where)


def table_from_file(path: str, default_flag: str | None) -> ClassTable:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    # Accept both a bare class map and the ConfigMap's data shape.
    if isinstance(raw, dict) and CLASSES_KEY in raw:
        return table_from_configmap(raw, default_flag, path)
    classes = parse_classes(raw, path)
    if default_flag is not None and default_flag not in classes:
        raise ValueError(f"{path}: default class {default_flag!r} is not among {sorted(classes)}")
    return ClassTable(classes, default_flag, path)


class ClassRegistry:
    """Holds the current ClassTable; swaps are a single reference assignment (safe across threads)."""

    def __init__(self, table: ClassTable | None = None) -> None:
        self._table = table or ClassTable()
        self.last_error: str | None = None
        self.awaiting: str | None = None  # a source that must load before the router is ready

    @property
    def table(self) -> ClassTable:
        return self._table

    def replace(self, table: ClassTable) -> None:
        self._table = table
        self.last_error = None
        self.awaiting = None
