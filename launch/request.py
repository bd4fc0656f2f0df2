"""CreateTrainingJob, the pure core: a frozen config in, a checked request dict out. No I/O.

`build_request(config)` validates what botocore does not (name patterns, enum values, the FSx
mount-name rule, spot rules, list limits, metric regexes, the entry point's own hyperparameters)
and returns the exact request. `redact(request)` is what may be printed or logged.
`model_constraint_errors(request, shape)` checks max lengths, patterns and enums of every field
against botocore's service model, which botocore's own validator leaves to the server.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from entrypoint.contract import (
    ENTRYPOINT_HYPERPARAMETERS,
    PROGRAM_PARAM,
    SUBMIT_DIR_PARAM,
    ContractError,
    check_backend_fits,
    decode_hyperparameter,
    parse_entrypoint_settings,
    program_hyperparameters,
)
from launch.errors import LaunchError
from model.hparams import parse_hyperparameters
from smcommon.names import JOB_SECRET_ENV, OLD_JOB_SECRET_ENV

REDACTED = "<redacted>"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
CODE_CHANNEL = "code"
CODE_CHANNEL_SOURCEDIR = "/opt/ml/input/data/code/sourcedir.tar.gz"
PROGRAM_HP = PROGRAM_PARAM
SUBMIT_DIR_HP = SUBMIT_DIR_PARAM

INPUT_MODES: tuple[str, ...] = ("File", "Pipe", "FastFile")
S3_DISTRIBUTIONS: tuple[str, ...] = ("FullyReplicated", "ShardedByS3Key")
FS_ACCESS_MODES: tuple[str, ...] = ("ro", "rw")

JOB_NAME_RE = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
JOB_NAME_MAX = 63
CHANNEL_NAME_RE = re.compile(r"[A-Za-z0-9\.\-_]+")
CHANNEL_NAME_MAX = 64
FILE_SYSTEM_ID_RE = re.compile(r"fs-[0-9a-f]{8,}")
ENV_KEY_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
S3_URI_RE = re.compile(r"s3://([^/]+)/?(.*)")
ROLE_ARN_RE = re.compile(r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+")
MAX_SECURITY_GROUPS = 5
MAX_SUBNETS = 16
MAX_CHANNELS = 20
MAX_RETRY_ATTEMPTS = 30
MAX_HYPERPARAMETERS = 100
MAX_METRIC_DEFINITIONS = 40

# Hyperparameters the entry point reads itself.
RESERVED_HYPERPARAMETERS: tuple[str, ...] = (*ENTRYPOINT_HYPERPARAMETERS, PROGRAM_HP, SUBMIT_DIR_HP)


@dataclass(frozen=True)
class S3Source:
    uri: str
    distribution: str = "FullyReplicated"


@dataclass(frozen=True)
class FileSystemSource:
    """`file_system_type` is `EFS` or `FSxLustre`; an empty ID means "the stack's"."""

    file_system_type: str
    file_system_id: str
    directory_path: str
    access_mode: str = "ro"


@dataclass(frozen=True)
class Channel:
    name: str
    source: S3Source | FileSystemSource
    input_mode: str | None = None


@dataclass(frozen=True)
class SourceBundle:
    """Script mode: `program` inside a tarball uploaded to `s3_uri`."""

    program: str
    s3_uri: str


@dataclass(frozen=True)
class TrainConfig:
    job_name: str
    image_uri: str
    role_arn: str
    output_s3_uri: str
    ssh_seed: str
    instance_type: str = "ml.c5.xlarge"
    instance_count: int = 1
    volume_size_gb: int = 50
    input_mode: str = "File"
    channels: tuple[Channel, ...] = ()
    hyperparameters: tuple[tuple[str, str], ...] = ()
    metric_definitions: tuple[tuple[str, str], ...] = ()
    checkpoint_s3_uri: str | None = None
    spot: bool = False
    max_runtime_seconds: int = 86_400
    max_wait_seconds: int | None = None
    max_retry_attempts: int | None = None
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    inter_container_encryption: bool = False
    network_isolation: bool = False
    environment: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    efs_id: str | None = None
    fsx_id: str | None = None
    fsx_mount_name: str | None = None
    source: SourceBundle | None = None
    metrics_time_series: bool = True


# --- parsing (pure) ------------------------------------------------------------------------


def parse_pair(text: str, *, what: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE); the value may contain `=`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise LaunchError(f"{what} must be KEY=VALUE, got {text!r}")
    return key, value


def _options(query: str, *, allowed: tuple[str, ...], uri: str) -> dict[str, str]:
    opts = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise LaunchError(
            f"channel {uri!r}: unknown option {unknown[0]!r} (allowed: {', '.join(allowed)})"
        )
    return opts


def parse_channel(text: str) -> Channel:
    """`NAME=URI[?option=value&...]` with URI one of

    - `s3://bucket/prefix`            options: distribution=FullyReplicated|ShardedByS3Key
    - `efs://fs-id/path`              options: access=ro|rw
    - `fsx://fs-id/mountname/path`    options: access=ro|rw

    and `mode=File|Pipe|FastFile` on any. An empty fs-id (`efs:///path`) means the stack's.
    """
    name, uri = parse_pair(text, what="--channel")
    try:
        parts = urlsplit(uri)
        return _parse_channel(name, uri, parts)
    except ValueError as exc:  # urlsplit / parse_qsl on a malformed URI
        raise LaunchError(f"channel {name!r}: {uri!r} is not a valid URI ({exc})") from None


def _parse_channel(name: str, uri: str, parts: SplitResult) -> Channel:
    base = uri.split("?", 1)[0]
    if parts.scheme == "s3":
        opts = _options(parts.query, allowed=("mode", "distribution"), uri=uri)
        if not parts.netloc:
            raise LaunchError(f"channel {name!r}: {uri!r} has no bucket")
        source: S3Source | FileSystemSource = S3Source(
            uri=base, distribution=opts.get("distribution", "FullyReplicated")
        )
    elif parts.scheme in ("efs", "fsx"):
        opts = _options(parts.query, allowed=("mode", "access"), uri=uri)
        path = parts.path or "/"
        if parts.scheme == "efs":
            fs_type = "EFS"
        else:
            fs_type = "FSxLustre"
            if not path.strip("/"):
                raise LaunchError(f"channel {name!r}: {uri!r} must be fsx://fs-id/mountname/path")
        source = FileSystemSource(
            file_system_type=fs_type,
            file_system_id=parts.netloc,
            directory_path=path,
            access_mode=opts.get("access", "ro"),
        )
    else:
        raise LaunchError(f"channel {name!r}: {uri!r} must start with s3://, efs:// or fsx://")
    return Channel(name=name, source=source, input_mode=opts.get("mode"))


# --- validation (pure) ---------------------------------------------------------------------


def _check_hyperparameters(config: TrainConfig) -> None:
    hps = dict(config.hyperparameters)
    if len(hps) != len(config.hyperparameters):
        keys = [k for k, _ in config.hyperparameters]
        dup = next(k for k in keys if keys.count(k) > 1)
        raise LaunchError(f"hyperparameter {dup} is given twice")
    # The entry point's and the built-in model's own parsers: the job fails here, not after
    # SageMaker has started (and billed) its instances.
    decoded = {name: decode_hyperparameter(value) for name, value in hps.items()}
    builtin_program = config.source is None and PROGRAM_HP not in hps
    try:
        settings = parse_entrypoint_settings(decoded)
        check_backend_fits(settings.backend, config.instance_count, builtin_program=builtin_program)
        if builtin_program:
            parse_hyperparameters(program_hyperparameters(decoded))
    except (ContractError, ValueError) as error:
        raise LaunchError(str(error)) from None
    if config.source is not None:
        for key in (PROGRAM_HP, SUBMIT_DIR_HP):
            if key in hps:
                raise LaunchError(f"hyperparameter {key} is set by --script; do not pass it too")
    elif (PROGRAM_HP in hps) != (SUBMIT_DIR_HP in hps):
        raise LaunchError(f"hyperparameters {PROGRAM_HP} and {SUBMIT_DIR_HP} go together")
    if len(hps) + (2 if config.source else 0) > MAX_HYPERPARAMETERS:
        raise LaunchError(f"at most {MAX_HYPERPARAMETERS} hyperparameters are allowed")


def _check_s3_uri(uri: str, *, what: str) -> None:
    if not S3_URI_RE.fullmatch(uri):
        raise LaunchError(f"{what} must be an s3://bucket/prefix URI, got {uri!r}")


def _resolved_fs_id(config: TrainConfig, src: FileSystemSource, channel: str) -> str:
    fs_id = src.file_system_id
    if not fs_id:
        fs_id = (config.efs_id if src.file_system_type == "EFS" else config.fsx_id) or ""
        if not fs_id:
            raise LaunchError(
                f"channel {channel!r}: no {src.file_system_type} file system ID in the URI "
                "and none from --stack"
            )
    if not FILE_SYSTEM_ID_RE.fullmatch(fs_id):
        raise LaunchError(f"channel {channel!r}: file system ID {fs_id!r} is not fs-<hex>")
    return fs_id


def _check_channel(config: TrainConfig, channel: Channel) -> None:
    name = channel.name
    if len(name) > CHANNEL_NAME_MAX or not CHANNEL_NAME_RE.fullmatch(name):
        raise LaunchError(
            f"channel name {name!r} must be 1-{CHANNEL_NAME_MAX} of A-Z a-z 0-9 . - _"
        )
    mode = channel.input_mode or config.input_mode
    if channel.input_mode is not None and channel.input_mode not in INPUT_MODES:
        raise LaunchError(
            f"channel {name!r}: input mode must be one of {', '.join(INPUT_MODES)}, "
            f"got {channel.input_mode!r}"
        )
    src = channel.source
    if isinstance(src, S3Source):
        _check_s3_uri(src.uri, what=f"channel {name!r}")
        if src.distribution not in S3_DISTRIBUTIONS:
            raise LaunchError(
                f"channel {name!r}: distribution must be one of {', '.join(S3_DISTRIBUTIONS)}, "
                f"got {src.distribution!r}"
            )
        return
    _resolved_fs_id(config, src, name)
    if src.access_mode not in FS_ACCESS_MODES:
        raise LaunchError(f"channel {name!r}: access must be ro or rw, got {src.access_mode!r}")
    if mode != "File":
        raise LaunchError(f"channel {name!r}: {src.file_system_type} channels need input mode File")
    if not config.subnets:
        raise LaunchError(
            f"channel {name!r}: {src.file_system_type} channels need a VPC (--subnet and "
            "--security-group, or --stack)"
        )
    path = src.directory_path
    normalized = path == "/" or (
        path.startswith("/") and "//" not in path and posixpath.normpath(path) == path.rstrip("/")
    )
    if not normalized:
        raise LaunchError(
            f"channel {name!r}: directory path {path!r} must be absolute and normalized"
        )
    if src.file_system_type == "FSxLustre":
        mount = config.fsx_mount_name
        if not mount:
            raise LaunchError(
                f"channel {name!r}: FSx channels need the file system's mount name "
                "(--fsx-mount-name or --stack)"
            )
        if path != f"/{mount}" and not path.startswith(f"/{mount}/"):
            raise LaunchError(
                f"channel {name!r}: FSx directory path {path!r} must start with /{mount} "
                "(the file system's mount name)"
            )


def _check_metrics(config: TrainConfig) -> None:
    if len(config.metric_definitions) > MAX_METRIC_DEFINITIONS:
        raise LaunchError(f"at most {MAX_METRIC_DEFINITIONS} metric definitions are allowed")
    for name, regex in config.metric_definitions:
        try:
            groups = re.compile(regex).groups
        except re.error as exc:
            raise LaunchError(f"metric {name!r}: regex {regex!r} does not compile: {exc}") from None
        if groups != 1:
            raise LaunchError(
                f"metric {name!r}: regex {regex!r} must have exactly one group, has {groups}"
            )


def _check_vpc(config: TrainConfig) -> None:
    if len(config.security_group_ids) > MAX_SECURITY_GROUPS:
        raise LaunchError(
            f"at most {MAX_SECURITY_GROUPS} security groups are allowed, "
            f"got {len(config.security_group_ids)}"
        )
    if len(config.subnets) > MAX_SUBNETS:
        raise LaunchError(f"at most {MAX_SUBNETS} subnets are allowed, got {len(config.subnets)}")
    if bool(config.subnets) != bool(config.security_group_ids):
        raise LaunchError("a VPC needs both --subnet and --security-group")


def _check_stopping(config: TrainConfig) -> None:
    if config.max_runtime_seconds < 1:
        raise LaunchError(f"max runtime must be >= 1 second, got {config.max_runtime_seconds}")
    if config.spot:
        if config.checkpoint_s3_uri is None:
            raise LaunchError("managed spot training needs checkpoints (--checkpoint-s3-uri)")
        wait = max_wait_seconds(config)
        if wait is not None and wait < config.max_runtime_seconds:
            raise LaunchError(
                f"max wait ({wait}s) must be >= max runtime ({config.max_runtime_seconds}s) "
                "for managed spot training"
            )
    elif config.max_wait_seconds is not None:
        raise LaunchError("max wait is only for managed spot training (--spot)")
    retries = config.max_retry_attempts
    if retries is not None and not 1 <= retries <= MAX_RETRY_ATTEMPTS:
        raise LaunchError(f"max retry attempts must be 1-{MAX_RETRY_ATTEMPTS}, got {retries}")


def _check_job(config: TrainConfig, instance_types: frozenset[str] | None) -> None:
    name = config.job_name
    if len(name) > JOB_NAME_MAX:
        raise LaunchError(f"job name {name!r} is {len(name)} characters; at most {JOB_NAME_MAX}")
    if not JOB_NAME_RE.fullmatch(name):
        raise LaunchError(
            f"job name {name!r} must be letters, digits and single or repeated hyphens, "
            "starting and ending with a letter or digit"
        )
    if not config.image_uri:
        raise LaunchError("no training image: pass --image-uri or --flavor")
    if not ROLE_ARN_RE.fullmatch(config.role_arn):
        raise LaunchError(
            f"role {config.role_arn!r} is not an IAM role ARN (--role-arn or --stack)"
        )
    if instance_types is not None and config.instance_type not in instance_types:
        raise LaunchError(f"instance type {config.instance_type!r} is not a training instance type")
    if config.instance_count < 1:
        raise LaunchError(f"instance count must be >= 1, got {config.instance_count}")
    if config.volume_size_gb < 1:
        raise LaunchError(f"volume size must be >= 1 GB, got {config.volume_size_gb}")
    if config.input_mode not in INPUT_MODES:
        raise LaunchError(
            f"input mode must be one of {', '.join(INPUT_MODES)}, got {config.input_mode!r}"
        )
    _check_s3_uri(config.output_s3_uri, what="output path")
    if config.checkpoint_s3_uri is not None:
        _check_s3_uri(config.checkpoint_s3_uri, what="checkpoint path")
    if config.source is not None:
        _check_s3_uri(config.source.s3_uri, what="source tarball")


def all_channels(config: TrainConfig) -> list[Channel]:
    """The user's channels plus, for script mode under network isolation, the `code` channel."""
    channels = list(config.channels)
    if config.source is not None and config.network_isolation:
        channels.append(Channel(CODE_CHANNEL, S3Source(config.source.s3_uri)))
    return channels


