"""`jitserve up`, `demo` and `bench` options come from local/settings.py: one declaration each, the
bench's the demo's plus its own (a subclass, not argparse's internals).

Nothing is mocked: variables are set in the real process environment with monkeypatch (which
restores it after each test), the way a shell or a pod spec sets them."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

from jitserve import main as jitserve_main
from jitserve.local import bench, demo, up
from jitserve.local.settings import BenchSettings, DemoSettings, UpSettings
from jitserve.settings import options


def _args(module, argv: list[str]) -> argparse.Namespace:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # reads the environment now: variables become the flags' defaults
    return parser.parse_args(argv)


def _clear(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the developer's own shell may set these; every test starts from the declared defaults
    for name in ("JITSERVE_MODEL", "JITSERVE_ENGINES", "JITSERVE_PORT", "JITSERVE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("command", "argv", "flag"),
    [
        ("up", ["--engines", "0"], "--engines / JITSERVE_UP_ENGINES or JITSERVE_ENGINES"),
        ("up", ["--port", "70000"], "--port / JITSERVE_UP_PORT or JITSERVE_PORT"),
        ("up", ["--ready-timeout", "-1"], "--ready-timeout / JITSERVE_UP_READY_TIMEOUT"),
        ("up", ["--classes-file", "/no/such/classes.json"], "--classes-file / JITSERVE_UP_CLASSES_FILE"),
        ("demo", ["--overload", "0"], "--overload / JITSERVE_DEMO_OVERLOAD"),
        ("demo", ["--seed", "-1"], "--seed / JITSERVE_DEMO_SEED"),
        ("demo", ["--engines", "0"], "--engines / JITSERVE_DEMO_ENGINES"),
        # the plot is written after minutes of runs: a path it cannot take is refused before they start
        # (an invalid --port too, so that a tree without the rule exits here instead of starting engines)
        ("demo", ["--out", "/tmp/demo-seed0.json", "--port", "70000"], "--out / JITSERVE_DEMO_OUT"),
        ("demo", ["--out", "/tmp/demo", "--port", "70000"], "--out / JITSERVE_DEMO_OUT"),
        ("bench", ["--speed-trace", "-5"], "--speed-trace / JITSERVE_BENCH_SPEED_TRACE"),
        ("bench", ["--max-num-seqs", "0"], "--max-num-seqs / JITSERVE_BENCH_MAX_NUM_SEQS"),
    ],
)
def test_an_invalid_value_exits_2_naming_the_flag(command: str, argv: list[str], flag: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        jitserve_main.main([command, *argv])  # validated before `run`: no engine starts
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: jitserve {command}" in err and f"jitserve {command}: error: {flag}:" in err, err


@pytest.mark.parametrize("command", ["up", "demo", "bench"])
def test_an_unknown_policy_is_refused_by_argparse(command: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        jitserve_main.main([command, "--policy", "lottery"])
    assert (
        exited.value.code == 2 and "argument --policy: invalid choice: 'lottery'" in capsys.readouterr().err
    )


def test_run_validates_too(capsys) -> None:  # type: ignore[no-untyped-def]
    """Callers that skip the dispatcher (tests, scripts) get the same exit: up used to print its own
    --engines check; now the settings do it for every option."""
    with pytest.raises(SystemExit) as exited:
        up.run(_args(up, ["--engines", "0"]))
    assert exited.value.code == 2 and "jitserve up: error: --engines" in capsys.readouterr().err


def test_up_reads_its_variables_then_the_older_ones_and_a_flag_wins(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _clear(monkeypatch)
    monkeypatch.setenv("JITSERVE_ENGINES", "3")  # docs/local.md's name
    monkeypatch.setenv("JITSERVE_PORT", "9100")
    monkeypatch.setenv("JITSERVE_MODEL", "/models/a")
    s = up.settings_from(_args(up, []))
    assert (s.engines, s.port, s.model) == (3, 9100, "/models/a")
    monkeypatch.setenv("JITSERVE_UP_ENGINES", "4")  # the command's own name comes first
    assert up.settings_from(_args(up, [])).engines == 4
    assert up.settings_from(_args(up, ["--engines", "1", "--port", "9200"])).engines == 1
    assert up.settings_from(_args(up, ["--port", "9200"])).port == 9200


def test_up_defaults_switches_and_repeatable_flags(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _clear(monkeypatch)
    s = up.settings_from(_args(up, []))
    assert (s.engines, s.port, s.host, s.policy, s.max_num_seqs) == (2, 8000, "127.0.0.1", "jitserve", 8)
    assert s.bind_cpus and s.engine_arg == () and s.model is None
    argv = ["--no-bind-cpus", "--engine-arg=--max-model-len=4096", "--engine-arg=--seed=1"]
    s = up.settings_from(_args(up, argv))
    assert not s.bind_cpus and s.engine_arg == ("--max-model-len=4096", "--seed=1")
    monkeypatch.setenv("JITSERVE_UP_BIND_CPUS", "0")  # the variable of a --no- switch turns it off
    assert not up.settings_from(_args(up, [])).bind_cpus
    classes = tmp_path / "classes.json"
    classes.write_text("{}")
    config = up.config_from_args(_args(up, ["--classes-file", str(classes), "--router-arg=--k=1"]), tmp_path)
    assert config.classes_file == classes and config.router_args == ["--k=1"]
    assert config.served_name == tmp_path.name and config.engines == 2


def test_demo_out_takes_any_image_format_matplotlib_writes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _clear(monkeypatch)
    for name in ("runs/demo.png", "runs/demo.SVG", "runs/demo.pdf"):
        assert DemoSettings(out=Path(name)).out == Path(name)


def test_demo_engines_default_by_mode(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _clear(monkeypatch)
    assert demo.settings_from(_args(demo, [])).engines == 1  # parallel: two stacks share the cores
    assert demo.settings_from(_args(demo, ["--mode", "sequential"])).engines == 2
    assert demo.settings_from(_args(demo, ["--mode", "sequential", "--engines", "3"])).engines == 3
    monkeypatch.setenv("JITSERVE_DEMO_MODE", "sequential")
    assert demo.settings_from(_args(demo, [])).engines == 2


def test_bench_takes_the_demos_options_through_its_settings_class(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _clear(monkeypatch)
    assert issubclass(BenchSettings, DemoSettings)
    demo_flags = [o.flag for o in options(DemoSettings)]
    bench_opts = {o.flag: o for o in options(BenchSettings)}
    assert [f for f in bench_opts if f in demo_flags] == demo_flags  # every demo option, same order
    assert {"--json", "--record", "--replay", "--speed", "--speed-trace"} <= set(bench_opts)
    # two mean something else to the bench: reworded, other defaults
    assert (bench_opts["--mode"].default, bench_opts["--engines"].default) == ("sequential", 1)
    assert bench_opts["--mode"].help.startswith("ignored")
    # its own variables: a demo's variable does not configure a bench
    monkeypatch.setenv("JITSERVE_DEMO_SEED", "5")
    monkeypatch.setenv("JITSERVE_BENCH_OVERLOAD", "2.5")
    s = bench.settings_from(_args(bench, ["--json", "t.json"]))
    assert (s.seed, s.overload, s.engines, s.json_out) == (0, 2.5, 1, Path("t.json"))
    # no reaching into argparse's internals for the demo's option table
    source = inspect.getsource(bench) + inspect.getsource(demo)
    assert "_actions" not in source and "help_overrides" not in source


def test_every_field_of_the_local_commands_is_an_option_with_a_meaning() -> None:
    for cls in (UpSettings, DemoSettings, BenchSettings):
        assert len(options(cls)) == len(cls.model_fields)
        assert all(o.help and o.env for o in options(cls)), cls
