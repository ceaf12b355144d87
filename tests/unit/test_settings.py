"""Typed settings (jitserve.settings): one declaration gives flag, variable, default and validation.

Nothing is mocked: variables are set in the real process environment with monkeypatch (which
restores it after each test), the way a shell or a pod spec sets them."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest
from pydantic import Field, PositiveFloat, model_validator
from pydantic_settings import SettingsConfigDict

from jitserve import settings as cli_settings
from jitserve.engine.settings import EngineSettings, SchedulerSettings
from jitserve.main import SUBCOMMANDS, main
from jitserve.router.settings import RouterSettings

# every command's settings class (the module's SETTINGS), as the dispatcher and docgen find them
ALL_SETTINGS = [
    getattr(importlib.import_module(module), "SETTINGS", None) for module, _ in SUBCOMMANDS.values()
]
ALL_SETTINGS = [cls for cls in ALL_SETTINGS if cls is not None]


def _parse(cls: type[cli_settings.Settings], argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_settings.add_arguments(parser, cls, environ)
    return parser.parse_args(argv)


def test_flag_wins_over_variable_and_variable_over_default() -> None:
    env = {"JITSERVE_ROUTER_K": "2", "JITSERVE_ROUTER_MAX_RETRIES": "5"}
    s = cli_settings.from_args(RouterSettings, _parse(RouterSettings, ["--k", "3"], env))
    assert (s.k, s.max_retries) == (3, 5)
    assert s.max_inflight == RouterSettings.model_fields["max_inflight"].default
    # the engine's own variables: JITSERVE_ENGINE_<OPTION>, and the classes file's older name
    env = {"JITSERVE_ENGINE_FRAME_STEPS": "7", "JITSERVE_CLASSES_FILE": "/c.json", "JITSERVE_PORT": "1"}
    s = cli_settings.from_args(EngineSettings, _parse(EngineSettings, ["--model", "m"], env))
    assert (s.frame_steps, s.classes_file) == (7, "/c.json")
    assert s.port == 8000  # JITSERVE_PORT is `jitserve up`'s router port, never an engine's


def test_repeatable_flag_replaces_the_variables_list() -> None:
    env = {"JITSERVE_ROUTER_SERVED_MODEL_NAME": "a, b"}
    assert _parse(RouterSettings, [], env).served_model_name == ["a", "b"]
    args = _parse(RouterSettings, ["--served-model-name", "c", "--served-model-name", "d"], env)
    assert args.served_model_name == ["c", "d"]


@pytest.mark.parametrize(
    ("cls", "argv", "flag"),
    [
        (EngineSettings, ["--model", "m", "--frame-steps", "0"], "--frame-steps"),
        (EngineSettings, ["--model", "m", "--cutoff", "1.5"], "--cutoff"),
        (RouterSettings, ["--k", "0"], "--k"),
        (RouterSettings, ["--port", "70000"], "--port"),
    ],
)
def test_invalid_value_names_the_flag_and_variable(
    cls: type[cli_settings.Settings], argv: list[str], flag: str
) -> None:
    with pytest.raises(cli_settings.SettingsError) as err:
        cli_settings.from_args(cls, _parse(cls, argv, {}))
    field = flag[2:].replace("-", "_")
    assert str(err.value).startswith(flag) and cls.env_names(field)[0] in str(err.value)


def test_bad_variable_fails_like_a_bad_flag() -> None:
    with pytest.raises(SystemExit):  # argparse: invalid int value, naming --down-after
        _parse(RouterSettings, [], {"JITSERVE_ROUTER_DOWN_AFTER": "x"})


def test_scheduler_settings_round_trip_through_the_environment() -> None:
    s = cli_settings.from_args(
        EngineSettings, _parse(EngineSettings, ["--model", "m", "--cutoff", "0.8", "--policy", "edf"], {})
    )
    env = s.scheduler_env(model_name="served", runtime_dir="/r")
    assert env["JITSERVE_CUTOFF"] == "0.8" and env["JITSERVE_POLICY"] == "edf"
    assert env["JITSERVE_MODEL_NAME"] == "served" and env["JITSERVE_RUNTIME_DIR"] == "/r"
    back = SchedulerSettings.from_env(env)
    assert (back.cutoff, back.policy, back.model_name, back.analyzer) == (0.8, "edf", "served", True)
    assert SchedulerSettings.from_env({"JITSERVE_ANALYZER": "0"}).analyzer is False


def test_every_command_but_crds_has_typed_settings() -> None:
    typed = {n for n, (m, _) in SUBCOMMANDS.items() if hasattr(importlib.import_module(m), "SETTINGS")}
    assert typed == set(SUBCOMMANDS) - {"crds"}  # crds takes a file name and --check, no settings


@pytest.mark.parametrize("cls", ALL_SETTINGS, ids=lambda c: c.__name__)
def test_every_field_has_a_description_and_an_option(cls: type[cli_settings.Settings]) -> None:
    opts = {o.field: o for o in cli_settings.options(cls)}
    for name, info in cls.model_fields.items():
        assert info.description, (cls.__name__, name)
        internal = (info.json_schema_extra or {}).get("cli") is False  # type: ignore[union-attr]
        assert internal or name in opts
    # its variables carry the command's prefix (older names may follow), unless the field names its own
    prefix = cls.model_config["env_prefix"]
    for o in opts.values():
        named = cls.model_fields[o.field].validation_alias is not None  # e.g. JITSERVE_CLASSES_FILE
        assert not o.env or named or o.env[0].startswith(prefix), (cls.__name__, o.env)


class _Probe(cli_settings.Settings):
    """Every kind of option jitserve.settings knows, on one made-up command."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_PROBE_")

    names: tuple[str, ...] = Field(
        (), description="names", json_schema_extra={"short": "-n", "exclusive": "scope"}
    )
    everything: bool = Field(
        False, description="all", json_schema_extra={"short": "-A", "exclusive": "scope", "env": False}
    )
    rates: cli_settings.comma_list(PositiveFloat) = Field((), description="rates")  # type: ignore[valid-type]
    json_out: Path | None = Field(None, description="out", json_schema_extra={"flag": "--json"})
    bind: bool = Field(True, description="do not bind")
    model: str | None = Field(None, description="model", json_schema_extra={"env_also": ("JITSERVE_OLD",)})
    low: int = Field(0, description="low")
    high: int = Field(10, description="high")

    @model_validator(mode="after")
    def _ordered(self) -> _Probe:
        if self.low > self.high:
            raise ValueError("--low must not exceed --high")
        return self


