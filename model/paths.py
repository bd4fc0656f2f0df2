"""Where the training program reads and writes, from SageMaker's environment variables.

https://github.com/aws/sagemaker-training-toolkit/blob/master/ENVIRONMENT_VARIABLES.md
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

ML_ROOT = Path("/opt/ml")
CHANNELS: tuple[str, ...] = ("train", "validation", "test", "pretrained")


@dataclasses.dataclass(frozen=True)
class TrainingPaths:
    # A channel is None when SageMaker did not provide it.
    train: Path | None
    validation: Path | None
    test: Path | None
    model_dir: Path
    output_dir: Path
    checkpoint_dir: Path
    # Keras weights for the keras.applications backbone, if the job was given them.
    pretrained: Path | None = None

    @property
    def tensorboard_dirs(self) -> tuple[Path, Path]:
        """The output dir's copy is the conventional place; the checkpoint dir's copy is the
        one SageMaker uploads to S3 while the job still runs."""
        return (self.output_dir / "tensorboard", self.checkpoint_dir / "tensorboard")

    def channel(self, name: str) -> Path | None:
        if name not in CHANNELS:
            raise KeyError(name)
        value: Path | None = getattr(self, name)
        return value


def paths_from_env(
    env: Mapping[str, str], is_dir: Callable[[Path], bool] = Path.is_dir
) -> TrainingPaths:
    """A channel is present if `SM_CHANNEL_<NAME>` is set or its default directory exists
    (a container started by hand gets no SM_ variables, only the mounted /opt/ml)."""

    def channel(name: str) -> Path | None:
        variable = f"SM_CHANNEL_{name.upper()}"
        if env.get(variable):
            return Path(env[variable])
        default = ML_ROOT / "input" / "data" / name
        return default if is_dir(default) else None

    def directory(variable: str, default: Path) -> Path:
        return Path(env[variable]) if env.get(variable) else default

    return TrainingPaths(
        train=channel("train"),
        validation=channel("validation"),
        test=channel("test"),
        model_dir=directory("SM_MODEL_DIR", ML_ROOT / "model"),
        output_dir=directory("SM_OUTPUT_DIR", ML_ROOT / "output"),
        checkpoint_dir=directory("SM_CHECKPOINT_DIR", ML_ROOT / "checkpoints"),
        pretrained=channel("pretrained"),
    )
