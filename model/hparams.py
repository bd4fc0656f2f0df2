"""The model's hyperparameters: parsed and validated without TensorFlow.

The entry point calls `parse_hyperparameters` before it starts any process, so a typo fails
the job in seconds with a one-line message instead of after every rank has imported
TensorFlow; `model.train` calls the same function on its own command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MODELS: tuple[str, ...] = ("small_cnn", "mobilenet_v2", "resnet50")
# How channels are laid out: detected, class folders, or record shards (python -m model.records).
DATA_FORMATS: tuple[str, ...] = ("auto", "folders", "records")

# keras.applications refuses inputs smaller than 32x32; the upper bound only catches typos
# (an extra zero) before they become an out-of-memory error an hour later.
MIN_IMAGE_SIZE = 32
MAX_IMAGE_SIZE = 1024


class HyperparameterError(ValueError):
    """A hyperparameter is unknown, malformed or out of range; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    epochs: int = 10
    # Per rank: the global batch is batch_size * number of ranks.
    batch_size: int = 64
    # For one rank; scaled by the number of ranks (Goyal et al., https://arxiv.org/abs/1706.02677).
    learning_rate: float = 1e-3
    # Epochs over which the rate ramps from learning_rate to learning_rate * ranks.
    warmup_epochs: float = 3.0
    image_size: int = 64
    model: str = "small_cnn"
    seed: int = 0
    # Fraction of a channel's images that may be unreadable before the job fails.
    max_bad_fraction: float = 0.01
    data_format: str = "auto"


_INTEGER = re.compile(r"[+-]?\d+")


def _parse_int(name: str, text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()):
        raise HyperparameterError(f"hyperparameter {name}={text!r} is not an integer")
    return int(text)


def _parse_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise HyperparameterError(f"hyperparameter {name}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise HyperparameterError(f"hyperparameter {name}={text!r} is not a finite number")
    return value


def _parse_str(name: str, text: str) -> str:
    del name
    return text.strip()


_PARSERS: dict[type, Callable[[str, str], Any]] = {
    int: _parse_int,
    float: _parse_float,
    str: _parse_str,
}

_FIELDS: dict[str, dataclasses.Field[Any]] = {
    field.name: field for field in dataclasses.fields(Hyperparameters)
}
KNOWN_NAMES: tuple[str, ...] = tuple(sorted(_FIELDS))


def _field_type(field: dataclasses.Field[Any]) -> type:
    # `from __future__ import annotations` makes field.type a string.
    return {"int": int, "float": float, "str": str}[str(field.type)]


def _check_ranges(params: Hyperparameters) -> None:
    def bad(name: str, requirement: str) -> HyperparameterError:
        return HyperparameterError(
            f"hyperparameter {name}={getattr(params, name)!r} must be {requirement}"
        )

    if params.epochs < 1:
        raise bad("epochs", "at least 1")
    if params.batch_size < 1:
        raise bad("batch_size", "at least 1")
    if params.learning_rate <= 0:
        raise bad("learning_rate", "positive")
    if params.warmup_epochs < 0:
        raise bad("warmup_epochs", "zero or positive")
    if not MIN_IMAGE_SIZE <= params.image_size <= MAX_IMAGE_SIZE:
        raise bad("image_size", f"between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE}")
    if params.model not in MODELS:
        raise bad("model", f"one of {', '.join(MODELS)}")
    if params.seed < 0:
        raise bad("seed", "zero or positive")
    if params.data_format not in DATA_FORMATS:
        raise bad("data_format", f"one of {', '.join(DATA_FORMATS)}")
    if not 0 <= params.max_bad_fraction <= 1:
        raise bad("max_bad_fraction", "between 0 and 1")


def parse_hyperparameters(raw: Mapping[str, str]) -> Hyperparameters:
    """Build Hyperparameters from string values (defaults for the names not given).

    Raises HyperparameterError (a ValueError) whose one-line message names the culprit.
    Unknown names are errors: a misspelt `epoch` silently training for the default 10 epochs
    is worse than a failed job.
    """
    values: dict[str, Any] = {}
    for name in sorted(raw):
        field = _FIELDS.get(name)
        if field is None:
            close = difflib.get_close_matches(name, KNOWN_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise HyperparameterError(
                f"unknown hyperparameter {name!r}{hint}; known: {', '.join(KNOWN_NAMES)}"
            )
        text = raw[name]
        if not isinstance(text, str):
            raise HyperparameterError(f"hyperparameter {name}={text!r} is not a string")
        values[name] = _PARSERS[_field_type(field)](name, text)
    params = Hyperparameters(**values)
    _check_ranges(params)
    return params


def parse_argv(argv: Sequence[str]) -> dict[str, str]:
    """Turn `--name value` (or `--name=value`) pairs into a dict of strings.

    No argparse: its prefix matching would accept `--epoch` for `--epochs`, and its
    option-looking-value rules would reject a value such as `-1` that the range check should
    report instead.
    """
    raw: dict[str, str] = {}
    index = 0
    while index < len(argv):
        argument = argv[index]
        if not argument.startswith("--") or len(argument) == 2:
            raise HyperparameterError(f"expected --name value, got {argument!r}")
        name, equals, value = argument[2:].partition("=")
        if not equals:
            if index + 1 >= len(argv):
                raise HyperparameterError(f"hyperparameter {name!r} has no value")
            value = argv[index + 1]
            index += 1
        index += 1
        if name in raw:
            raise HyperparameterError(f"hyperparameter {name!r} is given twice")
        raw[name] = value
    return raw


def check_hyperparameters(hyperparameters: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """The entry point's check of the built-in program (registered in pyproject.toml): None, or
    the one-line error of parse_hyperparameters."""
    del env  # the built-in model's hyperparameters say it all
    try:
        parse_hyperparameters(hyperparameters)
    except ValueError as error:
        return str(error)
    return None
