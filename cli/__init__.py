"""JITServe: SLO-aware LLM serving (NSDI'26) as a Kubernetes operator, a router and vLLM engines."""

from pathlib import Path

__version__ = "0.1.0"

# `operator/` has no __init__.py on purpose: as a regular package it would shadow the standard
# library's `operator` whenever the repository root is on sys.path (`python -m ...` run there).
# Namespace folders lose to real modules, so it is safe; setuptools' editable finder cannot map a
# namespace subpackage, though, so in a source checkout we let `jitserve.operator` be found there.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "operator").is_dir():
    __path__.append(str(_checkout))  # noqa: F821 - __path__ is defined for packages
