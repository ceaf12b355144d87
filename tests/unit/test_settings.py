"""Typed settings (jitserve.settings): one declaration gives flag, variable, default and validation."""

from __future__ import annotations

import argparse

import pytest

from jitserve import settings as cli_settings
from jitserve.engine.settings import EngineSettings, SchedulerSettings
from jitserve.router.settings import RouterSettings


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


def test_every_field_has_a_description_and_an_option() -> None:
    for cls in (EngineSettings, RouterSettings):
        flags = {o.flag for o in cli_settings.options(cls)}
        for name, info in cls.model_fields.items():
            assert info.description, (cls.__name__, name)
            internal = (info.json_schema_extra or {}).get("cli") is False  # type: ignore[union-attr]
            assert internal or "--" + name.replace("_", "-") in flags
