"""The SLO classes the router resolves requests against, swappable at run time.

Sources, in the order `jitserve router` applies them: the paper's classes (built in), a JSON file
(`--classes-file`), and the operator's ConfigMap (`--classes-configmap`), which is watched so an edited
SLOClass reaches a running router without a restart. The ConfigMap format and its parser are the core's
(scheduler/contracts/classes_configmap.py). A missing `default` is tolerated (the flag then decides);
a malformed payload is reported instead of crashing, keeping the last good classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from jitserve.scheduler.contracts.classes_configmap import (
    check_default,
    marked_default,
    parse_classes,
    parse_classes_document,
)
from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec


@dataclass(frozen=True)
class ClassTable:
    """An immutable snapshot: requests resolve against one snapshot even if a new one lands meanwhile."""

    classes: dict[str, SLOClassSpec] = field(default_factory=lambda: dict(PAPER_CLASSES))
    default: str | None = None
    source: str = "built-in"

    def default_class(self) -> str | None:
        if self.default is not None and self.default in self.classes:
            return self.default
        return marked_default(self.classes)


def table_from_configmap(data: Mapping[str, str], default_flag: str | None, where: str) -> ClassTable:
    classes, default = parse_classes(data, where)
    default = default or default_flag
    check_default(classes, default, where)
    return ClassTable(classes, default, where)


def table_from_file(path: str, default_flag: str | None) -> ClassTable:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    # Accept both a bare class map and the ConfigMap's data shape.
    classes, default = parse_classes_document(raw, path)
    default = default or default_flag
    check_default(classes, default, path)
    return ClassTable(classes, default, path)


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
