"""The SLO classes a pool uses: the ConfigMap the operator renders, and the snapshot router and engine hold.

Format:

    data:
      classes.json: '{"latency": {"type": "latency", "ttftSeconds": 2.0, ...}, ...}'
      default: latency

`classes.json` maps each class name to its SLOClassSpec (camelCase, defaults filled in) and `default`
names the class of requests that carry none. The router reads the ConfigMap through the API
(`snapshot_from_data`); the engine reads it mounted as files (`classes.json` and `default` beside it),
and both read a `--classes-file` (`snapshot_from_text`), which may hold the data's shape or a bare class
map. Either way the result is one `ClassSnapshot`; the adapters only read the files.

The default class, resolved once when a snapshot is built (`resolve_default`), the first that applies:

1. the default the classes data names: its `default` key, else a mounted `default` file beside it;
2. the reader's `--default-class` flag;
3. the class marked `default: true` (the first by name if several are);
4. none: requests without a class run best-effort (`scheduler/slo.py: resolve_request_slo`).

A default named by 1 or 2 that is not among the classes is an error (the load fails, naming it); a
flag is only consulted when the data names no default. The built-in snapshot (`builtin_snapshot`: the
paper's classes) follows the same rules. Pure: callers read files and the API, this takes text and dicts.
"""

from __future__ import annotations

import json
import os.path
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec

CLASSES_KEY = "classes.json"
DEFAULT_KEY = "default"
BUILT_IN = "built-in"


@dataclass(frozen=True)
class ClassSnapshot:
    """The classes and the resolved default class, immutable: a request resolves against one snapshot
    even if a new one lands meanwhile. `source` names where it came from, `version` counts reloads."""

    classes: dict[str, SLOClassSpec]
    default: str | None
    source: str = BUILT_IN
    version: int = 0


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
            field = f"{loc}: " if loc else ""  # no field for a rule over several fields
            raise ValueError(f"{where}: class {name!r}: {field}{err['msg']}") from None
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
    default = _name(data.get(DEFAULT_KEY))
    _check_default(classes, default, where)
    return classes, default


def resolve_default(
    classes: Mapping[str, SLOClassSpec], named: str | None, default_flag: str | None, where: str
) -> str | None:
    """The default class by the module's precedence: `named` (by the data) > flag > marked > None."""
    default = _name(named) or _name(default_flag)
    if default is None:
        marked = sorted(name for name, spec in classes.items() if spec.default)
        return marked[0] if marked else None
    _check_default(classes, default, where)
    return default


def snapshot_from_data(
    data: Mapping[str, Any], where: str, default_flag: str | None = None, *, version: int = 0
) -> ClassSnapshot:
    """The ConfigMap's data (as the API returns it) -> a snapshot; ValueError names `where`."""
    classes, named = parse_classes(data, where)
    return ClassSnapshot(classes, resolve_default(classes, named, default_flag, where), where, version)


def snapshot_from_text(
    text: str,
    where: str,
    default_flag: str | None = None,
    *,
    mounted_default: str | None = None,
    version: int = 0,
) -> ClassSnapshot:
    """A classes file's text -> a snapshot; ValueError names `where` (the file's path).

    The file holds the ConfigMap data's shape or a bare class map; `mounted_default` is the text of the
    `default` file beside it (`mounted_default_path`), if the caller found one."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON: {exc}") from None
    if isinstance(raw, Mapping) and CLASSES_KEY in raw:
        classes, named = parse_classes(raw, where)
    else:
        classes, named = parse_class_map(raw, where), None
    named = named or _name(mounted_default)
    return ClassSnapshot(classes, resolve_default(classes, named, default_flag, where), where, version)


def builtin_snapshot(default_flag: str | None = None) -> ClassSnapshot:
    """The paper's classes; ValueError if the flag names a class they do not have."""
    classes = dict(PAPER_CLASSES)
    where = f"--default-class: the {BUILT_IN} classes"
    return ClassSnapshot(classes, resolve_default(classes, None, default_flag, where))


def mounted_default_path(classes_path: str) -> str:
    """Where a mounted ConfigMap puts its `default` key: a file of that name beside `classes.json`."""
    return os.path.join(os.path.dirname(classes_path), DEFAULT_KEY)


def _name(value: Any) -> str | None:
    """A class name as the data or a flag gives it; blank means none."""
    if value is None:
        return None
    return str(value).strip() or None


def _check_default(classes: Mapping[str, SLOClassSpec], default: str | None, where: str) -> None:
    if default is not None and default not in classes:
        raise ValueError(f"{where}: default class {default!r} is not among {sorted(classes)}")
