"""The SLO classes an engine resolves requests against, re-read when the file changes.

The operator mounts the pool's classes ConfigMap into the engine pod (keys `classes.json` and
`default`); `jitserve engine --classes-file DIR/classes.json` points here. The file's shapes, the
snapshot and the default's precedence are the core's (scheduler/contracts/classes_configmap.py); this
module only reads the file and the `default` beside it, and notices changes.

Kubernetes updates a mounted ConfigMap by swapping a symlink, so the file is re-read when its
(inode, mtime, size) changes; a malformed edit keeps the last good classes and reports the error.
"""

from __future__ import annotations

import os

from jitserve.scheduler.contracts.classes_configmap import (
    ClassSnapshot,
    builtin_snapshot,
    mounted_default_path,
    snapshot_from_text,
)

__all__ = ["ClassSnapshot", "ClassSource", "read_classes_file"]


def read_classes_file(path: str, default_flag: str | None, version: int = 0) -> ClassSnapshot:
    """Read a classes file (and a mounted `default` beside it); OSError, or ValueError naming the file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    mounted = None
    sibling = mounted_default_path(path)
    if os.path.isfile(sibling):
        with open(sibling, encoding="utf-8") as f:
            mounted = f.read()
    return snapshot_from_text(text, path, default_flag, mounted_default=mounted, version=version)


class ClassSource:
    """Current classes (`snapshot`); `poll()` re-reads the file when it changed (cheap: one stat)."""

    def __init__(self, path: str | None, default_flag: str | None = None) -> None:
        self.path = path
        self.default_flag = default_flag
        self.last_error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        if path is None:
            # The paper's classes; a flag naming a class they lack fails here, as in the router.
            self.snapshot = builtin_snapshot(default_flag)
        else:
            # A placeholder until the first poll: the flag is checked against the file's classes.
            self.snapshot = builtin_snapshot()
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
            snapshot = read_classes_file(self.path, self.default_flag, self.snapshot.version + 1)
        except (OSError, ValueError) as exc:
            self.last_error = str(exc)
            return False
        self.last_error = None
        self.snapshot = snapshot
        return True
