"""`jitserve operator` and `jitserve crds` are wired into the CLI, and stay light to import.

Nothing is mocked: variables are set in the real process environment with monkeypatch (which
restores it after each test), the way the chart's Deployment sets them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from jitserve.main import main
from jitserve.operator import api, cli
from jitserve.operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[3]


def _run(*code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_importing_the_operator_cli_does_not_import_kopf_or_kubernetes() -> None:
    code = (
        "import sys, jitserve.operator.cli, jitserve.operator.crdgen; "
        "print(sorted(m for m in ('kopf', 'kubernetes') if m in sys.modules))"
    )
    out = _run("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_operator_help_and_crds_print() -> None:
    help_text = _run("-m", "jitserve.main", "operator", "--help")
    assert help_text.returncode == 0, help_text.stderr
    for flag in ("--engine-image", "--router-status-url", "--resync-seconds", "--namespace"):
        assert flag in help_text.stdout
    crds = _run("-m", "jitserve.main", "crds")
    assert crds.returncode == 0, crds.stderr
    assert "name: sloclasses.jitserve.dev" in crds.stdout and "name: servingpools.jitserve.dev" in crds.stdout


def _args(argv: list[str]) -> OperatorSettings:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)  # reads the environment now: variables become the flags' defaults
    return cli.settings_from(parser.parse_args(argv))


def test_options_come_from_the_settings_with_the_older_variables_still_read(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in ("JITSERVE_ENGINE_IMAGE", "JITSERVE_OPERATOR_ENGINE_IMAGE", "JITSERVE_ROUTER_STATUS_URL"):
        monkeypatch.delenv(name, raising=False)
    s = _args(["-n", "a", "--namespace", "b", "--workers", "4"])
    assert (s.namespace, s.all_namespaces, s.workers) == (("a", "b"), False, 4)
    assert s.engine_image == api.DEFAULT_ENGINE_IMAGE and s.resync_seconds == 30.0
    monkeypatch.setenv("JITSERVE_ENGINE_IMAGE", "old/engine:1")  # the chart's and docs' older name
    monkeypatch.setenv("JITSERVE_ROUTER_STATUS_URL", "http://{service}:{port}/metrics")
    s = _args([])
    assert s.engine_image == "old/engine:1" and s.router_status_url == "http://{service}:{port}/metrics"
    monkeypatch.setenv("JITSERVE_OPERATOR_ENGINE_IMAGE", "new/engine:2")  # its own name first
    assert _args([]).engine_image == "new/engine:2"
    assert _args(["--engine-image", "flag/engine:3"]).engine_image == "flag/engine:3"
    monkeypatch.setenv("JITSERVE_OPERATOR_NAMESPACE", "x,y")
    assert _args([]).namespace == ("x", "y")
    assert _args(["-n", "z"]).namespace == ("z",)  # a flag replaces the variable's list


def test_invalid_values_exit_2_naming_the_flag(capsys) -> None:  # type: ignore[no-untyped-def]
    for argv, message in (
        (["--workers", "0"], "--workers / JITSERVE_OPERATOR_WORKERS: Input should be greater than 0"),
        (["--resync-seconds", "-1"], "--resync-seconds / JITSERVE_OPERATOR_RESYNC_SECONDS"),
        (["-n", "a", "-A"], "argument -A/--all-namespaces: not allowed with argument -n/--namespace"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["operator", *argv])  # validated before kopf is imported or a cluster is contacted
        assert exited.value.code == 2
        assert message in capsys.readouterr().err, argv