def _check_channels(config: TrainConfig) -> None:
    channels = all_channels(config)
    if len(channels) > MAX_CHANNELS:
        raise LaunchError(f"at most {MAX_CHANNELS} channels are allowed, got {len(channels)}")
    seen: set[str] = set()
    for channel in channels:
        if channel.name in seen:
            raise LaunchError(f"channel {channel.name!r} is given twice")
        seen.add(channel.name)
        _check_channel(config, channel)


def _check_environment(config: TrainConfig) -> None:
    env_keys = [k for k, _ in config.environment]
    for key in env_keys:
        if key in (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV):
            raise LaunchError(f"{key} is set by the launcher, fresh for each job")
        if not ENV_KEY_RE.fullmatch(key):
            raise LaunchError(f"environment variable name {key!r} is not [A-Za-z_][A-Za-z0-9_]*")
    if len(set(env_keys)) != len(env_keys):
        raise LaunchError("an environment variable is given twice")
    if not re.fullmatch(r"[0-9a-f]{64}", config.ssh_seed):
        raise LaunchError("the ssh seed must be 32 random bytes as 64 hex digits")


def validate(config: TrainConfig, *, instance_types: frozenset[str] | None = None) -> None:
    """Raise LaunchError for the first thing the service would reject (or silently misuse)."""
    _check_job(config, instance_types)
    _check_vpc(config)
    _check_channels(config)
    _check_stopping(config)
    _check_hyperparameters(config)
    _check_metrics(config)
    _check_environment(config)


