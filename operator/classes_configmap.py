"""The ConfigMap of SLO classes a pool uses: written by the operator, read by the router.

Format (the contract with `jitserve router --classes-configmap NAME`):

    data:
      classes.json: '{"latency": {"type": "latency", "ttftSeconds": 2.0, ...}, ...}'
      default: latency

`classes.json` maps each class name to its SLOClassSpec (camelCase, defaults filled in) and
`default` names the class of requests that carry none. `parse` is the reader's side of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from jitserve.operator import api
from jitserve.scheduler.slo import SLOClassSpec


def render_data(classes: Mapping[str, SLOClassSpec], default: str) -> dict[str, str]:
    payload = {name: classes[name].model_dump(mode="json", exclude_none=True) for name in sorted(classes)}
    # sort_keys: the same classes always give the same bytes, so the child's hash is stable.
    return {
        api.CLASSES_KEY: json.dumps(payload, sort_keys=True, separators=(",", ":")),
        api.DEFAULT_KEY: default,
    }


def parse(data: Mapping[str, str]) -> tuple[dict[str, SLOClassSpec], str]:
    """ConfigMap data -> (class name -> spec, default class name); raises ValueError if malformed."""
    try:
        raw = json.loads(data[api.CLASSES_KEY])
        default = data[api.DEFAULT_KEY]
    except (KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"classes ConfigMap is malformed: {exc}") from None
    classes = {name: SLOClassSpec.model_validate(spec) for name, spec in raw.items()}
    if default not in classes:
        raise ValueError(f"classes ConfigMap names default {default!r}, which is not among its classes")
    return classes, default
