"""`python -m launch deploy` and `python -m launch transform`: serve a finished training job's
model with the image that trained it (`docker run IMAGE serve`).

Pure core: frozen configs in, the exact CreateModel, CreateEndpointConfig, CreateEndpoint and
CreateTransformJob requests out, checked locally (content and split types `serve` accepts,
names) and against botocore's service model. Shell: DescribeTrainingJob for the artifact, the
calls, and polling until the endpoint is InService or the transform job ends.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import botocore.session
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

from launch.errors import LaunchError
from launch.request import ENV_KEY_RE, ROLE_ARN_RE, model_constraint_errors
from serve.errors import ServeError
from serve.tensorflow import codec

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
NAME_MAX = 63
VARIANT = "AllTraffic"
SPLIT_TYPES = ("None", "Line")
BATCH_STRATEGIES = ("MultiRecord", "SingleRecord")
# SageMaker's rule for transform jobs: MaxConcurrentTransforms x MaxPayloadInMB <= 100.
MAX_PAYLOAD_PRODUCT_MB = 100
ENDPOINT_DONE = frozenset({"InService", "Failed", "OutOfService"})
TRANSFORM_DONE = frozenset({"Completed", "Failed", "Stopped"})


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """What a model needs: the artifact, the image that serves it, the role that reads it."""

    model_data_url: str
    image_uri: str
    role_arn: str


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    source: ModelSource
    environment: tuple[tuple[str, str], ...] = ()
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    network_isolation: bool = False
    tags: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    model: ModelConfig
    instance_type: str = "ml.c5.xlarge"
    instance_count: int = 1


@dataclasses.dataclass(frozen=True)
class TransformConfig:
    model: ModelConfig
    input_s3_uri: str
    output_s3_uri: str
    content_type: str = "image/png"
    split_type: str = "None"
    accept: str = "application/json"
    instance_type: str = "ml.c5.xlarge"
    instance_count: int = 1
    # None: the container's GET /execution-parameters decides.
    max_concurrent: int | None = None
    max_payload_mb: int | None = None
    batch_strategy: str | None = None


# --- pure ----------------------------------------------------------------------------------------


def source_from_training_job(description: Mapping[str, Any]) -> ModelSource:
    """A DescribeTrainingJob answer -> the model's artifact, image and role."""
    name = description.get("TrainingJobName", "?")
    status = description.get("TrainingJobStatus")
    if status != "Completed":
        raise LaunchError(f"training job {name} is {status}, not Completed: no model to serve")
    artifact = description.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if not artifact:
        raise LaunchError(f"training job {name} has no ModelArtifacts.S3ModelArtifacts")
    image = description.get("AlgorithmSpecification", {}).get("TrainingImage")
    if not image:
        raise LaunchError(f"training job {name} has no TrainingImage (an algorithm resource?)")
    return ModelSource(artifact, image, description["RoleArn"])


def _check_name(name: str, what: str) -> None:
    if len(name) > NAME_MAX or not NAME_RE.fullmatch(name):
        raise LaunchError(
            f"{what} {name!r} must be 1-{NAME_MAX} letters, digits and hyphens, starting and "
            "ending with a letter or digit"
        )


def _check_s3(uri: str, what: str) -> None:
    if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", uri):
        raise LaunchError(f"{what} {uri!r} is not an s3://bucket/key URI")


def _check_model(config: ModelConfig) -> None:
    _check_name(config.name, "model name")
    _check_s3(config.source.model_data_url, "model artifact")
    if not config.source.model_data_url.endswith(".tar.gz"):
        raise LaunchError(
            f"model artifact {config.source.model_data_url!r} must be a model.tar.gz "
            "(SageMaker unpacks it into /opt/ml/model)"
        )
    if not ROLE_ARN_RE.fullmatch(config.source.role_arn):
        raise LaunchError(f"role {config.source.role_arn!r} is not an IAM role ARN")
    for key, _ in config.environment:
        if not ENV_KEY_RE.fullmatch(key):
            raise LaunchError(f"environment variable name {key!r} is not [A-Za-z_][A-Za-z0-9_]*")
    if bool(config.subnets) != bool(config.security_group_ids):
        raise LaunchError("a VPC needs both --subnet and --security-group")


def _check_transform(config: TransformConfig) -> None:
    _check_s3(config.input_s3_uri, "input")
    _check_s3(config.output_s3_uri, "output")
    if config.split_type not in SPLIT_TYPES:
        raise LaunchError(f"split type must be one of {', '.join(SPLIT_TYPES)}")
    if not codec.is_supported(config.content_type):
        raise LaunchError(
            f"content type {config.content_type!r} is not one serve reads: "
            f"{', '.join(codec.SUPPORTED_INPUTS)}"
        )
    kind = codec.media_type(config.content_type)
    if config.split_type == "Line" and kind not in codec.JSONLINES_ALIASES:
        raise LaunchError("--split-type Line sends lines: use --content-type application/jsonlines")
    if config.split_type == "None" and kind in codec.JSONLINES_ALIASES:
        log.debug("JSON lines without splitting: each file is one request of many lines")
    try:
        codec.choose_accept(config.accept, codec.JSON)
    except ServeError as exc:
        raise LaunchError(str(exc)) from None
    if config.batch_strategy is not None and config.batch_strategy not in BATCH_STRATEGIES:
        raise LaunchError(f"batch strategy must be one of {', '.join(BATCH_STRATEGIES)}")
    if config.max_concurrent is not None and config.max_payload_mb is not None:
        product = config.max_concurrent * config.max_payload_mb
        if product > MAX_PAYLOAD_PRODUCT_MB:
            raise LaunchError(
                f"max concurrent transforms x max payload is {product} MB; SageMaker allows "
                f"at most {MAX_PAYLOAD_PRODUCT_MB}"
            )


