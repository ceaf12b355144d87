"""Typed component settings: one pydantic-settings declaration per option (issue 15).

A component declares a `Settings` subclass; each field's name, type, default, description and
constraints give, from that one declaration, the command-line flag (`--field-name`), the environment
variable (the class's `env_prefix` + FIELD_NAME, or the field's `validation_alias` names), the
default, the validation (errors name the flag) and the line in docs/configuration.md.

    add_arguments(parser, EngineSettings)          # flags; defaults read from the environment
    settings = from_args(EngineSettings, args)     # validated; a flag wins over its variable
    settings = parse_settings(EngineSettings, args, "jitserve engine")  # the same; bad value: exit 2
    options(EngineSettings)                        # the public option table (docgen, --help)

A field's `json_schema_extra` may say more about its flag: `group` (the --help section), `metavar`,
`short` ("-n"), `exclusive` (a mutually exclusive group's name), `flag` (another long flag than the
field's name, e.g. "--json" for `json_out`; the variable follows it), `env_also` (older variables read
after the prefixed one, e.g. JITSERVE_MODEL), `env` (False: no variable), `cli` (False: internal, no
flag). A bool whose default is True becomes `--no-<name>`. A `comma_list(...)` field takes one
comma-separated value.

argparse stays the parser (the `jitserve` subcommands and their tests keep parsing typed values into a
Namespace); pydantic does the typing and validation. Environment values become the flags' defaults,
so `--help` shows what this environment would run with and a given flag overrides them.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import AliasChoices, BeforeValidator, Field, TypeAdapter, ValidationError
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
Seed = Annotated[int, Field(ge=0, description="random seed")]


def _split_commas(value: Any) -> Any:
    """A comma list's text into its items (a list or tuple passes as it is)."""
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


def comma_list(item: Any) -> Any:
    """A field taking one comma-separated value (`--rates 1,2,3`), validated item by item."""
    return Annotated[tuple[item, ...], BeforeValidator(_split_commas)]


class SettingsError(ValueError):
    """A setting failed validation; the message names the flag (and so the variable)."""


class Settings(BaseSettings):
    """Base of every component's settings. Frozen: settings are read once, then passed around."""

    model_config = SettingsConfigDict(
        env_prefix="JITSERVE_", frozen=True, extra="ignore", populate_by_name=True
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: Any, **sources: Any
    ) -> tuple[Any, ...]:
        # Only the given values: the environment is read in one place, through `env_names` (the flags'
        # defaults in add_arguments, and from_env), so older names (env_also) and a flag's precedence
        # hold everywhere; pydantic-settings' own reading would also fill fields from_args left out and
        # JSON-parse a list variable ("a,b" fails).
        return (init_settings,)

    @classmethod
    def env_names(cls, name: str) -> tuple[str, ...]:
        """The environment variables of field `name`, first match wins: its validation_alias names, or
        the class's prefix + the option's name, then any older names it lists as `env_also`."""
        info = cls.model_fields[name]
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            return tuple(c.upper() for c in alias.choices if isinstance(c, str) and c != name)
        if isinstance(alias, str):
            return (alias.upper(),)
        extra = _extra(info)
        if extra.get("env", True) is False:
            return ()  # a flag only
        option = extra["flag"].lstrip("-").replace("-", "_") if "flag" in extra else name
        own = f"{cls.model_config.get('env_prefix', '')}{option}".upper()
        return (own, *extra.get("env_also", ()))

    @classmethod
    def from_env(cls: type[S], env: Mapping[str, str] | None = None) -> S:
        """Settings from `env` alone (default: this process's environment), validated; the variables
        are `env_names`' (so those listed as `env_also` too)."""
        env = os.environ if env is None else env
        values = {}
        for name in cls.model_fields:
            raw = next((env[n] for n in cls.env_names(name) if env.get(n)), None)
            if raw is not None:
                values[name] = _split_commas(raw) if _kind(cls.model_fields[name])[0] == "list" else raw
        return _validate(cls, values)

    def to_env(self, names: tuple[str, ...] | None = None) -> dict[str, str]:
        """Environment variables that make `from_env` return these settings (None values left out)."""
        out: dict[str, str] = {}
        for name in names or tuple(type(self).model_fields):
            value = getattr(self, name)
            if value is None or not type(self).env_names(name):
                continue
            if isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, list | tuple | frozenset | set):
                text = ",".join(map(str, value))  # a list's variable is a comma list
            else:
                text = repr(value) if isinstance(value, float) else str(value)
            out[type(self).env_names(name)[0]] = text
        return out


@dataclass(frozen=True, slots=True)
class Option:
    """One option as the docs and `--help` show it."""

    field: str
    flag: str  # its flags, comma-joined: "-n, --namespace"
    default: Any  # the declared default (not the environment's)
    help: str
    env: tuple[str, ...]
    choices: tuple[str, ...] | None
    kind: str  # value | switch | list (repeatable) | csv (one comma-separated value)
    required: bool
    group: str | None
    exclusive: str | None = None  # mutually exclusive group

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(self.flag.split(", "))

    @property
    def shown_default(self) -> str | None:
        """The default as a user writes it, or None when there is nothing to show (unset, a switch)."""
        d = self.default
        if self.kind == "switch" or d is None or d == () or d == []:
            return None
        return ",".join(map(str, d)) if isinstance(d, list | tuple) else str(d)


