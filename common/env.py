"""`KVSCOPE_*` environment variables into dataclass fields: the one reader every config uses.

Values are converted to the field's annotated type (int, float, bool, str); a value that
does not convert raises `ConfigError` naming the variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from kvscope.schemas.errors import ConfigError

ENV_PREFIX: Final = "KVSCOPE_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def read_env(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """The fields of dataclass `cls` set in `env` as `KVSCOPE_<FIELD>` (nested blocks skipped)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = ENV_PREFIX + f.name.upper()
        raw = env.get(name)
        if raw is None or raw == "" or dataclasses.is_dataclass(f.default_factory):
            continue
        values[f.name] = parse_env(name, raw, f.type)
    return values


def parse_env(name: str, raw: str, annotation: Any) -> Any:
    """Convert one environment value to the field's type (annotations are strings here)."""
    kind = str(annotation)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r}: use true or false")
    return raw.strip()