def model_request(config: ModelConfig) -> dict[str, Any]:
    _check_model(config)
    container: dict[str, Any] = {
        "Image": config.source.image_uri,
        "ModelDataUrl": config.source.model_data_url,
        "Mode": "SingleModel",
    }
    if config.environment:
        container["Environment"] = dict(config.environment)
    request: dict[str, Any] = {
        "ModelName": config.name,
        "PrimaryContainer": container,
        "ExecutionRoleArn": config.source.role_arn,
        "EnableNetworkIsolation": config.network_isolation,
    }
    if config.subnets:
        request["VpcConfig"] = {
            "SecurityGroupIds": list(config.security_group_ids),
            "Subnets": list(config.subnets),
        }
    if config.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in config.tags]
    return request


def deploy_requests(config: EndpointConfig) -> dict[str, dict[str, Any]]:
    """CreateModel, CreateEndpointConfig and CreateEndpoint, all named after the model."""
    if config.instance_count < 1:
        raise LaunchError(f"instance count must be >= 1, got {config.instance_count}")
    name = config.model.name
    tags = [{"Key": k, "Value": v} for k, v in config.model.tags]
    endpoint_config: dict[str, Any] = {
        "EndpointConfigName": name,
        "ProductionVariants": [
            {
                "VariantName": VARIANT,
                "ModelName": name,
                "InstanceType": config.instance_type,
                "InitialInstanceCount": config.instance_count,
                "InitialVariantWeight": 1.0,
            }
        ],
    }
    endpoint: dict[str, Any] = {"EndpointName": name, "EndpointConfigName": name}
    if tags:
        endpoint_config["Tags"] = tags
        endpoint["Tags"] = tags
    return {
        "CreateModel": model_request(config.model),
        "CreateEndpointConfig": endpoint_config,
        "CreateEndpoint": endpoint,
    }


def transform_requests(config: TransformConfig) -> dict[str, dict[str, Any]]:
    """CreateModel, then CreateTransformJob over every object under the input prefix."""
    _check_transform(config)
    if config.instance_count < 1:
        raise LaunchError(f"instance count must be >= 1, got {config.instance_count}")
    name = config.model.name
    job: dict[str, Any] = {
        "TransformJobName": name,
        "ModelName": name,
        "TransformInput": {
            "DataSource": {
                "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": config.input_s3_uri}
            },
            "ContentType": config.content_type,
            "SplitType": config.split_type,
        },
        "TransformOutput": {"S3OutputPath": config.output_s3_uri, "Accept": config.accept},
        "TransformResources": {
            "InstanceType": config.instance_type,
            "InstanceCount": config.instance_count,
        },
    }
    if config.split_type == "Line":
        job["TransformOutput"]["AssembleWith"] = "Line"
    if config.max_concurrent is not None:
        job["MaxConcurrentTransforms"] = config.max_concurrent
    if config.max_payload_mb is not None:
        job["MaxPayloadInMB"] = config.max_payload_mb
    if config.batch_strategy is not None:
        job["BatchStrategy"] = config.batch_strategy
    if config.model.tags:
        job["Tags"] = [{"Key": k, "Value": v} for k, v in config.model.tags]
    return {"CreateModel": model_request(config.model), "CreateTransformJob": job}


def service_errors(operation: str, request: Mapping[str, Any], input_shape: Any) -> list[str]:
    """botocore's own validation, then max/pattern/enum of every field (left to the server)."""
    try:
        validate_parameters(dict(request), input_shape)
    except ParamValidationError as exc:
        return [" ".join(str(exc).split())]
    # model_constraint_errors names paths after CreateTrainingJob; name the real operation.
    return [
        operation + problem.removeprefix("CreateTrainingJob")
        for problem in model_constraint_errors(request, input_shape)
    ]


# --- shell ---------------------------------------------------------------------------------------


def check_with_service_model(requests: Mapping[str, Mapping[str, Any]]) -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    for operation, request in requests.items():
        problems = service_errors(operation, request, model.operation_model(operation).input_shape)
        if problems:
            raise LaunchError(problems[0])


def describe_training_job(sm: Any, name: str) -> ModelSource:
    return source_from_training_job(sm.describe_training_job(TrainingJobName=name))


def create_all(sm: Any, requests: Mapping[str, Mapping[str, Any]]) -> None:
    """Each Create* call in order; botocore's method names are the snake_case operations."""
    for operation, request in requests.items():
        method = re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()
        getattr(sm, method)(**request)
        log.info("%s %s", operation, next(iter(request.values())))


def wait_for(
    describe: Callable[[], Mapping[str, Any]],
    *,
    status_key: str,
    done: frozenset[str],
    poll_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    last = None
    while True:
        description = describe()
        status = description[status_key]
        if status != last:
            log.info("%s", status)
            last = status
        if status in done:
            return description
        sleep(poll_seconds)
