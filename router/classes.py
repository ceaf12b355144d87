"""The SLO classes the router resolves requests against, swappable at run time.

Sources, in the order `jitserve router` applies them: the paper's classes (built in), a JSON file
(`--classes-file`), and the operator's ConfigMap (`--classes-configmap`), which is watched so an edited
SLOClass reaches a running router without a restart. The snapshot, the ConfigMap format, the file's
shapes and the default's precedence are the core's (scheduler/contracts/classes_configmap.py); this
module reads the file and holds the current snapshot. A malformed ConfigMap edit is reported instead of
crashing, keeping the last good classes.
"""

from __future__ import annotations

import dataclasses
import os

from jitserve.scheduler.contracts.classes_configmap import (
    ClassSnapshot,
    builtin_snapshot,
    mounted_default_path,
    snapshot_from_text,
)

__all__ = ["ClassRegistry", "ClassSnapshot", "snapshot_from_file"]


def snapshot_from_file(path: str, default_flag: str | None) -> ClassSnapshot:
    """Read a classes file (and a mounted `default` beside it); OSError, or ValueError naming the file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    mounted = None
    sibling = mounted_default_path(path)
    if os.path.isfile(sibling):
        with open(sibling, encoding="utf-8") as f:
            mounted = f.read()
    return snapshot_from_text(text, path, default_flag, mounted_default=mounted)


class ClassRegistry:
    """Holds the current ClassSnapshot; swaps are a single reference assignment (safe across threads)."""

    def __init__(self, table: ClassSnapshot | None = None) -> None:
        self._table = table or builtin_snapshot()
        self.last_error: str | None = None
        self.awaiting: str | None = None  # a source that must load before the router is ready

    @property
    def table(self) -> ClassSnapshot:
        return self._table

    def replace(self, table: ClassSnapshot) -> None:
        """Install `table`, numbered one past the current snapshot (as the engine numbers reloads)."""
        self._table = dataclasses.replace(table, version=self._table.version + 1)
        self.last_error = None
        self.awaiting = None