def max_wait_seconds(config: TrainConfig) -> int | None:
    """Spot default: twice the runtime, so the job may wait as long as it may run."""
    if not config.spot:
        return config.max_wait_seconds
    return config.max_wait_seconds or 2 * config.max_runtime_seconds


def warnings(config: TrainConfig) -> list[str]:
    """What the request allows but the user should know (the shell logs these)."""
    notes: list[str] = []
    if config.network_isolation:
        notes.append(
            "network isolation: the container gets no network but its peers and no AWS "
            "credentials; user code cannot read or write S3 (script mode uses a 'code' channel "
            "instead of an S3 download), cannot call CloudWatch or any AWS API, and cannot pip "
            "install or reach the internet; SageMaker itself still moves channels, checkpoints, "
            "the model and the logs"
        )
    family = config.instance_type.removeprefix("ml.").split(".", 1)[0]
    tag = config.image_uri.rsplit(":", 1)[-1] if ":" in config.image_uri.rsplit("/", 1)[-1] else ""
    if family[:1] in ("p", "g") and tag.startswith("cpu"):
        notes.append(f"GPU instance {config.instance_type} with the CPU image {config.image_uri}")
    if family[:1] not in ("p", "g") and tag.startswith("gpu"):
        notes.append(f"CPU instance {config.instance_type} with the GPU image {config.image_uri}")
    if config.spot and config.max_retry_attempts is None:
        notes.append("managed spot without --max-retries: an interruption is retried by spot only")
    return notes