def _strip_optional(annotation: Any) -> Any:
    """`X | None` and `Annotated[X, ...]` (PositiveInt) to X: what argparse parses."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _kind(info: FieldInfo) -> tuple[str, Any, tuple[str, ...] | None]:
    """(kind, scalar type for argparse, choices) of a field."""
    ann = _strip_optional(info.annotation)
    origin = typing.get_origin(ann)
    if ann is bool:
        return "switch", None, None
    if origin is Literal:
        return "value", str, tuple(str(a) for a in typing.get_args(ann))
    if any(getattr(m, "func", None) is _split_commas for m in info.metadata):
        return "csv", str, None
    if origin in (list, tuple, frozenset, set):
        return "list", str, None
    if ann in (int, float, str):
        return "value", ann, None
    return "value", str, None


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _flags(name: str, info: FieldInfo) -> tuple[str, ...]:
    extra = _extra(info)
    if "flag" in extra:
        long = extra["flag"]
    elif _kind(info)[0] == "switch" and info.default is True:
        long = "--no-" + name.replace("_", "-")  # on by default: the flag turns it off
    else:
        long = "--" + name.replace("_", "-")
    return (extra["short"], long) if "short" in extra else (long,)


def flag_of(cls: type[Settings], name: str) -> str:
    """The long flag of field `name` (what an error message names)."""
    return _flags(name, cls.model_fields[name])[-1]


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
                flag=", ".join(_flags(name, info)),
                default=default,
                help=info.description or "",
                env=cls.env_names(name),
                choices=choices,
                kind=kind,
                required=info.is_required(),
                group=extra.get("group"),
                exclusive=extra.get("exclusive"),
            )
        )
    return out


def _help(opt: Option) -> str:
    """The option's meaning, then how it is given: "(comma-separated; default 8; env JITSERVE_X)"."""
    env = " or ".join(opt.env)
    notes = {"list": ["repeatable"], "csv": ["comma-separated"]}.get(opt.kind, [])
    if opt.shown_default is not None and opt.kind != "list":
        notes.append(f"default {opt.shown_default}")
    if env:
        suffix = {"list": ", a comma list", "switch": "=0" if opt.default is True else ""}.get(opt.kind, "")
        notes.append(f"env {env}{suffix}")
    return f"{opt.help} ({'; '.join(notes)})" if notes else opt.help


def add_arguments(
    parser: argparse.ArgumentParser, cls: type[Settings], environ: Mapping[str, str] | None = None
) -> None:
    """One argparse option per field of `cls`; an environment variable set for a field is its default."""
    environ = os.environ if environ is None else environ
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for opt in options(cls):
        info = cls.model_fields[opt.field]
        _, scalar, _ = _kind(info)
        target: Any = parser
        if opt.group:
            target = groups.get(opt.group) or groups.setdefault(
                opt.group, parser.add_argument_group(opt.group)
            )
        if opt.exclusive:
            target = exclusive.get(opt.exclusive) or exclusive.setdefault(
                opt.exclusive, target.add_mutually_exclusive_group()
            )
        env_value = next((environ[n] for n in opt.env if environ.get(n)), None)
        kwargs: dict[str, Any] = {"dest": opt.field, "help": _help(opt).replace("%", "%%")}
        if metavar := _extra(info).get("metavar"):
            kwargs["metavar"] = metavar
        if opt.kind == "switch":
            on = TypeAdapter(bool).validate_python(env_value) if env_value else bool(opt.default)
            action = "store_false" if opt.default is True else "store_true"  # True: --no-<name>
            target.add_argument(*opt.flags, action=action, default=on, **kwargs)
            continue
        if opt.kind == "list":
            # repeatable flag; the variable is a comma list. A flag replaces the variable's list.
            default = _split_commas(env_value) if env_value else opt.default
            target.add_argument(*opt.flags, action=_ReplaceAppend, default=default, **kwargs)
            continue
        # a string default goes through `type` at parse time (argparse checks no default against
        # `choices`; from_args does), so a bad variable fails like a bad flag, naming it
        default = env_value if env_value is not None else opt.default
        if opt.kind == "csv" and env_value is None:
            default = opt.shown_default or ""  # the flag's own form: one comma-separated text
        required = opt.required and env_value is None
        target.add_argument(
            *opt.flags, type=scalar, choices=opt.choices, default=default, required=required, **kwargs
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
        return cls.model_validate(values)  # these values only (settings_customise_sources)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else ""
            if name not in cls.model_fields:  # a check across options: its message names them
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            env = " or ".join(cls.env_names(name))
            where = f"{flag_of(cls, name)} / {env}" if env else flag_of(cls, name)
            problems.append(
                f"{where}: {str(err['msg']).removeprefix('Value error, ')} (got {err.get('input')!r})"
            )
        raise SettingsError("; ".join(problems)) from None


def from_args(cls: type[S], args: argparse.Namespace, **extra: Any) -> S:
    """Validated settings from parsed flags (whose defaults already hold the environment's values)."""
    values = {name: getattr(args, name) for name in cls.model_fields if hasattr(args, name)}
    values.update(extra)
    return _validate(cls, values)


def parse_settings(cls: type[S], args: argparse.Namespace | S, prog: str) -> S:
    """`args` validated into `cls` (settings pass as they are); a bad value prints `prog: error: ...`
    naming the flag and exits with status 2, as argparse does for a bad flag."""
    if isinstance(args, cls):
        return args
    try:
        return from_args(cls, args)  # type: ignore[arg-type]
    except SettingsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
