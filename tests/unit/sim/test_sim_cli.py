"""`jitserve sim`'s options come from SimSettings (sim/settings.py): flag, variable, default, validation.

Nothing is mocked: variables are set in the real process environment with monkeypatch (which
restores it after each test), the way a shell sets them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from jitserve import main as jitserve_main
from jitserve.sim import cli
from jitserve.sim.settings import DEFAULT_POLICIES, SimSettings

ROOT = Path(__file__).resolve().parents[3]


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)  # reads the environment now: variables become the flags' defaults
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--load", "-1"], "--load"),
        (["--loads", "0.5,-2"], "--loads"),
        (["--rates", "1,x"], "--rates"),
        (["--workload", "no-such-workload"], "--workload"),
        (["--policies", "jitserve,no-such-policy"], "--policies"),
        (["--profile", "no-such-profile"], "--profile"),
        (["--heterogeneity", "1.5"], "--heterogeneity"),
        (["--replicas", "0"], "--replicas"),
    ],
)
def test_an_invalid_value_exits_2_naming_the_flag(argv: list[str], flag: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        jitserve_main.main(["sim", *argv])
    assert exited.value.code == 2  # argparse's convention for a bad command line
    err = capsys.readouterr().err
    assert "usage: jitserve sim" in err
    # the message names the flag and its variable, nothing ran
    assert re.search(rf"jitserve sim: error: .*{re.escape(flag)} / JITSERVE_SIM_", err), err


def test_unknown_policy_message_lists_the_known_ones(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        cli.run(_args(["--policies", "jitserve,bogus"]))  # run validates too (tests call it directly)
    err = capsys.readouterr().err
    assert "unknown policy bogus" in err and "vllm-priority" in err


def test_a_variable_sets_the_default_and_a_flag_overrides_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("JITSERVE_SIM_SEED", "7")
    monkeypatch.setenv("JITSERVE_SIM_POLICIES", "vllm, edf")
    monkeypatch.setenv("JITSERVE_SIM_PREDICTOR", "conditional")
    s = cli.settings_from(_args([]))
    assert (s.seed, s.policies, s.predictor) == (7, ("vllm", "edf"), "conditional")
    s = cli.settings_from(_args(["--seed", "3", "--policies", "sjf"]))
    assert (s.seed, s.policies, s.predictor) == (3, ("sjf",), "conditional")


def test_a_bad_variable_fails_like_a_bad_flag(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("JITSERVE_SIM_PREDICTOR", "psychic")
    monkeypatch.setenv("JITSERVE_SIM_REPLICAS", "two")
    with pytest.raises(SystemExit) as exited:
        _args([])  # argparse converts a variable as it would the flag's value
    assert exited.value.code == 2 and "--replicas" in capsys.readouterr().err
    monkeypatch.delenv("JITSERVE_SIM_REPLICAS")
    with pytest.raises(SystemExit) as exited:
        cli.settings_from(_args([]))  # not one of the choices: the settings' validation says so
    assert exited.value.code == 2 and "--predictor / JITSERVE_SIM_PREDICTOR" in capsys.readouterr().err


def test_defaults_and_comma_lists() -> None:
    s = cli.settings_from(_args(["--rates", "0.5, 2", "--json", "out.json"]))
    assert s.policies == DEFAULT_POLICIES and s.workload == "paper-mix" and s.predictor == "auto"
    assert s.rates == (0.5, 2.0) and s.loads == () and s.json_out == Path("out.json")
    assert SimSettings.from_env({}).rates == () and SimSettings.from_env({}).policies == DEFAULT_POLICIES


def test_the_simulator_and_core_read_no_environment() -> None:
    """Their settings come from flags and arguments only (issue 15: sim/policies.py read a variable at
    import once); jitserve.settings reads the environment for them, at the command line."""
    for folder in ("sim", "scheduler"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            assert "os.environ" not in text and "getenv" not in text, path