# --- building (pure) -----------------------------------------------------------------------


def _data_source(config: TrainConfig, channel: Channel) -> dict[str, Any]:
    src = channel.source
    if isinstance(src, S3Source):
        return {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": src.uri,
                "S3DataDistributionType": src.distribution,
            }
        }
    return {
        "FileSystemDataSource": {
            "FileSystemId": _resolved_fs_id(config, src, channel.name),
            "FileSystemAccessMode": src.access_mode,
            "FileSystemType": src.file_system_type,
            "DirectoryPath": src.directory_path,
        }
    }


def _channel(config: TrainConfig, channel: Channel) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "ChannelName": channel.name,
        "DataSource": _data_source(config, channel),
    }
    if channel.input_mode is not None:
        entry["InputMode"] = channel.input_mode
    return entry


def _hyperparameters(config: TrainConfig) -> dict[str, str]:
    hps = dict(config.hyperparameters)
    if config.source is not None:
        hps[PROGRAM_HP] = config.source.program
        hps[SUBMIT_DIR_HP] = (
            CODE_CHANNEL_SOURCEDIR if config.network_isolation else config.source.s3_uri
        )
    return {str(k): str(v) for k, v in hps.items()}


def build_request(
    config: TrainConfig, *, instance_types: frozenset[str] | None = None
) -> dict[str, Any]:
    """The CreateTrainingJob request for `config` (validated first). Contains the ssh seed."""
    validate(config, instance_types=instance_types)
    channels = all_channels(config)
    algorithm: dict[str, Any] = {
        "TrainingImage": config.image_uri,
        "TrainingInputMode": config.input_mode,
        "EnableSageMakerMetricsTimeSeries": config.metrics_time_series,
    }
    if config.metric_definitions:
        algorithm["MetricDefinitions"] = [
            {"Name": name, "Regex": regex} for name, regex in config.metric_definitions
        ]
    stopping: dict[str, int] = {"MaxRuntimeInSeconds": config.max_runtime_seconds}
    wait = max_wait_seconds(config)
    if wait is not None:
        stopping["MaxWaitTimeInSeconds"] = wait
    request: dict[str, Any] = {
        "TrainingJobName": config.job_name,
        "AlgorithmSpecification": algorithm,
        "RoleArn": config.role_arn,
        "OutputDataConfig": {"S3OutputPath": config.output_s3_uri},
        "ResourceConfig": {
            "InstanceType": config.instance_type,
            "InstanceCount": config.instance_count,
            "VolumeSizeInGB": config.volume_size_gb,
        },
        "StoppingCondition": stopping,
        "HyperParameters": _hyperparameters(config),
        "Environment": {**dict(config.environment), JOB_SECRET_ENV: config.ssh_seed},
        "EnableNetworkIsolation": config.network_isolation,
        "EnableInterContainerTrafficEncryption": config.inter_container_encryption,
        "EnableManagedSpotTraining": config.spot,
    }
    if channels:
        request["InputDataConfig"] = [_channel(config, c) for c in channels]
    if config.subnets:
        request["VpcConfig"] = {
            "SecurityGroupIds": list(config.security_group_ids),
            "Subnets": list(config.subnets),
        }
    if config.checkpoint_s3_uri is not None:
        request["CheckpointConfig"] = {
            "S3Uri": config.checkpoint_s3_uri,
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        }
    if config.max_retry_attempts is not None:
        request["RetryStrategy"] = {"MaximumRetryAttempts": config.max_retry_attempts}
    if config.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in config.tags]
    return request


