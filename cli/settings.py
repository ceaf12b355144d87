"""Typed component settings: one pydantic-settings declaration per option (issue 15).

A component declares a `Settings` subclass; each field's name, type, default, description and
constraints give, from that one declaration, the command-line flag (`--field-name`), the environment
variable (the class's `env_prefix` + FIELD_NAME, or the field's `validation_alias` names), the
default, the validation (errors name the flag) and the line in docs/configuration.md.

    add_arguments(parser, EngineSettings)          # flags; defaults read from the environment
    settings = from_args(EngineSettings, args)     # validated; a flag wins over its variable
    options(EngineSettings)                        # the public option table (docgen, jitserve bench)

argparse stays the parser (the `jitserve` subcommands and their tests keep parsing typed values into a
Namespace); pydantic does the typing and validation. Environment values become the flags' defaults,
so `--help` shows what this environment would run with and a given flag overrides them.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound="Settings")

# Options several commands share: the type, its constraints and its meaning are declared once here;
# each command gives its own default (an engine listens on 8000, the router on 8080).
Host = Annotated[str, Field(min_length=1, description="address to listen on")]
Port = Annotated[int, Field(ge=1, le=65535, description="port to listen on")]
ModelPath = Annotated[str, Field(min_length=1, description="model path (or name) to serve")]
ClassesFile = Annotated[
    str | None,
    Field(
        description="SLO classes JSON: class name -> SLOClass spec (the pool's ConfigMap classes.json)",
        json_schema_extra={"metavar": "PATH"},
    ),
]


class SettingsError(ValueError):
    """A setting failed validation; the message names the flag (and so the variable)."""


class Settings(BaseSettings):
    """Base of every component's settings. Frozen: settings are read once, then passed around."""

    model_config = SettingsConfigDict(
        env_prefix="JITSERVE_", frozen=True, extra="ignore", populate_by_name=True
    )

    @classmethod
    def env_names(cls, name: str) -> tuple[str, ...]:
        """The environment variables of field `name`, first match wins (as pydantic-settings reads them)."""
        alias = cls.model_fields[name].validation_alias
        if isinstance(alias, AliasChoices):
            return tuple(c.upper() for c in alias.choices if isinstance(c, str) and c != name)
        if isinstance(alias, str):
            return (alias.upper(),)
        return (f"{cls.model_config.get('env_prefix', '')}{name}".upper(),)

    @classmethod
    def from_env(cls: type[S], env: Mapping[str, str] | None = None) -> S:
        """Settings from `env` alone (default: this process's environment), validated."""
        if env is None:
            return cls()
        values = {}
        for name in cls.model_fields:
            raw = next((env[n] for n in cls.env_names(name) if env.get(n)), None)
            if raw is not None:
                values[name] = _split(raw) if _kind(cls.model_fields[name])[0] == "list" else raw
        return _validate(cls, values)

    def to_env(self, names: tuple[str, ...] | None = None) -> dict[str, str]:
        """Environment variables that make `from_env` return these settings (None values left out)."""
        out: dict[str, str] = {}
        for name in names or tuple(type(self).model_fields):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, list | tuple | frozenset | set):
                text = ",".join(map(str, value))
            else:
                text = repr(value) if isinstance(value, float) else str(value)
            out[type(self).env_names(name)[0]] = text
        return out


@dataclass(frozen=True, slots=True)
class Option:
    """One option as the docs and `--help` show it."""

    field: str
    flag: str
    default: Any  # the declared default (not the environment's)
    help: str
    env: tuple[str, ...]
    choices: tuple[str, ...] | None
    kind: str  # value | switch | list
    required: bool
    group: str | None


def _strip_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _kind(info: FieldInfo) -> tuple[str, Any, tuple[str, ...] | None]:
    """(kind, scalar type for argparse, choices) of a field."""
    ann = _strip_optional(info.annotation)
    origin = typing.get_origin(ann)
    if ann is bool:
        return "switch", None, None
    if origin is Literal:
        return "value", str, tuple(str(a) for a in typing.get_args(ann))
    if origin in (list, tuple, frozenset, set):
        return "list", str, None
    if ann in (int, float, str):
        return "value", ann, None
    return "value", str, None


def _split(raw: str) -> list[str]:
    return [v.strip() for v in raw.split(",") if v.strip()]


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def options(cls: type[Settings]) -> list[Option]:
    """Every command-line option of `cls`, in declaration order (fields marked cli=False are internal)."""
    out = []
    for name, info in cls.model_fields.items():
        extra = _extra(info)
        if extra.get("cli", True) is False:
            continue
        kind, _, choices = _kind(info)
        default = None if info.default is PydanticUndefined else info.default
        out.append(
            Option(
                field=name,
                flag="--" + name.replace("_", "-"),
                default=default,
                help=info.description or "",
                env=cls.env_names(name),
                choices=choices,
                kind=kind,
                required=info.is_required(),
                group=extra.get("group"),
            )
        )
    return out


