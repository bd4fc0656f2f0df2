"""model.paths: where the training program reads and writes, from the environment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from model.paths import TrainingPaths, paths_from_env

DATA = Path("/opt/ml/input/data")


def no_dirs(path: Path) -> bool:
    return False


def test_defaults_without_environment_or_channel_dirs() -> None:
    paths = paths_from_env({}, is_dir=no_dirs)
    assert paths == TrainingPaths(
        train=None,
        validation=None,
        test=None,
        model_dir=Path("/opt/ml/model"),
        output_dir=Path("/opt/ml/output"),
        checkpoint_dir=Path("/opt/ml/checkpoints"),
    )


def test_a_channel_is_present_when_its_default_dir_exists() -> None:
    present = {DATA / "train", DATA / "test"}
    paths = paths_from_env({}, is_dir=lambda path: path in present)
    assert (paths.train, paths.validation, paths.test) == (DATA / "train", None, DATA / "test")


def test_environment_variables_win() -> None:
    env = {
        "SM_CHANNEL_TRAIN": "/fsx/train",
        "SM_CHANNEL_VALIDATION": "/efs/validation",
        "SM_MODEL_DIR": "/tmp/model",
        "SM_OUTPUT_DIR": "/tmp/output",
        "SM_CHECKPOINT_DIR": "/tmp/checkpoints",
    }
    paths = paths_from_env(env, is_dir=no_dirs)
    assert paths.train == Path("/fsx/train")
    assert paths.validation == Path("/efs/validation")
    assert paths.test is None
    assert paths.model_dir == Path("/tmp/model")
    assert paths.output_dir == Path("/tmp/output")
    assert paths.checkpoint_dir == Path("/tmp/checkpoints")


def test_a_channel_variable_counts_even_if_its_dir_is_missing() -> None:
    # The listing then reports the missing directory instead of silently skipping it.
    paths = paths_from_env({"SM_CHANNEL_TEST": "/nowhere"}, is_dir=no_dirs)
    assert paths.test == Path("/nowhere")


def test_empty_variables_count_as_unset() -> None:
    paths = paths_from_env({"SM_MODEL_DIR": "", "SM_CHANNEL_TRAIN": ""}, is_dir=no_dirs)
    assert paths.model_dir == Path("/opt/ml/model")
    assert paths.train is None


def test_tensorboard_goes_to_output_and_checkpoint_dirs() -> None:
    paths = paths_from_env({"SM_OUTPUT_DIR": "/o", "SM_CHECKPOINT_DIR": "/c"}, is_dir=no_dirs)
    assert paths.tensorboard_dirs == (Path("/o/tensorboard"), Path("/c/tensorboard"))


def test_channel_lookup() -> None:
    paths = paths_from_env({"SM_CHANNEL_TRAIN": "/t"}, is_dir=no_dirs)
    assert paths.channel("train") == Path("/t")
    assert paths.channel("test") is None
    with pytest.raises(KeyError):
        paths.channel("training")


def test_is_frozen() -> None:
    paths = paths_from_env({}, is_dir=no_dirs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        paths.train = Path("/x")  # type: ignore[misc]
