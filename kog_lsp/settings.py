"""Typed server settings (the `kog` section of initializationOptions / didChangeConfiguration).

`Settings.update(dict)` validates every key on its own: a bad value is reported (returned as a warning
string the server shows with window/showMessage) and the old value is kept, the good keys still apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MULTILINE_MODES = ("auto", "always", "never")
SEVERITIES = ("error", "warning", "information", "hint")


def _is_int(v: Any) -> bool:
    # bool is an int subclass in Python; `true` is never a valid token count.
    return isinstance(v, int) and not isinstance(v, bool)


# key -> (attribute, validator returning the converted value or raising ValueError)
def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise ValueError("expected true or false")


def _int_range(lo: int, hi: int):
    def check(v: Any) -> int:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not _is_int(v):
            raise ValueError("expected an integer")
        if not lo <= v <= hi:
            raise ValueError(f"expected {lo} <= value <= {hi}")
        return v

    return check


def _float_range(lo: float, hi: float):
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("expected a number")
        if not lo <= float(v) <= hi:
            raise ValueError(f"expected {lo} <= value <= {hi}")
        return float(v)

    return check


def _choice(options: tuple[str, ...]):
    def check(v: Any) -> str:
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return v

    return check


_VALIDATORS = {
    "enable": ("enable", _bool),
    "debounceMs": ("debounce_ms", _int_range(0, 10_000)),
    "maxTokens": ("max_tokens", _int_range(1, 2048)),
    "multiline": ("multiline", _choice(MULTILINE_MODES)),
    "prefixTokens": ("prefix_tokens", _int_range(1, 32_768)),
    "suffixTokens": ("suffix_tokens", _int_range(0, 32_768)),
    "contextTokens": ("context_tokens", _int_range(0, 32_768)),
    "temperature": ("temperature", _float_range(0.0, 5.0)),
    "reviewEnable": ("review_enable", _bool),
    "reviewSeverity": ("review_severity", _choice(SEVERITIES)),
}


@dataclass
class Settings:
    enable: bool = True
    debounce_ms: int = 50
    max_tokens: int = 64
    multiline: str = "auto"
    prefix_tokens: int = 1024
    suffix_tokens: int = 64
    context_tokens: int = 512
    temperature: float = 0.0
    review_enable: bool = True
    review_severity: str = "information"

    def update(self, values: Any) -> list[str]:
        """Apply the valid keys of `values` in place; return one warning per rejected key.

        Accepts either the bare settings object or one wrapped as {"kog": {...}} (clients differ).
        Unknown keys are reported too (a typo should not silently do nothing).
        """
        if values is None:
            return []
        if not isinstance(values, dict):
            return [f"kog settings must be an object, got {type(values).__name__}; keeping current settings"]
        if "kog" in values and isinstance(values["kog"], dict):
            values = values["kog"]
        warnings: list[str] = []
        for key, value in values.items():
            if key not in _VALIDATORS:
                warnings.append(f"unknown kog setting {key!r} ignored")
                continue
            attr, check = _VALIDATORS[key]
            try:
                setattr(self, attr, check(value))
            except ValueError as exc:
                warnings.append(f"invalid kog.{key} = {value!r} ({exc}); keeping {getattr(self, attr)!r}")
        return warnings

    def to_dict(self) -> dict[str, Any]:
        """Every known key (including ones features registered) -> current value."""
        return {key: getattr(self, attr) for key, (attr, _) in _VALIDATORS.items() if hasattr(self, attr)}


def register_setting(settings: Settings, key: str, attr: str, check, default) -> bool:
    """Let a feature module add a `kog.<key>` setting (validated by `check`, which returns the converted
    value or raises ValueError). Returns False when the key already exists (left as it is)."""
    if key in _VALIDATORS:
        return False
    _VALIDATORS[key] = (attr, check)
    if not hasattr(settings, attr):
        setattr(settings, attr, default)
    return True