def add_arguments(
    parser: argparse.ArgumentParser, cls: type[Settings], environ: Mapping[str, str] | None = None
) -> None:
    """One argparse option per field of `cls`; an environment variable set for a field is its default."""
    environ = os.environ if environ is None else environ
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in options(cls):
        info = cls.model_fields[opt.field]
        _, scalar, _ = _kind(info)
        target: Any = parser
        if opt.group:
            target = groups.get(opt.group) or groups.setdefault(
                opt.group, parser.add_argument_group(opt.group)
            )
        env_value = next((environ[n] for n in opt.env if environ.get(n)), None)
        unset = opt.default is None or opt.default is False or opt.default == []
        shown = "" if unset else f"default {opt.default}; "
        help_text = f"{opt.help} ({shown}env {' or '.join(opt.env)})"
        kwargs: dict[str, Any] = {"dest": opt.field, "help": help_text.replace("%", "%%")}
        if metavar := _extra(info).get("metavar"):
            kwargs["metavar"] = metavar
        if opt.kind == "switch":
            default = TypeAdapter(bool).validate_python(env_value) if env_value else bool(opt.default)
            target.add_argument(opt.flag, action="store_true", default=default, **kwargs)
            continue
        if opt.kind == "list":
            # repeatable flag; the variable is a comma list. A flag replaces the variable's list.
            default = _split(env_value) if env_value else opt.default
            kwargs["help"] = f"{opt.help} (repeatable; env {' or '.join(opt.env)}, a comma list)".replace(
                "%", "%%"
            )
            target.add_argument(opt.flag, action=_ReplaceAppend, default=default, **kwargs)
            continue
        # a string default goes through `type` and `choices` at parse time, so a bad variable fails
        # like a bad flag, naming it
        default = env_value if env_value is not None else opt.default
        required = opt.required and env_value is None
        target.add_argument(
            opt.flag, type=scalar, choices=opt.choices, default=default, required=required, **kwargs
        )


class _ReplaceAppend(argparse.Action):
    """`append` that starts a fresh list on its first use (argparse's own appends to the default)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        seen = f"_seen_{self.dest}"
        current = getattr(namespace, self.dest) if getattr(namespace, seen, False) else None
        setattr(namespace, self.dest, [*(current or []), values])
        setattr(namespace, seen, True)


def _validate(cls: type[S], values: dict[str, Any]) -> S:
    try:
        # model_validate: these values only (no second read of the environment)
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else ""
            where = "--" + name.replace("_", "-") if name in cls.model_fields else name
            env = f" / {cls.env_names(name)[0]}" if name in cls.model_fields else ""
            problems.append(f"{where}{env}: {err['msg']} (got {err.get('input')!r})")
        raise SettingsError("; ".join(problems)) from None


def from_args(cls: type[S], args: argparse.Namespace, **extra: Any) -> S:
    """Validated settings from parsed flags (whose defaults already hold the environment's values)."""
    values = {name: getattr(args, name) for name in cls.model_fields if hasattr(args, name)}
    values.update(extra)
    return _validate(cls, values)


class OptionRecorder(argparse.ArgumentParser):
    """A parser that also keeps each option as declared, through argparse's public `add_argument`:
    the option table of a command still written with argparse (docs, `jitserve bench`), without
    reading argparse's private `_actions`."""

    def __init__(self, **kwargs: Any) -> None:
        self.recorded: list[Option] = []
        super().__init__(**kwargs)

    def _record(self, action: argparse.Action, kwargs: dict[str, Any]) -> argparse.Action:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            return action
        switch = kwargs.get("action") in ("store_true", "store_false")
        empty = action.default in (None, argparse.SUPPRESS) or action.default == []
        self.recorded.append(
            Option(
                field=action.dest,
                flag=", ".join(action.option_strings),
                default=None if switch or empty else action.default,
                help=(action.help or "") % {"default": action.default} if action.help else "",
                env=(),
                choices=tuple(map(str, action.choices)) if action.choices else None,
                kind="switch" if switch else "list" if kwargs.get("action") == "append" else "value",
                required=bool(action.required),
                group=None,
            )
        )
        return action

    def add_argument(self, *flags: Any, **kwargs: Any) -> argparse.Action:
        return self._record(super().add_argument(*flags, **kwargs), kwargs)

    def _recording(self, group: Any) -> Any:
        add = group.add_argument
        group.add_argument = lambda *flags, **kwargs: self._record(add(*flags, **kwargs), kwargs)
        return group

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return self._recording(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Any:
        return self._recording(super().add_mutually_exclusive_group(**kwargs))
