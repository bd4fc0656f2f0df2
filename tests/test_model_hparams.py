"""model.hparams: the hyperparameters the entry point validates before starting any rank."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from model.hparams import (
    KNOWN_NAMES,
    HyperparameterError,
    Hyperparameters,
    parse_argv,
    parse_hyperparameters,
)


def test_defaults_when_nothing_is_given() -> None:
    params = parse_hyperparameters({})
    assert params == Hyperparameters()
    assert (params.epochs, params.batch_size, params.learning_rate) == (10, 64, 1e-3)
    assert (params.image_size, params.model, params.max_bad_fraction) == (64, "small_cnn", 0.01)


def test_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Hyperparameters().epochs = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"epochs": "3"}, {"epochs": 3}),
        ({"epochs": " 3 "}, {"epochs": 3}),
        ({"batch_size": "+16"}, {"batch_size": 16}),
        ({"learning_rate": "0.05"}, {"learning_rate": 0.05}),
        ({"learning_rate": "1e-4"}, {"learning_rate": 1e-4}),
        ({"learning_rate": "2"}, {"learning_rate": 2.0}),
        ({"warmup_epochs": "0"}, {"warmup_epochs": 0.0}),
        ({"warmup_epochs": "2.5"}, {"warmup_epochs": 2.5}),
        ({"image_size": "32"}, {"image_size": 32}),
        ({"image_size": "1024"}, {"image_size": 1024}),
        ({"model": "mobilenet_v2"}, {"model": "mobilenet_v2"}),
        ({"model": "resnet50"}, {"model": "resnet50"}),
        ({"seed": "42"}, {"seed": 42}),
        ({"max_bad_fraction": "0"}, {"max_bad_fraction": 0.0}),
        ({"max_bad_fraction": "1"}, {"max_bad_fraction": 1.0}),
        (
            {"epochs": "2", "batch_size": "32", "model": "resnet50"},
            {"epochs": 2, "batch_size": 32, "model": "resnet50"},
        ),
    ],
)
def test_parses_valid_values(raw: dict[str, str], expected: dict[str, Any]) -> None:
    assert parse_hyperparameters(raw) == dataclasses.replace(Hyperparameters(), **expected)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"epochs": "ten"}, "hyperparameter epochs='ten' is not an integer"),
        ({"epochs": "2.0"}, "hyperparameter epochs='2.0' is not an integer"),
        ({"epochs": ""}, "hyperparameter epochs='' is not an integer"),
        ({"epochs": "1_0"}, "hyperparameter epochs='1_0' is not an integer"),
        ({"epochs": "0"}, "hyperparameter epochs=0 must be at least 1"),
        ({"batch_size": "0"}, "hyperparameter batch_size=0 must be at least 1"),
        ({"batch_size": "-8"}, "hyperparameter batch_size=-8 must be at least 1"),
        ({"learning_rate": "fast"}, "hyperparameter learning_rate='fast' is not a number"),
        ({"learning_rate": "nan"}, "hyperparameter learning_rate='nan' is not a finite number"),
        ({"learning_rate": "inf"}, "hyperparameter learning_rate='inf' is not a finite number"),
        ({"learning_rate": "0"}, "hyperparameter learning_rate=0.0 must be positive"),
        ({"warmup_epochs": "-1"}, "hyperparameter warmup_epochs=-1.0 must be zero or positive"),
        ({"image_size": "16"}, "hyperparameter image_size=16 must be between 32 and 1024"),
        ({"image_size": "2048"}, "hyperparameter image_size=2048 must be between 32 and 1024"),
        (
            {"model": "vgg16"},
            "hyperparameter model='vgg16' must be one of small_cnn, mobilenet_v2, resnet50",
        ),
        ({"seed": "-1"}, "hyperparameter seed=-1 must be zero or positive"),
        (
            {"data_format": "tfrecord"},
            "hyperparameter data_format='tfrecord' must be one of auto, folders, records",
        ),
        (
            {"max_bad_fraction": "1.5"},
            "hyperparameter max_bad_fraction=1.5 must be between 0 and 1",
        ),
        (
            {"max_bad_fraction": "much"},
            "hyperparameter max_bad_fraction='much' is not a number",
        ),
        (
            {"epoch": "3"},
            "unknown hyperparameter 'epoch' (did you mean 'epochs'?); known: "
            + ", ".join(KNOWN_NAMES),
        ),
        (
            {"optimizer": "sgd"},
            "unknown hyperparameter 'optimizer'; known: " + ", ".join(KNOWN_NAMES),
        ),
    ],
)
def test_rejects_bad_values_with_one_line_naming_the_culprit(
    raw: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=r"^hyperparameter|^unknown") as caught:
        parse_hyperparameters(raw)
    assert str(caught.value) == message
    assert "\n" not in message
    assert isinstance(caught.value, HyperparameterError)


def test_rejects_values_that_are_not_strings() -> None:
    with pytest.raises(HyperparameterError, match="epochs=3 is not a string"):
        parse_hyperparameters({"epochs": 3})  # type: ignore[dict-item]


def test_known_names_are_the_fields() -> None:
    assert set(KNOWN_NAMES) == {field.name for field in dataclasses.fields(Hyperparameters)}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {}),
        (["--epochs", "3"], {"epochs": "3"}),
        (["--epochs=3", "--model", "resnet50"], {"epochs": "3", "model": "resnet50"}),
        # A value may look like an option: the range check, not the parser, judges it.
        (["--seed", "-1"], {"seed": "-1"}),
        (["--model", "--epochs"], {"model": "--epochs"}),
        (["--model="], {"model": ""}),
    ],
)
def test_parse_argv_pairs_names_and_values(argv: list[str], expected: dict[str, str]) -> None:
    assert parse_argv(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["epochs", "3"], "expected --name value, got 'epochs'"),
        (["--", "3"], "expected --name value, got '--'"),
        (["--epochs"], "hyperparameter 'epochs' has no value"),
        (["--epochs", "3", "--epochs", "4"], "hyperparameter 'epochs' is given twice"),
        (["--epochs", "3", "4"], "expected --name value, got '4'"),
    ],
)
def test_parse_argv_rejects_malformed_command_lines(argv: list[str], message: str) -> None:
    with pytest.raises(HyperparameterError) as caught:
        parse_argv(argv)
    assert str(caught.value) == message


def test_parse_argv_does_not_match_prefixes() -> None:
    # argparse would take --epoch for --epochs; the unknown name must reach the check.
    with pytest.raises(HyperparameterError, match="unknown hyperparameter 'epoch'"):
        parse_hyperparameters(parse_argv(["--epoch", "3"]))