def test_flags_and_variables_of_each_kind_of_option() -> None:
    flags = {o.field: o.flag for o in cli_settings.options(_Probe)}
    assert (flags["names"], flags["everything"], flags["json_out"], flags["bind"]) == (
        "-n, --names",
        "-A, --everything",
        "--json",
        "--no-bind",  # on by default: the flag turns it off
    )
    assert _Probe.env_names("json_out") == ("JITSERVE_PROBE_JSON",)  # the variable follows the flag
    assert _Probe.env_names("model") == ("JITSERVE_PROBE_MODEL", "JITSERVE_OLD")
    assert _Probe.env_names("everything") == ()
    args = _parse(_Probe, ["-n", "a", "-n", "b", "--rates", "1, 2.5", "--no-bind"], {"JITSERVE_OLD": "m"})
    s = cli_settings.from_args(_Probe, args)
    assert (s.names, s.rates, s.bind, s.model) == (("a", "b"), (1.0, 2.5), False, "m")
    assert not cli_settings.from_args(_Probe, _parse(_Probe, [], {"JITSERVE_PROBE_BIND": "0"})).bind
    with pytest.raises(SystemExit):  # argparse: -n and -A are one or the other
        _parse(_Probe, ["-n", "a", "-A"], {})


def test_a_check_across_options_keeps_its_own_message() -> None:
    with pytest.raises(cli_settings.SettingsError, match=r"^--low must not exceed --high$"):
        cli_settings.from_args(_Probe, _parse(_Probe, ["--low", "11"], {}))
    with pytest.raises(cli_settings.SettingsError, match=r"^--rates / JITSERVE_PROBE_RATES: Input should be"):
        cli_settings.from_args(_Probe, _parse(_Probe, ["--rates", "1,-2"], {}))


def test_the_environment_is_read_only_through_the_declared_names(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("JITSERVE_OLD", "older")
    monkeypatch.setenv("JITSERVE_PROBE_RATES", "3,4")
    assert _Probe.from_env().model == "older" and _Probe.from_env().rates == (3.0, 4.0)
    # constructing or validating settings reads no variable (pydantic-settings' own reading would
    # fill fields and JSON-parse the list): what from_args was given is all there is
    assert _Probe().rates == () and _Probe.model_validate({}).model is None
    monkeypatch.setenv("JITSERVE_ROUTER_K", "2")
    assert RouterSettings().k == RouterSettings.model_fields["k"].default


def test_help_says_default_and_variables() -> None:
    parser = argparse.ArgumentParser()
    cli_settings.add_arguments(parser, _Probe, {})
    text = " ".join(parser.format_help().split())
    assert "rates (comma-separated; env JITSERVE_PROBE_RATES)" in text
    assert "do not bind (env JITSERVE_PROBE_BIND=0)" in text
    assert "model (env JITSERVE_PROBE_MODEL or JITSERVE_OLD)" in text
    assert "high (default 10; env JITSERVE_PROBE_HIGH)" in text


def test_the_dispatcher_validates_before_running(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        main(["router", "--k", "0"])  # no router is built: argparse's usage and exit status 2
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: jitserve router" in err and "jitserve router: error: --k / JITSERVE_ROUTER_K:" in err
