"""Declared run-config keys: a dataclass field per key with its default, allowed range or values and one-line help.

`hp(...)` declares a field; `parse_fields(cls, raw)` validates a raw Flower run config into an instance of
`cls` with one-line errors naming the key; `describe(cls)` lists the keys for pyproject.toml and docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A run-config key or value a user got wrong; the message is one line naming it."""


@dataclass(frozen=True)
class Hyper:
    """What a run-config key accepts, beside its default (the dataclass field's)."""

    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    parse: Callable[[str, Any], Any] | None = None  # a custom parser (key, raw value) -> value
    key: str = ""  # the dashed key; filled from the field name when empty
    allowed: str = ""  # what the key tables' 'allowed' column says, where choices or a range cannot


def hp(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: Iterable[str] = (),
    parse: Callable[[str, Any], Any] | None = None,
    key: str = "",
    allowed: str = "",
) -> Any:
    """A dataclass field declaring one run-config key (default, range or choices, one-line help)."""
    meta = Hyper(help, low, high, low_open, high_open, tuple(choices), parse, key, allowed)
    return dataclasses.field(default=default, metadata={"hyper": meta})


@dataclass(frozen=True)
class KeyInfo:
    """A declared key as documentation sees it."""

    key: str
    attr: str
    default: Any
    hyper: Hyper


def describe(cls: type) -> list[KeyInfo]:
    """The run-config keys declared on a dataclass, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("hyper")
        if isinstance(meta, Hyper):
            out.append(KeyInfo(meta.key or f.name.replace("_", "-"), f.name, f.default, meta))
    return out


def choice(key: str, value: Any, allowed: Iterable[str]) -> str:
    """`value` lower-cased if it is one of `allowed`, else a ConfigError listing them."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ConfigError(f"run-config '{key}' = {value!r} is not valid; allowed values: {', '.join(allowed)}")
    return value.lower()


def number(
    key: str,
    value: Any,
    kind: type,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """`value` as an int or float within the bounds, else a ConfigError naming the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"run-config '{key}' = {value!r} must be a number ({kind.__name__})")
    if kind is int and float(value) != int(value):
        raise ConfigError(f"run-config '{key}' = {value!r} must be a whole number")
    value = kind(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        allowed = range_text(low, high, low_open, high_open)
        raise ConfigError(f"run-config '{key}' = {value!r} is out of range; allowed: {allowed}")
    return value


def range_text(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """An interval as text, e.g. '(0.0, 1.0]' or '[1, inf]'."""
    lo = "-inf" if low is None else low
    hi = "inf" if high is None else high
    return f"{'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"


def flag(key: str, value: Any) -> bool:
    """true/false (a bool or its text), else a ConfigError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"run-config '{key}' = {value!r} must be true or false")


def parse_value(info: KeyInfo, value: Any) -> Any:
    """One key's value validated by its declaration (the kind follows the default's type)."""
    h, key, default = info.hyper, info.key, info.default
    if h.parse is not None:
        return h.parse(key, value)
    if isinstance(default, bool):
        return flag(key, value)
    if isinstance(default, (int, float)):
        return number(key, value, type(default), h.low, h.high, h.low_open, h.high_open)
    if h.choices:
        return choice(key, value, h.choices)
    return str(value)


def parse_fields(cls: type[T], raw: Mapping[str, Any], **fixed: Any) -> T:
    """An instance of the dataclass `cls` from a raw run config: declared keys validated, absent ones defaulted."""
    values = {
        info.attr: parse_value(info, raw[info.key]) if info.key in raw else info.default
        for info in describe(cls)
        if info.attr not in fixed
    }
    return cls(**values, **fixed)


def as_dict(obj: Any) -> dict[str, Any]:
    """A dataclass instance's declared keys -> values (lists for tuples), for config.json."""
    return {info.key: _plain(getattr(obj, info.attr)) for info in describe(type(obj))}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def toml_value(value: Any) -> str:
    """A default as written in pyproject.toml's [tool.flwr.app.config] (lists as comma-separated text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return '"' + ",".join(f"{v:g}" for v in value) + '"'
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def doc_value(value: Any) -> str:
    """A default as shown in the key tables (docs/configuration.md)."""
    if isinstance(value, tuple):
        return '`"' + ",".join(f"{v:g}" for v in value) + '"`'
    if isinstance(value, str) and not value:
        return '`""`'
    return f"`{toml_value(value).strip(chr(34))}`"


def allowed_text(info: KeyInfo) -> str:
    """What a key accepts, for the key tables (choices or range; empty for free text)."""
    h = info.hyper
    if h.allowed:
        return h.allowed
    if h.choices:
        return ", ".join(f"`{c}`" for c in h.choices)
    if isinstance(info.default, bool):
        return "`true`, `false`"
    if isinstance(info.default, (int, float)) and (h.low is not None or h.high is not None):
        return range_text(h.low, h.high, h.low_open, h.high_open)
    return ""
