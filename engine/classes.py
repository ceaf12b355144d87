"""The SLO classes an engine resolves requests against, re-read when the file changes.

The operator mounts the pool's classes ConfigMap into the engine pod (keys `classes.json` and
`default`, see operator/classes_configmap.py); `jitserve engine --classes-file DIR/classes.json` points
here. Accepted file shapes: a bare map of class name -> SLOClassSpec (camelCase), or the ConfigMap data
shape `{"classes.json": <map or its JSON text>, "default": name}`. A sibling file named `default` (the
mounted ConfigMap key) names the default class. Precedence of the default: file > `--default-class` >
a class marked `default: true` > best-effort.

Kubernetes updates a mounted ConfigMap by swapping a symlink, so the file is re-read when its
(inode, mtime, size) changes; a malformed edit keeps the last good classes and reports the error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec

CLASSES_KEY = "classes.json"
DEFAULT_KEY = "default"


@dataclass(frozen=True)
class ClassSnapshot:
    classes: dict[str, SLOClassSpec] = field(default_factory=lambda: dict(PAPER_CLASSES))
    default: str | None = None
    source: str = "built-in"
    version: int = 0


def _parse_map(raw: Any, where: str) -> dict[str, SLOClassSpec]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: expected a non-empty object of class name -> SLOClass spec")
    out: dict[str, SLOClassSpec] = {}
    for name, spec in raw.items():
        try:
            out[str(name)] = SLOClassSpec.model_validate(spec)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(
                f"{where}: class {name!r}: {'.'.join(map(str, err['loc']))}: {err['msg']}"
            ) from None
    return out


def load_classes(path: str, default_flag: str | None) -> tuple[dict[str, SLOClassSpec], str | None]:
    """Read and validate a classes file; ValueError names the file, class and field."""
    with open(path, encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
    default: str | None = None
    if isinstance(raw, dict) and CLASSES_KEY in raw:
        default = raw.get(DEFAULT_KEY) or None
        raw = raw[CLASSES_KEY]
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: {CLASSES_KEY} is not JSON: {exc}") from None
    classes = _parse_map(raw, path)
    sibling = os.path.join(os.path.dirname(path), DEFAULT_KEY)
    if default is None and os.path.isfile(sibling):
        with open(sibling, encoding="utf-8") as f:
            default = f.read().strip() or None
    default = default or default_flag
    if default is None:
        marked = sorted(name for name, spec in classes.items() if spec.default)
        default = marked[0] if marked else None
    if default is not None and default not in classes:
        raise ValueError(f"{path}: default class {default!r} is not among {sorted(classes)}")
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
