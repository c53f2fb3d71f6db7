"""Command-line options declared on the fields of a frozen config, once.

A field declared with `option(default, "--flag", help=...)` is a command-line option: its flag names, help, value
parser (from the field's type unless given), choices and mutually exclusive group live in the declaration, and the
argparse options (`add_options`), the config built from parsed arguments (`config_from`) and the argv that
`prefixscope up` passes on to the engine it starts (`passed_on_argv`) are all derived from it. The argparse `dest` of
each option is its field's name. The shape follows SGLang's `ServerArgs` (one declaration per flag), kept frozen.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """How one config field appears on the command line.

    `names`: the flag and its aliases (the first is the one passed on). A bool field is a switch: a flag without a
    value that sets it, or, for a field that defaults to True, turns it off (`--no-prefix-cache`). `passed_on`:
    `prefixscope up` (and the benchmarks) offer it and pass it on; False for options only `prefixscope engine`
    itself takes."""

    names: tuple[str, ...]
    help: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    group: str | None = None
    passed_on: bool = True


def option(
    default: Any,
    *names: str,
    help: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    group: str | None = None,
    passed_on: bool = True,
) -> Any:
    """A dataclass field with `default` that is also the command-line option `names[0]` (aliases after it)."""
    flag = Flag(tuple(names), help, parse, choices, metavar, group, passed_on)
    return dataclasses.field(default=default, metadata={"flag": flag})


def option_group(default: Any, prefix: str, title: str) -> Any:
    """A dataclass field holding a nested frozen config (`default`) whose own `option` fields are command-line
    options too, shown under `title`, each with argparse dest `prefix + field name`."""
    return dataclasses.field(default=default, metadata={"group": (prefix, title)})


@dataclass(frozen=True)
class Declared:
    """One option as found in a config's fields: its argparse `dest`, the field path from the outer config
    (`("kv_events", "endpoint")`), its Flag, value type, default and the title of the argument group it shows in."""

    dest: str
    path: tuple[str, ...]
    flag: Flag
    value_type: type
    default: Any
    title: str | None

    @property
    def negated(self) -> bool:
        """A switch that turns a field which defaults to True off (`--no-prefix-cache`): its argparse dest is the
        flag's own name (`no_prefix_cache`, default False) and the field is its negation."""
        return self.value_type is bool and self.default is True


def flags_of(config_type: type, prefix: str = "", path: tuple[str, ...] = (), title: str | None = None
             ) -> list[Declared]:
    """The options of `config_type` (nested groups included) in declaration order."""
    found: list[Declared] = []
    for field in dataclasses.fields(config_type):
        if "group" in field.metadata:
            group_prefix, group_title = field.metadata["group"]
            found += flags_of(_field_type(config_type, field), prefix + group_prefix, path + (field.name,),
                              group_title)
            continue
        flag = field.metadata.get("flag")
        if flag is not None:
            value_type = _value_type(_field_type(config_type, field))
            dest = prefix + field.name
            if value_type is bool and field.default is True:
                dest = flag.names[0].lstrip("-").replace("-", "_")
            found.append(Declared(dest, path + (field.name,), flag, value_type, field.default, title))
    return found


def _field_type(config_type: type, field: dataclasses.Field) -> Any:
    """The field's annotation, evaluated in its module (only option fields are: the others may name types that are
    imported for type checking only)."""
    if not isinstance(field.type, str):
        return field.type
    return eval(field.type, vars(sys.modules[config_type.__module__]))  # noqa: S307 - the module's own annotation


def _value_type(hint: Any) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (value,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return value
    return hint


def add_options(parser: argparse.ArgumentParser, config_type: type, *, passed_on: bool | None = None) -> None:
    """Add `config_type`'s options to `parser` (those with `Flag.passed_on == passed_on`; all when None)."""
    sections: dict[str, Any] = {}
    groups: dict[tuple[str | None, str], Any] = {}
    for declared in flags_of(config_type):
        flag = declared.flag
        if passed_on is not None and flag.passed_on != passed_on:
            continue
        section: Any = parser
        if declared.title is not None:
            section = sections.get(declared.title) or sections.setdefault(
                declared.title, parser.add_argument_group(declared.title))
        target = section
        if flag.group is not None:
            key = (declared.title, flag.group)
            target = groups.get(key) or groups.setdefault(key, section.add_mutually_exclusive_group())
        kwargs: dict[str, Any] = {"dest": declared.dest, "help": flag.help}
        if declared.value_type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = declared.default
            if flag.parse is not None or declared.value_type in (int, float):
                kwargs["type"] = flag.parse or declared.value_type
            if flag.choices is not None:
                kwargs["choices"] = list(flag.choices)
            if flag.metavar is not None:
                kwargs["metavar"] = flag.metavar
        target.add_argument(*flag.names, **kwargs)


def config_from(config_type: type, args: argparse.Namespace, **values: Any) -> Any:
    """`config_type` from parsed arguments: each option from `args` (its default when `args` lacks it), nested groups
    built the same way, then `values`. Raises what the configs' own checks raise (ValueError)."""
    return _build(config_type, args, "", values)


def _build(config_type: type, args: argparse.Namespace, prefix: str, values: dict[str, Any]) -> Any:
    kwargs = {}
    declared = {d.path[-1]: d for d in flags_of(config_type, prefix) if len(d.path) == 1}
    for field in dataclasses.fields(config_type):
        if "group" in field.metadata:
            kwargs[field.name] = _build(_field_type(config_type, field), args, prefix + field.metadata["group"][0], {})
        elif field.name in declared:
            option = declared[field.name]
            if option.negated:
                kwargs[field.name] = not getattr(args, option.dest, False)
            else:
                kwargs[field.name] = getattr(args, option.dest, field.default)
    return config_type(**(kwargs | values))


def passed_on_argv(config_type: type, args: argparse.Namespace) -> list[str]:
    """The passed-on options given in `args` (those not at their default), as argv for another program that takes
    the same options."""
    argv: list[str] = []
    for declared in flags_of(config_type):
        if not declared.flag.passed_on:
            continue
        if declared.value_type is bool:
            argv += [declared.flag.names[0]] if getattr(args, declared.dest, False) else []
            continue
        value = getattr(args, declared.dest, declared.default)
        if value is not None and value != declared.default:
            argv += [declared.flag.names[0], str(value)]
    return argv


def at_least(low: int):
    """argparse type: a whole number >= `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0 (0 turns a tier off)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative (0 turns the tier off)")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite size in GiB >= 0 (0 turns a tier off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a size in GiB (0 turns the tier off)")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite size in GiB > 0."""
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return value