def redact(request: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `request` safe to print: the job's secret replaced by `<redacted>`."""
    shown = copy.deepcopy(dict(request))
    env = shown.get("Environment")
    for secret in (JOB_SECRET_ENV, OLD_JOB_SECRET_ENV):
        if isinstance(env, dict) and secret in env:
            env[secret] = REDACTED
    return shown


# --- service-model constraints (pure, given the shape) -------------------------------------


def _compile(pattern: str) -> re.Pattern[str] | None:
    # The model's patterns are Java regexes; skip the few Python cannot read (\p{L}, ...).
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _walk_string(shape: Any, value: str, path: str) -> Iterator[str]:
    meta = shape.metadata
    enum = getattr(shape, "enum", None) or []
    if enum and value not in enum:
        yield f"{path} is {value!r}, not one of the {len(enum)} values the API accepts"
    if "max" in meta and len(value) > meta["max"]:
        yield f"{path} is {len(value)} characters; at most {meta['max']}"
    pattern = _compile(meta["pattern"]) if "pattern" in meta else None
    if pattern is not None and not pattern.fullmatch(value):
        yield f"{path} {value!r} does not match {meta['pattern']}"


def _too_many(shape: Any, value: Any, path: str) -> Iterator[str]:
    limit = shape.metadata.get("max")
    if limit is not None and len(value) > limit:
        yield f"{path} has {len(value)} entries; at most {limit}"


def _walk(shape: Any, value: Any, path: str) -> Iterator[str]:
    kind = shape.type_name
    if kind == "structure" and isinstance(value, Mapping):
        for key, member in value.items():
            if key in shape.members:
                yield from _walk(shape.members[key], member, f"{path}.{key}")
    elif kind == "list" and isinstance(value, list):
        yield from _too_many(shape, value, path)
        for i, item in enumerate(value):
            yield from _walk(shape.member, item, f"{path}[{i}]")
    elif kind == "map" and isinstance(value, Mapping):
        yield from _too_many(shape, value, path)
        for key, item in value.items():
            yield from _walk(shape.key, key, f"{path} key {key!r}")
            yield from _walk(shape.value, item, f"{path}[{key!r}]")
    elif kind == "string" and isinstance(value, str):
        yield from _walk_string(shape, value, path)
    elif kind in ("integer", "long") and isinstance(value, int):
        limit = shape.metadata.get("max")
        if limit is not None and value > limit:
            yield f"{path} is {value}; at most {limit}"


def model_constraint_errors(request: Mapping[str, Any], input_shape: Any) -> list[str]:
    """Every max/pattern/enum violation of `request` against botocore's input shape."""
    return list(_walk(input_shape, dict(request), "CreateTrainingJob"))
