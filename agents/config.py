"""The agent's settings: a command-line flag wins over the `--env-file`, which wins over the environment.

Every setting has a flag and a `LAYERCAKE_*` variable (the systemd unit passes /etc/layercake/agent.env
as the environment). An env file holds `KEY=VALUE` lines, read without any shell evaluation: blank lines
and lines starting with `#` or `;` are skipped, quotes around a whole value are removed, and nothing else
(`$`, backticks, backslashes) is interpreted. A `LAYERCAKE_*` key the agent does not know is an error
(a typo would otherwise be ignored); other keys are exported to the inference servers the agent starts,
as systemd's `EnvironmentFile=` does.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "LAYERCAKE_"
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LIST_SEPARATORS = re.compile("[," + re.escape(os.pathsep) + "]")


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names the flag or variable and where it came from."""


@dataclass(frozen=True)
class Setting:
    dest: str  # the argparse destination; the parser leaves it None ([] for lists) when the flag is absent
    flag: str
    env: str
    read: Callable[[str], Any]  # one text -> its value; a ValueError says what is wrong
    default: Callable[[], Any] = lambda: None
    many: bool = False  # a repeatable flag; in a variable, entries separated by commas or os.pathsep
    required: bool = False
    bounds: tuple[float, float] | None = None  # inclusive, for numbers of seconds
    help: str = ""
    metavar: str | None = None

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.read is boolean:  # a switch: the flag alone means true; the variable says true or false
            parser.add_argument(
                self.flag,
                dest=self.dest,
                action="store_const",
                const="true",
                help=f"{self.help} [env {self.env}=true]",
            )
            return
        parser.add_argument(
            self.flag,
            dest=self.dest,
            action="append" if self.many else "store",
            metavar=self.metavar,
            help=f"{self.help} [env {self.env}]",
        )


@dataclass(frozen=True)
class EnvValue:
    text: str
    origin: str  # "the environment" or "PATH line N"


def seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {text!r}") from None


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value in ("true", "1", "yes")


def url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"expected the dashboard's http:// or https:// URL, got {text!r}")
    return text


def items(text: str) -> list[str]:
    """A list in one variable: entries separated by commas or the OS path separator."""
    return [entry.strip() for entry in LIST_SEPARATORS.split(text) if entry.strip()]


def read_env_file(path: Path) -> dict[str, EnvValue]:
    """KEY=VALUE lines, without shell evaluation; ConfigError names the line that is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--env-file {path}: cannot read it ({exc})") from None
    values: dict[str, EnvValue] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not ENV_KEY.match(key.strip()):
            raise ConfigError(f"{path} line {number}: expected KEY=VALUE, got {line[:80]!r}")
        values[key.strip()] = EnvValue(unquote(value.strip()), f"{path} line {number}")
    return values


def unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def environment(environ: Mapping[str, str], env_file: Path | None, known: set[str]) -> dict[str, EnvValue]:
    """The agent's view of its environment: the process environment overlaid with the env file."""
    values = {
        key: EnvValue(text, "the environment") for key, text in environ.items() if key.startswith(PREFIX)
    }
    if env_file is None:
        return values
    from_file = read_env_file(env_file)
    for key, value in from_file.items():
        if key.startswith(PREFIX) and key not in known:
            raise ConfigError(f"{value.origin}: unknown setting {key} (known: {', '.join(sorted(known))})")
    os.environ.update({key: v.text for key, v in from_file.items() if not key.startswith(PREFIX)})
    return {**values, **{key: v for key, v in from_file.items() if key.startswith(PREFIX)}}


def resolve(args: argparse.Namespace, settings: tuple[Setting, ...], values: Mapping[str, EnvValue]) -> None:
    """Set every setting on `args`: from its flag, else from `values`, else its default; check each."""
    for setting in settings:
        text, where = source_of(args, setting, values)
        value = setting.default() if text is None else read(setting, text, where)
        if setting.required and not value:
            raise ConfigError(f"{setting.flag} is required (or set {setting.env})")
        check_bounds(setting, value, where)
        setattr(args, setting.dest, value)


def source_of(args: argparse.Namespace, setting: Setting, values: Mapping[str, EnvValue]) -> tuple[Any, str]:
    """The text given for a setting (a list for repeatable ones) and where it came from, or None."""
    given = getattr(args, setting.dest)
    if given is not None and given != []:
        return given, setting.flag
    if setting.env in values:
        env = values[setting.env]
        return (items(env.text) if setting.many else env.text), f"{setting.env} (from {env.origin})"
    return None, setting.flag


def read(setting: Setting, text: Any, where: str) -> Any:
    try:
        return [setting.read(entry) for entry in text] if setting.many else setting.read(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_bounds(setting: Setting, value: Any, where: str) -> None:
    if setting.bounds is None or value is None:
        return
    low, high = setting.bounds
    if not low <= value <= high:
        raise ConfigError(f"{where} must be between {low:g} and {high:g} seconds, got {value:g}")
