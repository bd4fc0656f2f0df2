"""`python -m launch deploy|transform`: exact requests, local and service-model checks, and the
calls in order against botocore's Stubber (which validates every request against the model)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from launch import cli, deploy_cli
from launch import deploy as dp

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sm-horovod:cpu-0123456789ab"
ROLE = "arn:aws:iam::123456789012:role/SmHorovodTraining"
ARTIFACT = "s3://my-bucket/output/digits-1/output/model.tar.gz"
SOURCE = ["--model-data", ARTIFACT, "--image-uri", IMAGE, "--role-arn", ROLE]


def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert cli.main([*argv, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def test_deploy_dry_run_prints_the_three_requests(capsys: pytest.CaptureFixture[str]) -> None:
    requests = dry_run(
        capsys, "deploy", *SOURCE, "--name", "digits-1", "--env", "SM_SERVE_MAX_BATCH_SIZE=64",
        "--instance-type", "ml.c5.2xlarge", "--instance-count", "2", "--tag", "team=vision",
    )  # fmt: skip
    tags = [{"Key": "team", "Value": "vision"}]
    assert requests == {
        "CreateModel": {
            "ModelName": "digits-1",
            "PrimaryContainer": {
                "Image": IMAGE,
                "ModelDataUrl": ARTIFACT,
                "Mode": "SingleModel",
                "Environment": {"SM_SERVE_MAX_BATCH_SIZE": "64"},
            },
            "ExecutionRoleArn": ROLE,
            "EnableNetworkIsolation": False,
            "Tags": tags,
        },
        "CreateEndpointConfig": {
            "EndpointConfigName": "digits-1",
            "ProductionVariants": [
                {
                    "VariantName": "AllTraffic",
                    "ModelName": "digits-1",
                    "InstanceType": "ml.c5.2xlarge",
                    "InitialInstanceCount": 2,
                    "InitialVariantWeight": 1.0,
                }
            ],
            "Tags": tags,
        },
        "CreateEndpoint": {
            "EndpointName": "digits-1",
            "EndpointConfigName": "digits-1",
            "Tags": tags,
        },
    }


def test_transform_dry_run_over_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    requests = dry_run(
        capsys, "transform", *SOURCE, "--name", "digits-t", "--input", "s3://my-bucket/in/",
        "--output", "s3://my-bucket/out/", "--content-type", "application/jsonlines",
        "--split-type", "Line", "--max-concurrent", "4", "--max-payload-mb", "6",
        "--batch-strategy", "MultiRecord", "--subnet", "subnet-0aaa,subnet-0bbb",
        "--security-group", "sg-0ccc", "--network-isolation",
    )  # fmt: skip
    assert requests["CreateModel"]["VpcConfig"] == {
        "SecurityGroupIds": ["sg-0ccc"],
        "Subnets": ["subnet-0aaa", "subnet-0bbb"],
    }
    assert requests["CreateModel"]["EnableNetworkIsolation"] is True
    assert requests["CreateTransformJob"] == {
        "TransformJobName": "digits-t",
        "ModelName": "digits-t",
        "TransformInput": {
            "DataSource": {
                "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://my-bucket/in/"}
            },
            "ContentType": "application/jsonlines",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": "s3://my-bucket/out/",
            "Accept": "application/json",
            "AssembleWith": "Line",
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
        "MaxConcurrentTransforms": 4,
        "MaxPayloadInMB": 6,
        "BatchStrategy": "MultiRecord",
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["deploy", "--model-data", ARTIFACT], "pass --training-job, or --image-uri, --role-arn"),
        (["deploy", *SOURCE, "--name", "bad_name"], "model name 'bad_name' must be 1-63"),
        (
            ["deploy", "--model-data", "s3://my-bucket/model/1", *SOURCE[2:]],
            "must be a model.tar.gz",
        ),
        (["deploy", *SOURCE, "--instance-type", "ml.fake.xlarge"], "InstanceType is 'ml.fake"),
        (["deploy", *SOURCE, "--env", "1X=2"], "environment variable name '1X'"),
        (
            ["transform", *SOURCE, "--input", "s3://b-1/i", "--output", "s3://b-1/o",
             "--content-type", "text/csv"],
            "content type 'text/csv' is not one serve reads",
        ),
        (
            ["transform", *SOURCE, "--input", "s3://b-1/i", "--output", "s3://b-1/o",
             "--split-type", "Line"],
            "--split-type Line sends lines",
        ),
        (
            ["transform", *SOURCE, "--input", "s3://b-1/i", "--output", "s3://b-1/o",
             "--max-concurrent", "20", "--max-payload-mb", "6"],
            "is 120 MB; SageMaker allows at most 100",
        ),
        (
            ["transform", *SOURCE, "--input", "/local/dir", "--output", "s3://b-1/o"],
            "input '/local/dir' is not an s3://bucket/key URI",
        ),
        (
            ["transform", *SOURCE, "--input", "s3://b-1/i", "--output", "s3://b-1/o",
             "--accept", "text/csv"],
            "cannot answer in 'text/csv'",
        ),
    ],
)  # fmt: skip
def test_mistakes_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    assert message in err
    assert "\n" not in err


COMPLETED_JOB = {
    "TrainingJobName": "digits-1",
    "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/digits-1",
    "TrainingJobStatus": "Completed",
    "SecondaryStatus": "Completed",
    "ModelArtifacts": {"S3ModelArtifacts": ARTIFACT},
    "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
    "RoleArn": ROLE,
    "ResourceConfig": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    "CreationTime": "2026-11-22T00:00:00Z",
}


class _Session:
    def __init__(self, client: Any) -> None:
        self._client = client

    def client(self, name: str) -> Any:
        assert name == "sagemaker"
        return self._client


def _endpoint(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "EndpointName": "ep-1",
        "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep-1",
        "EndpointConfigName": "ep-1",
        "EndpointStatus": status,
        "CreationTime": "2026-11-22T00:00:00Z",
        "LastModifiedTime": "2026-11-22T00:00:00Z",
        **extra,
    }


def _run(stubbed: Any, *argv: str) -> int:
    args = cli._parser().parse_args([*argv, "--poll-seconds", "0"])
    return deploy_cli.cmd_serve(args, lambda _region: _Session(stubbed))


@pytest.mark.usefixtures("fake_aws_credentials")
def test_deploy_from_a_training_job_creates_then_waits_for_in_service() -> None:
    sm = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(sm) as stub:
        stub.add_response("describe_training_job", COMPLETED_JOB, {"TrainingJobName": "digits-1"})
        stub.add_response(
            "create_model",
            {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/ep-1"},
            {
                "ModelName": "ep-1",
                "PrimaryContainer": {
                    "Image": IMAGE,
                    "ModelDataUrl": ARTIFACT,
                    "Mode": "SingleModel",
                },
                "ExecutionRoleArn": ROLE,
                "EnableNetworkIsolation": False,
            },
        )
        stub.add_response(
            "create_endpoint_config",
            {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/ep-1"},
        )
        stub.add_response(
            "create_endpoint",
            {"EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep-1"},
            {"EndpointName": "ep-1", "EndpointConfigName": "ep-1"},
        )
        stub.add_response("describe_endpoint", _endpoint("Creating"), {"EndpointName": "ep-1"})
        stub.add_response("describe_endpoint", _endpoint("InService"), {"EndpointName": "ep-1"})
        assert _run(sm, "deploy", "--training-job", "digits-1", "--name", "ep-1") == 0
        stub.assert_no_pending_responses()


@pytest.mark.usefixtures("fake_aws_credentials")
def test_failed_endpoint_prints_its_failure_reason(capsys: pytest.CaptureFixture[str]) -> None:
    sm = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(sm) as stub:
        stub.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:1:model/ep-1"})
        stub.add_response(
            "create_endpoint_config",
            {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:endpoint-config/ep-1"},
        )
        stub.add_response("create_endpoint", {"EndpointArn": "arn:aws:sagemaker:::endpoint/ep-1"})
        failed = _endpoint("Failed", FailureReason="The primary container did not pass\nthe ping")
        stub.add_response("describe_endpoint", failed)
        assert _run(sm, "deploy", *SOURCE, "--name", "ep-1") == 1
    assert capsys.readouterr().err == ("error: ep-1: The primary container did not pass the ping\n")


@pytest.mark.usefixtures("fake_aws_credentials")
def test_transform_creates_the_model_and_the_job_then_waits() -> None:
    sm = boto3.client("sagemaker", region_name="us-east-1")
    job = {
        "TransformJobName": "t-1",
        "TransformJobArn": "arn:aws:sagemaker:us-east-1:1:transform-job/t-1",
        "ModelName": "t-1",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b-1/i"}}
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
        "CreationTime": "2026-11-22T00:00:00Z",
    }
    with Stubber(sm) as stub:
        stub.add_response("describe_training_job", COMPLETED_JOB)
        stub.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:1:model/t-1"})
        stub.add_response(
            "create_transform_job",
            {"TransformJobArn": job["TransformJobArn"]},
            {
                "TransformJobName": "t-1",
                "ModelName": "t-1",
                "TransformInput": {
                    "DataSource": {
                        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b-1/i"}
                    },
                    "ContentType": "image/png",
                    "SplitType": "None",
                },
                "TransformOutput": {"S3OutputPath": "s3://b-1/o", "Accept": "application/json"},
                "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
            },
        )
        stub.add_response("describe_transform_job", {**job, "TransformJobStatus": "InProgress"})
        stub.add_response("describe_transform_job", {**job, "TransformJobStatus": "Completed"})
        code = _run(
            sm, "transform", "--training-job", "digits-1", "--name", "t-1",
            "--input", "s3://b-1/i", "--output", "s3://b-1/o",
        )  # fmt: skip
        assert code == 0
        stub.assert_no_pending_responses()


def test_an_unfinished_training_job_has_no_model() -> None:
    with pytest.raises(dp.LaunchError, match="training job digits-1 is InProgress, not Completed"):
        dp.source_from_training_job({**COMPLETED_JOB, "TrainingJobStatus": "InProgress"})
    source = dp.source_from_training_job(COMPLETED_JOB)
    assert source == dp.ModelSource(ARTIFACT, IMAGE, ROLE)
