"""The SLO classes an engine resolves requests against, re-read when the file changes.

The operator mounts the pool's classes ConfigMap into the engine pod (keys `classes.json` and
`default`; format and parser: scheduler/contracts/classes_configmap.py); `jitserve engine
--classes-file DIR/classes.json` points here. Accepted file shapes: a bare map of class name ->
SLOClassSpec (camelCase), or the ConfigMap data shape `{"classes.json": <map or its JSON text>,
"default": name}`. A sibling file named `default` (the mounted ConfigMap key) names the default class.
Precedence of the default: file > `--default-class` > a class marked `default: true` > best-effort.

Kubernetes updates a mounted ConfigMap by swapping a symlink, so the file is re-read when its
(inode, mtime, size) changes; a malformed edit keeps the last good classes and reports the error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from jitserve.scheduler.contracts.classes_configmap import (
    DEFAULT_KEY,
    check_default,
    marked_default,
    parse_classes_document,
)
from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec


@dataclass(frozen=True)
class ClassSnapshot:
    classes: dict[str, SLOClassSpec] = field(default_factory=lambda: dict(PAPER_CLASSES))
    default: str | None = None
    source: str = "built-in"
    version: int = 0


def load_classes(path: str, default_flag: str | None) -> tuple[dict[str, SLOClassSpec], str | None]:
    """Read and validate a classes file; ValueError names the file, class and field."""
    with open(path, encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
    classes, default = parse_classes_document(raw, path)
    sibling = os.path.join(os.path.dirname(path), DEFAULT_KEY)
    if default is None and os.path.isfile(sibling):
        with open(sibling, encoding="utf-8") as f:
            default = f.read().strip() or None
    default = default or default_flag or marked_default(classes)
    check_default(classes, default, path)
    return classes, default


class ClassSource:
    """Current classes; `poll()` re-reads the file when it changed (cheap: one stat)."""

    def __init__(self, path: str | None, default_flag: str | None = None) -> None:
        self.path = path
        self.default_flag = default_flag
        self.last_error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        default = default_flag if default_flag in PAPER_CLASSES else None
        self.snapshot = ClassSnapshot(default=default)
        if path is not None:
            self.poll()
            if self.last_error is not None:
                # At start a broken file is an operator error worth failing loudly for.
                raise ValueError(self.last_error)

    def poll(self) -> bool:
        """Reload if the file changed; True when a new snapshot was installed."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self.last_error = f"{self.path}: {exc.strerror}"
            return False
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            classes, default = load_classes(self.path, self.default_flag)
        except (OSError, ValueError) as exc:
            self.last_error = str(exc)
            return False
        self.last_error = None
        self.snapshot = ClassSnapshot(classes, default, self.path, self.snapshot.version + 1)
        return True
