"""The server's settings, from environment variables only (SageMaker's ContainerDefinition
Environment, or `docker run -e`). Pure: a mapping in, a frozen Settings out, or SettingsError."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T", int, float)

DEFAULT_PORT = 8080
# SageMaker's real-time limit; batch transform passes its own MaxPayloadInMB.
DEFAULT_MAX_PAYLOAD_MB = 6
# SageMaker's own cap on MaxPayloadInMB, and on MaxConcurrentTransforms x MaxPayloadInMB.
MAX_PAYLOAD_MB_LIMIT = 100
# SageMaker sends SIGKILL 30 s after SIGTERM: drain in less.
DEFAULT_GRACEFUL_TIMEOUT_S = 25.0
# CreateTransformJob's spelling, which the SDK's local mode insists on in /execution-parameters
# (AWS's guide shows MULTI_RECORD; SAGEMAKER_BATCH_STRATEGY may come either way).
BATCH_STRATEGIES = ("MultiRecord", "SingleRecord")
ACCEPT_TYPES = ("application/json", "application/jsonlines")
# The PyTorch runner's (SageMaker's PyTorch inference toolkit's default output_fn).
TORCH_ACCEPT_TYPES = ("application/json", "text/csv", "application/x-npy")
TENSORFLOW = "tensorflow"
PYTORCH = "pytorch"
# Set in each image (Dockerfile): "torch"/"torch-cpu" in the PyTorch images.
IMAGE_FLAVOR_ENV = "SM_IMAGE_FLAVOR"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class Settings:
    model_dir: Path = Path("/opt/ml/model")
    host: str = "0.0.0.0"  # noqa: S104  (a container's server listens on every interface)
    port: int = DEFAULT_PORT
    # SAGEMAKER_MODEL_SERVER_WORKERS; None: chosen for the host (workers.py).
    workers: int | None = None
    # Whether requests share a model call (SAGEMAKER_TFS_ENABLE_BATCHING, as AWS's TF Serving
    # container; off by default as there and in TF Serving: only the model's owner knows
    # whether its rows are independent of each other).
    batching: bool = False
    max_batch_size: int = 32
    max_batch_delay_ms: float = 5.0
    # Images waiting for the model, beyond which requests get 503 instead of queueing forever.
    max_queued_images: int = 1024
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_MB * 1024 * 1024
    request_timeout_s: float = 60.0
    graceful_timeout_s: float = DEFAULT_GRACEFUL_TIMEOUT_S
    default_accept: str = "application/json"
    batch_transform: bool = False
    batch_strategy: str = "MultiRecord"
    max_concurrent_transforms: int | None = None
    access_log: bool = False
    # SAGEMAKER_TFS_DEFAULT_MODEL_NAME: which model of several answers by default.
    default_model: str | None = None
    # SAGEMAKER_MULTI_MODEL: start with no model; SageMaker loads them through /models.
    multi_model: bool = False
    # A multi-model endpoint's folder: its code/ (inference.py, requirements.txt, lib) applies
    # to every model that has no code of its own, as in AWS's TF Serving container.
    models_dir: Path = Path("/opt/ml/models")
    # A multi-model load that would leave less memory free than this gets 507.
    min_free_bytes: int = 256 * 1024 * 1024
    # Which runner serves the model folder: the image's framework (SM_IMAGE_FLAVOR), chosen once.
    framework: str = TENSORFLOW
    # The PyTorch runner's user code: SAGEMAKER_SUBMIT_DIRECTORY when it is a folder in the
    # container (the SDK's local mode mounts the source at /opt/ml/code; a repacked model says
    # /opt/ml/model/code), else the model's code/; SAGEMAKER_PROGRAM names the module there
    # (the SDK's deploy() of an estimator: the training script), else inference.py.
    submit_directory: Path | None = None
    program: str = "inference.py"

    @property
    def code_dir(self) -> Path:
        if self.framework == PYTORCH and self.submit_directory is not None:
            return self.submit_directory
        if self.multi_model:
            return self.models_dir / "code"
        return self.model_dir / "code"

    @property
    def max_payload_mb(self) -> int:
        return self.max_payload_bytes // (1024 * 1024)


def _number(env: Mapping[str, str], name: str, convert: Callable[[str], T], low: T, high: T) -> T:
    raw = env[name].strip()
    try:
        value = convert(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={raw!r} must be between {low} and {high}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env[name].strip().lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise SettingsError(f"{name}={env[name]!r} must be true or false")


# (variable, Settings field, type, lowest, highest, multiplier): the numeric settings.
_NUMBERS: tuple[tuple[str, str, type, float, float, int], ...] = (
    ("SAGEMAKER_BIND_TO_PORT", "port", int, 1, 65535, 1),
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "workers", int, 1, 64, 1),
    ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "request_timeout_s", float, 1, 3600, 1),
    ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "max_payload_bytes", int, 1, MAX_PAYLOAD_MB_LIMIT, 1 << 20),
    ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", "max_concurrent_transforms", int, 1, 100, 1),
    ("SM_SERVE_MAX_BATCH_SIZE", "max_batch_size", int, 1, 4096, 1),
    ("SM_SERVE_MAX_BATCH_DELAY_MS", "max_batch_delay_ms", float, 0, 1000, 1),
    ("SM_SERVE_MAX_QUEUED_IMAGES", "max_queued_images", int, 1, 1 << 20, 1),
    ("SM_SERVE_GRACEFUL_TIMEOUT_S", "graceful_timeout_s", float, 0, 3600, 1),
    ("SM_SERVE_MIN_FREE_MB", "min_free_bytes", int, 0, 1 << 24, 1 << 20),
)


def _batch_strategy(value: str) -> str:
    """MULTI_RECORD, multirecord, MultiRecord -> MultiRecord."""
    squashed = value.replace("_", "").lower()
    return next((s for s in BATCH_STRATEGIES if s.lower() == squashed), value)


# (variable, Settings field, allowed values, normalize): the settings chosen from a list.
_CHOICES: tuple[tuple[str, str, tuple[str, ...], Callable[[str], str]], ...] = (
    ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "default_accept", ACCEPT_TYPES, str.lower),
    ("SAGEMAKER_BATCH_STRATEGY", "batch_strategy", BATCH_STRATEGIES, _batch_strategy),
)
_FLAGS = (
    ("SAGEMAKER_TFS_ENABLE_BATCHING", "batching"),
    ("SM_SERVE_ENABLE_BATCHING", "batching"),
    ("SAGEMAKER_BATCH", "batch_transform"),
    ("SM_SERVE_ACCESS_LOG", "access_log"),
    ("SAGEMAKER_MULTI_MODEL", "multi_model"),
)


# AWS's TF Serving container's batching variables (its batching-config file), each read where
# serve's own SM_SERVE_* variable is unset: (variable, Settings field, lowest, highest, scale).
_TFS_BATCHING: tuple[tuple[str, str, int, int, float], ...] = (
    ("SAGEMAKER_TFS_MAX_BATCH_SIZE", "max_batch_size", 1, 4096, 1),
    ("SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS", "max_batch_delay_ms", 0, 1_000_000, 1e-3),
)
# Batches that may wait, times max_batch_size: the queue bound (max_queued_images).
TFS_MAX_ENQUEUED_BATCHES = "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES"


def _tfs_batching(env: Mapping[str, str], values: dict[str, object]) -> None:
    """SAGEMAKER_TFS_MAX_BATCH_SIZE, _BATCH_TIMEOUT_MICROS and _MAX_ENQUEUED_BATCHES as AWS's
    container reads them, where serve's own variables do not say (those win).
    SAGEMAKER_TFS_NUM_BATCH_THREADS has no counterpart: one model thread per model."""
    for name, field, low, high, scale in _TFS_BATCHING:
        if env.get(name, "").strip() and field not in values:
            number = _number(env, name, int, low, high)
            values[field] = number if scale == 1 else number * scale
    if env.get(TFS_MAX_ENQUEUED_BATCHES, "").strip() and "max_queued_images" not in values:
        batches = _number(env, TFS_MAX_ENQUEUED_BATCHES, int, 1, 1 << 30)
        size = int(values.get("max_batch_size", Settings.max_batch_size))  # type: ignore[call-overload]
        values["max_queued_images"] = min(batches * size, 1 << 20)


def _pytorch_code(env: Mapping[str, str]) -> dict[str, object]:
    """SAGEMAKER_SUBMIT_DIRECTORY when it is a path in the container, and SAGEMAKER_PROGRAM."""
    values: dict[str, object] = {}
    submit = env.get("SAGEMAKER_SUBMIT_DIRECTORY", "").strip()
    if submit.startswith("/"):
        values["submit_directory"] = Path(submit)
    program = env.get("SAGEMAKER_PROGRAM", "").strip()
    if program:
        if "/" in program or not program.endswith(".py"):
            raise SettingsError(
                f"SAGEMAKER_PROGRAM={program!r} must name a .py file in the code folder"
            )
        values["program"] = program
    return values


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """Every variable is optional (empty counts as unset); a malformed one raises SettingsError
    naming it."""
    values: dict[str, object] = {}
    framework = PYTORCH if env.get(IMAGE_FLAVOR_ENV, "").startswith("torch") else TENSORFLOW
    values["framework"] = framework
    if framework == PYTORCH:
        values.update(_pytorch_code(env))
    if env.get("SM_SERVE_MODEL_DIR"):
        values["model_dir"] = Path(env["SM_SERVE_MODEL_DIR"])
    if env.get("SAGEMAKER_TFS_DEFAULT_MODEL_NAME", "").strip():
        values["default_model"] = env["SAGEMAKER_TFS_DEFAULT_MODEL_NAME"].strip()
    for name, field, kind, low, high, multiplier in _NUMBERS:
        if env.get(name, "").strip():
            values[field] = _number(env, name, kind, kind(low), kind(high)) * multiplier
    _tfs_batching(env, values)
    for name, field, allowed, normalize in _CHOICES:
        if env.get(name, "").strip():
            value = normalize(env[name].strip())
            choices = (
                TORCH_ACCEPT_TYPES
                if field == "default_accept" and framework == PYTORCH
                else allowed
            )
            if value not in choices:
                raise SettingsError(f"{name}={value!r} must be one of {', '.join(choices)}")
            values[field] = value
    for name, field in _FLAGS:
        if name in env:
            values[field] = _flag(env, name) or bool(values.get(field))
    if framework == PYTORCH and values.get("multi_model"):
        raise SettingsError(
            "SAGEMAKER_MULTI_MODEL=true: multi-model endpoints serve SavedModels, not in the "
            "torch image (one PyTorch model per endpoint)"
        )
    return Settings(**values)  # type: ignore[arg-type]


def execution_parameters(settings: Settings) -> dict[str, object]:
    """GET /execution-parameters: what a batch transform job should send us, unless its request
    says otherwise. Concurrent requests are what the batcher merges, so we ask for as many as one
    model call takes, within SageMaker's rule MaxConcurrentTransforms x MaxPayloadInMB <= 100."""
    payload_mb = max(1, settings.max_payload_mb)
    concurrency = settings.max_concurrent_transforms or min(
        settings.max_batch_size * (settings.workers or 1), MAX_PAYLOAD_MB_LIMIT // payload_mb
    )
    return {
        "MaxConcurrentTransforms": max(1, concurrency),
        "BatchStrategy": settings.batch_strategy,
        "MaxPayloadInMB": payload_mb,
    }
