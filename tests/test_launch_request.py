"""The pure CreateTrainingJob core: exact dicts, every local check, and the service model."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from botocore.validate import validate_parameters

from launch import request as rq
from launch.cli import sagemaker_input_shape, training_instance_types
from launch.errors import LaunchError
from model.logline import metric_definitions

# botocore needs credentials and a region even for stubbed and moto calls.
pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

SEED = "5e" * 32
ROLE = "arn:aws:iam::123456789012:role/SmHorovodTraining"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sm-horovod:cpu-0123456789ab"
METRICS = tuple((d["Name"], d["Regex"]) for d in metric_definitions())
SCRIPT_MODE = (
    ("sagemaker_program", "train.py"),
    ("sagemaker_submit_directory", "s3://b/src.tar.gz"),
)

BASE = rq.TrainConfig(
    job_name="hvd-1",
    image_uri=IMAGE,
    role_arn=ROLE,
    output_s3_uri="s3://bucket/output",
    ssh_seed=SEED,
)

FULL = dataclasses.replace(
    BASE,
    job_name="hvd-full-2",
    instance_type="ml.p3.16xlarge",
    instance_count=4,
    volume_size_gb=200,
    image_uri=IMAGE.replace(":cpu-", ":gpu-"),
    channels=(
        rq.parse_channel("train=s3://bucket/train?distribution=ShardedByS3Key&mode=FastFile"),
        rq.parse_channel("shared=efs://fs-0123abcd/datasets/mnist"),
        rq.parse_channel("fast=fsx://fs-0abc12345678/abcdefgh/imagenet?access=rw"),
    ),
    hyperparameters=(
        ("epochs", "3"),
        ("ranks_per_host", "8"),
        ("host_wait_timeout", "300"),
        ("sigterm_grace_seconds", "30"),
    ),
    metric_definitions=METRICS,
    checkpoint_s3_uri="s3://bucket/checkpoints/hvd-full-2",
    spot=True,
    max_runtime_seconds=3600,
    max_wait_seconds=7200,
    max_retry_attempts=3,
    subnets=("subnet-0a", "subnet-0b"),
    security_group_ids=("sg-0123",),
    inter_container_encryption=True,
    network_isolation=True,
    environment=(("NCCL_DEBUG", "INFO"),),
    tags=(("project", "sm-horovod"),),
    fsx_mount_name="abcdefgh",
    source=rq.SourceBundle(
        program="train.py", s3_uri="s3://bucket/code/hvd-full-2/source/sourcedir.tar.gz"
    ),
)

BASE_REQUEST: dict[str, Any] = {
    "TrainingJobName": "hvd-1",
    "AlgorithmSpecification": {
        "TrainingImage": IMAGE,
        "TrainingInputMode": "File",
        "EnableSageMakerMetricsTimeSeries": True,
    },
    "RoleArn": ROLE,
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
    "ResourceConfig": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    "HyperParameters": {},
    "Environment": {"SM_HVD_JOB_SECRET": SEED},
    "EnableNetworkIsolation": False,
    "EnableInterContainerTrafficEncryption": False,
    "EnableManagedSpotTraining": False,
}

FULL_REQUEST: dict[str, Any] = {
    "TrainingJobName": "hvd-full-2",
    "AlgorithmSpecification": {
        "TrainingImage": IMAGE.replace(":cpu-", ":gpu-"),
        "TrainingInputMode": "File",
        "EnableSageMakerMetricsTimeSeries": True,
        "MetricDefinitions": [{"Name": n, "Regex": r} for n, r in METRICS],
    },
    "RoleArn": ROLE,
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
    "ResourceConfig": {
        "InstanceType": "ml.p3.16xlarge",
        "InstanceCount": 4,
        "VolumeSizeInGB": 200,
    },
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
    "HyperParameters": {
        "epochs": "3",
        "ranks_per_host": "8",
        "host_wait_timeout": "300",
        "sigterm_grace_seconds": "30",
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": "/opt/ml/input/data/code/sourcedir.tar.gz",
    },
    "Environment": {"NCCL_DEBUG": "INFO", "SM_HVD_JOB_SECRET": SEED},
    "EnableNetworkIsolation": True,
    "EnableInterContainerTrafficEncryption": True,
    "EnableManagedSpotTraining": True,
    "InputDataConfig": [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://bucket/train",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
            "InputMode": "FastFile",
        },
        {
            "ChannelName": "shared",
            "DataSource": {
                "FileSystemDataSource": {
                    "FileSystemId": "fs-0123abcd",
                    "FileSystemAccessMode": "ro",
                    "FileSystemType": "EFS",
                    "DirectoryPath": "/datasets/mnist",
                }
            },
        },
        {
            "ChannelName": "fast",
            "DataSource": {
                "FileSystemDataSource": {
                    "FileSystemId": "fs-0abc12345678",
                    "FileSystemAccessMode": "rw",
                    "FileSystemType": "FSxLustre",
                    "DirectoryPath": "/abcdefgh/imagenet",
                }
            },
        },
        {
            "ChannelName": "code",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://bucket/code/hvd-full-2/source/sourcedir.tar.gz",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
        },
    ],
    "VpcConfig": {"SecurityGroupIds": ["sg-0123"], "Subnets": ["subnet-0a", "subnet-0b"]},
    "CheckpointConfig": {
        "S3Uri": "s3://bucket/checkpoints/hvd-full-2",
        "LocalPath": "/opt/ml/checkpoints",
    },
    "RetryStrategy": {"MaximumRetryAttempts": 3},
    "Tags": [{"Key": "project", "Value": "sm-horovod"}],
}

SCRIPT_NO_ISOLATION = dataclasses.replace(
    BASE,
    source=rq.SourceBundle(program="sub/train.py", s3_uri="s3://b/p/hvd-1/source/sourcedir.tar.gz"),
    channels=(rq.parse_channel("stack-efs=efs:///data?access=rw"),),
    efs_id="fs-00000000deadbeef",
    subnets=("subnet-1",),
    security_group_ids=("sg-1", "sg-2", "sg-3", "sg-4", "sg-5"),
)

# Every kind of config the launcher builds, for the service-model tests.
# A heterogeneous cluster: CPU hosts serve data to the GPU group that trains (issue 29).
HETERO = dataclasses.replace(
    BASE,
    image_uri=IMAGE.replace(":cpu-", ":gpu-"),
    instance_groups=(
        rq.parse_instance_group("data_group=ml.c5.18xlarge:2"),
        rq.parse_instance_group("dnn_group=ml.p4d.24xlarge:2"),
    ),
    distribution_group="dnn_group",
    hyperparameters=(("sagemaker_mpi_enabled", "true"),),
    source=rq.SourceBundle("launcher.py", "s3://b/code/hvd-1/source/sourcedir.tar.gz"),
)

CONFIGS = {
    "base": BASE,
    "hetero": HETERO,
    "full": FULL,
    "script": SCRIPT_NO_ISOLATION,
    "spot-default-wait": dataclasses.replace(
        BASE, spot=True, checkpoint_s3_uri="s3://b/c", max_retry_attempts=30
    ),
    "pipe": dataclasses.replace(
        BASE, input_mode="Pipe", channels=(rq.parse_channel("train=s3://b/t"),)
    ),
}


def test_base_request_is_exact() -> None:
    assert rq.build_request(BASE) == BASE_REQUEST


def test_full_request_is_exact() -> None:
    assert rq.build_request(FULL, instance_types=training_instance_types()) == FULL_REQUEST


def test_script_mode_without_isolation_downloads_from_s3_and_uses_stack_efs() -> None:
    request = rq.build_request(SCRIPT_NO_ISOLATION)
    assert request["HyperParameters"] == {
        "sagemaker_program": "sub/train.py",
        "sagemaker_submit_directory": "s3://b/p/hvd-1/source/sourcedir.tar.gz",
    }
    assert request["InputDataConfig"] == [
        {
            "ChannelName": "stack-efs",
            "DataSource": {
                "FileSystemDataSource": {
                    "FileSystemId": "fs-00000000deadbeef",
                    "FileSystemAccessMode": "rw",
                    "FileSystemType": "EFS",
                    "DirectoryPath": "/data",
                }
            },
        }
    ]


def test_instance_groups_replace_type_and_count() -> None:
    request = rq.build_request(HETERO, instance_types=training_instance_types())
    assert request["ResourceConfig"] == {
        "InstanceGroups": [
            {
                "InstanceGroupName": "data_group",
                "InstanceType": "ml.c5.18xlarge",
                "InstanceCount": 2,
            },
            {
                "InstanceGroupName": "dnn_group",
                "InstanceType": "ml.p4d.24xlarge",
                "InstanceCount": 2,
            },
        ],
        "VolumeSizeInGB": 50,
    }
    # As the SDK encodes distribution={"mpi": ..., "instance_groups": [dnn_group]}.
    assert request["HyperParameters"] == {
        "sagemaker_mpi_enabled": "true",
        "sagemaker_distribution_instance_groups": '["dnn_group"]',
        "sagemaker_program": "launcher.py",
        "sagemaker_submit_directory": "s3://b/code/hvd-1/source/sourcedir.tar.gz",
    }
    # The GPU image fits the group that trains: no warning for the CPU data group.
    assert rq.warnings(HETERO) == []


def test_a_per_host_job_over_groups_needs_no_distribution_group() -> None:
    config = dataclasses.replace(
        HETERO, distribution_group=None, hyperparameters=(("sagemaker_mpi_enabled", "false"),)
    )
    request = rq.build_request(config, instance_types=training_instance_types())
    assert "sagemaker_distribution_instance_groups" not in request["HyperParameters"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dnn=ml.p4d.24xlarge:2", rq.InstanceGroupSpec("dnn", "ml.p4d.24xlarge", 2)),
        ("a=b=ml.c5.xlarge:1", rq.InstanceGroupSpec("a", "b=ml.c5.xlarge", 1)),
    ],
)
def test_parse_instance_group(text: str, expected: rq.InstanceGroupSpec) -> None:
    assert rq.parse_instance_group(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dnn", "--instance-group must be NAME=TYPE:COUNT, got 'dnn'"),
        (
            "dnn=ml.p4d.24xlarge",
            "--instance-group must be NAME=TYPE:COUNT, got 'dnn=ml.p4d.24xlarge'",
        ),
        ("=ml.c5.xlarge:1", "--instance-group must be NAME=TYPE:COUNT, got '=ml.c5.xlarge:1'"),
        ("dnn=:2", "--instance-group must be NAME=TYPE:COUNT, got 'dnn=:2'"),
        (
            "dnn=ml.c5.xlarge:two",
            "--instance-group 'dnn=ml.c5.xlarge:two': count 'two' is not a whole number",
        ),
    ],
)
def test_parse_instance_group_errors(text: str, message: str) -> None:
    with pytest.raises(LaunchError) as info:
        rq.parse_instance_group(text)
    assert str(info.value) == message


def _groups(*texts: str) -> tuple[rq.InstanceGroupSpec, ...]:
    return tuple(rq.parse_instance_group(text) for text in texts)


# (changes to HETERO, the exact one-line message)
INVALID_GROUPS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-distribution-group": (
        {"distribution_group": "gpu"},
        "--distribution-group 'gpu' is not one of the instance groups (data_group, dnn_group)",
    ),
    "distribution-group-without-groups": (
        {"instance_groups": ()},
        "--distribution-group needs the groups (--instance-group)",
    ),
    "hyperparameter-without-groups": (
        {
            "instance_groups": (),
            "distribution_group": None,
            "hyperparameters": (("sagemaker_distribution_instance_groups", '["dnn"]'),),
        },
        "hyperparameter sagemaker_distribution_instance_groups names an instance group: pass "
        "the groups (--instance-group)",
    ),
    "both-flag-and-hyperparameter": (
        {"hyperparameters": (("sagemaker_distribution_instance_groups", '["dnn_group"]'),)},
        "hyperparameter sagemaker_distribution_instance_groups is set by --distribution-group; "
        "do not pass it too",
    ),
    "two-distribution-groups": (
        {
            "distribution_group": None,
            "hyperparameters": (
                ("sagemaker_distribution_instance_groups", '["dnn_group","data_group"]'),
            ),
        },
        'hyperparameter sagemaker_distribution_instance_groups=["dnn_group","data_group"] names '
        "2 groups: exactly one instance group can be distributed",
    ),
    "several-groups-no-choice": (
        {"distribution_group": None},
        "2 instance groups (data_group, dnn_group) and no hyperparameter "
        "sagemaker_distribution_instance_groups: name the one group that runs the mpi program "
        "(the SDK's distribution={..., 'instance_groups': [group]}, or launch's "
        "--distribution-group)",
    ),
    "duplicate-group": (
        {"instance_groups": _groups("dnn_group=ml.c5.xlarge:1", "dnn_group=ml.c5.xlarge:1")},
        "instance group 'dnn_group' is given twice",
    ),
    "group-type": (
        {"instance_groups": _groups("data_group=ml.c5.huge:1", "dnn_group=ml.c5.xlarge:1")},
        "instance group 'data_group': 'ml.c5.huge' is not a training instance type",
    ),
    "group-count": (
        {"instance_groups": _groups("data_group=ml.c5.xlarge:0", "dnn_group=ml.c5.xlarge:1")},
        "instance group 'data_group': count must be >= 1, got 0",
    ),
    "group-name-length": (
        {
            "instance_groups": _groups(f"{'g' * 65}=ml.c5.xlarge:1", "dnn_group=ml.c5.xlarge:1"),
        },
        f"instance group name {'g' * 65!r} must be 1-64 characters",
    ),
    "six-groups": (
        {"instance_groups": _groups(*(f"g{i}=ml.c5.xlarge:1" for i in range(6)))},
        "at most 5 instance groups are allowed",
    ),
    "parameter-servers-on-a-one-instance-group": (
        {
            "instance_groups": _groups("data_group=ml.c5.xlarge:3", "dnn_group=ml.c5.xlarge:1"),
            "hyperparameters": (("sagemaker_parameter_server_enabled", "true"),),
        },
        "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1): use "
        "sagemaker_multi_worker_mirrored_strategy_enabled or no distribution on one host",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_GROUPS))
def test_instance_group_validation_message(case: str) -> None:
    changes, message = INVALID_GROUPS[case]
    config = dataclasses.replace(HETERO, **changes)
    with pytest.raises(LaunchError) as info:
        rq.build_request(config, instance_types=training_instance_types())
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_spot_defaults_max_wait_to_twice_the_runtime() -> None:
    request = rq.build_request(CONFIGS["spot-default-wait"])
    assert request["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 86400,
        "MaxWaitTimeInSeconds": 172800,
    }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_request_passes_the_service_model(name: str) -> None:
    request = rq.build_request(CONFIGS[name], instance_types=training_instance_types())
    shape = sagemaker_input_shape()
    validate_parameters(request, shape)
    assert rq.model_constraint_errors(request, shape) == []
    client = boto3.client("sagemaker", region_name="us-east-1")
    arn = f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{request['TrainingJobName']}"
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": arn}, expected_params=request)
        assert client.create_training_job(**request)["TrainingJobArn"] == arn
        stub.assert_no_pending_responses()


def test_redact_hides_only_the_seed_and_leaves_the_request_alone() -> None:
    request = rq.build_request(FULL)
    shown = rq.redact(request)
    assert shown["Environment"] == {"NCCL_DEBUG": "INFO", "SM_HVD_JOB_SECRET": "<redacted>"}
    assert SEED not in json.dumps(shown)
    assert request["Environment"]["SM_HVD_JOB_SECRET"] == SEED
    assert {k: v for k, v in shown.items() if k != "Environment"} == {
        k: v for k, v in request.items() if k != "Environment"
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train=s3://b/p", rq.Channel("train", rq.S3Source("s3://b/p"))),
        (
            "t=s3://b/p/?mode=Pipe&distribution=ShardedByS3Key",
            rq.Channel("t", rq.S3Source("s3://b/p/", "ShardedByS3Key"), "Pipe"),
        ),
        (
            "e=efs://fs-0123abcd",
            rq.Channel("e", rq.FileSystemSource("EFS", "fs-0123abcd", "/")),
        ),
        (
            "f=fsx:///mnt/x?access=rw",
            rq.Channel("f", rq.FileSystemSource("FSxLustre", "", "/mnt/x", "rw")),
        ),
    ],
)
def test_parse_channel(text: str, expected: rq.Channel) -> None:
    assert rq.parse_channel(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train", "--channel must be KEY=VALUE, got 'train'"),
        ("t=http://x/y", "channel 't': 'http://x/y' must start with s3://, efs:// or fsx://"),
        ("t=s3:///p", "channel 't': 's3:///p' has no bucket"),
        ("t=s3://b/p?shard=1", "channel 's3://b/p?shard=1': unknown option 'shard'"),
        ("t=fsx://fs-0123abcd", "must be fsx://fs-id/mountname/path"),
        ("t=s3://b/p?mode", "channel 't': 's3://b/p?mode' is not a valid URI (bad query field"),
        ("t=s3://[b/p", "channel 't': 's3://[b/p' is not a valid URI (Invalid IPv6 URL)"),
    ],
)
def test_parse_channel_errors(text: str, message: str) -> None:
    with pytest.raises(LaunchError) as info:
        rq.parse_channel(text)
    assert message in str(info.value)


def _ch(text: str) -> tuple[rq.Channel, ...]:
    return (rq.parse_channel(text),)


VPC: dict[str, Any] = {"subnets": ("subnet-1",), "security_group_ids": ("sg-1",)}

# (changes to BASE, the exact one-line message)
INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "name-pattern": (
        {"job_name": "bad_name"},
        "job name 'bad_name' must be letters, digits and single or repeated hyphens, "
        "starting and ending with a letter or digit",
    ),
    "name-trailing-hyphen": (
        {"job_name": "job-"},
        "job name 'job-' must be letters, digits and single or repeated hyphens, "
        "starting and ending with a letter or digit",
    ),
    "name-length": (
        {"job_name": "a" * 64},
        f"job name {'a' * 64!r} is 64 characters; at most 63",
    ),
    "role": (
        {"role_arn": "SmRole"},
        "role 'SmRole' is not an IAM role ARN (--role-arn or --stack)",
    ),
    "instance-type": (
        {"instance_type": "ml.c5.huge"},
        "instance type 'ml.c5.huge' is not a training instance type",
    ),
    "instance-count": ({"instance_count": 0}, "instance count must be >= 1, got 0"),
    "input-mode": (
        {"input_mode": "Stream"},
        "input mode must be one of File, Pipe, FastFile, got 'Stream'",
    ),
    "channel-input-mode": (
        {"channels": _ch("t=s3://b/p?mode=file")},
        "channel 't': input mode must be one of File, Pipe, FastFile, got 'file'",
    ),
    "distribution": (
        {"channels": _ch("t=s3://b/p?distribution=Sharded")},
        "channel 't': distribution must be one of FullyReplicated, ShardedByS3Key, got 'Sharded'",
    ),
    "output": (
        {"output_s3_uri": "/tmp/out"},
        "output path must be an s3://bucket/prefix URI, got '/tmp/out'",
    ),
    "channel-name-chars": (
        {"channels": _ch("my data=s3://b/p")},
        "channel name 'my data' must be 1-64 of A-Z a-z 0-9 . - _",
    ),
    "channel-name-length": (
        {"channels": _ch(f"{'c' * 65}=s3://b/p")},
        f"channel name {'c' * 65!r} must be 1-64 of A-Z a-z 0-9 . - _",
    ),
    "channel-twice": (
        {"channels": _ch("t=s3://b/p") * 2},
        "channel 't' is given twice",
    ),
    "fs-needs-vpc": (
        {"channels": _ch("e=efs://fs-0123abcd/d")},
        "channel 'e': EFS channels need a VPC (--subnet and --security-group, or --stack)",
    ),
    "fs-id": (
        {"channels": _ch("e=efs://fs-XYZ/d"), **VPC},
        "channel 'e': file system ID 'fs-XYZ' is not fs-<hex>",
    ),
    "fs-id-missing": (
        {"channels": _ch("e=efs:///d"), **VPC},
        "channel 'e': no EFS file system ID in the URI and none from --stack",
    ),
    "fs-access": (
        {"channels": _ch("e=efs://fs-0123abcd/d?access=wo"), **VPC},
        "channel 'e': access must be ro or rw, got 'wo'",
    ),
    "fs-mode": (
        {"channels": _ch("e=efs://fs-0123abcd/d?mode=FastFile"), **VPC},
        "channel 'e': EFS channels need input mode File",
    ),
    "fs-path-normalized": (
        {"channels": _ch("e=efs://fs-0123abcd/d/../x"), **VPC},
        "channel 'e': directory path '/d/../x' must be absolute and normalized",
    ),
    "fsx-mount-unknown": (
        {"channels": _ch("f=fsx://fs-0123abcd/mnt/x"), **VPC},
        "channel 'f': FSx channels need the file system's mount name (--fsx-mount-name or --stack)",
    ),
    "fsx-mount-wrong": (
        {"channels": _ch("f=fsx://fs-0123abcd/other/x"), "fsx_mount_name": "mnt", **VPC},
        "channel 'f': FSx directory path '/other/x' must start with /mnt "
        "(the file system's mount name)",
    ),
    "fsx-mount-prefix-only": (
        {"channels": _ch("f=fsx://fs-0123abcd/mntx/x"), "fsx_mount_name": "mnt", **VPC},
        "channel 'f': FSx directory path '/mntx/x' must start with /mnt "
        "(the file system's mount name)",
    ),
    "too-many-sgs": (
        {"subnets": ("subnet-1",), "security_group_ids": tuple(f"sg-{i}" for i in range(6))},
        "at most 5 security groups are allowed, got 6",
    ),
    "vpc-half": ({"subnets": ("subnet-1",)}, "a VPC needs both --subnet and --security-group"),
    "spot-needs-checkpoints": (
        {"spot": True},
        "managed spot training needs checkpoints (--checkpoint-s3-uri)",
    ),
    "spot-wait-short": (
        {
            "spot": True,
            "checkpoint_s3_uri": "s3://b/c",
            "max_runtime_seconds": 3600,
            "max_wait_seconds": 600,
        },
        "max wait (600s) must be >= max runtime (3600s) for managed spot training",
    ),
    "wait-without-spot": (
        {"max_wait_seconds": 600},
        "max wait is only for managed spot training (--spot)",
    ),
    "retries": ({"max_retry_attempts": 31}, "max retry attempts must be 1-30, got 31"),
    "ranks-per-host-int": (
        {"hyperparameters": (("ranks_per_host", "two"),)},
        "hyperparameter ranks_per_host='two' is not a positive integer",
    ),
    "ranks-per-host-positive": (
        {"hyperparameters": (("ranks_per_host", "0"),)},
        "hyperparameter ranks_per_host='0' is not a positive integer",
    ),
    "host-wait-timeout": (
        {"hyperparameters": (("host_wait_timeout", "soon"),)},
        "hyperparameter host_wait_timeout='soon' is not a positive number of seconds",
    ),
    "sigterm-grace": (
        {"hyperparameters": (("sigterm_grace_seconds", "-1"),)},
        "hyperparameter sigterm_grace_seconds='-1' is not a positive number of seconds",
    ),
    "hp-twice": (
        {"hyperparameters": (("epochs", "1"), ("epochs", "2"))},
        "hyperparameter epochs is given twice",
    ),
    "program-alone": (
        {"hyperparameters": (("sagemaker_program", "train.py"),)},
        "hyperparameters sagemaker_program and sagemaker_submit_directory go together",
    ),
    "program-and-script": (
        {
            "hyperparameters": (("sagemaker_program", "x.py"),),
            "source": rq.SourceBundle("train.py", "s3://b/s.tar.gz"),
        },
        "hyperparameter sagemaker_program is set by --script; do not pass it too",
    ),
    "metric-no-group": (
        {"metric_definitions": (("loss", r"loss=\d+"),)},
        r"metric 'loss': regex 'loss=\\d+' must have exactly one group, has 0",
    ),
    "metric-two-groups": (
        {"metric_definitions": (("loss", r"(loss)=(\d+)"),)},
        r"metric 'loss': regex '(loss)=(\\d+)' must have exactly one group, has 2",
    ),
    "metric-bad-regex": (
        {"metric_definitions": (("loss", "loss=(["),)},
        "metric 'loss': regex 'loss=([' does not compile: unterminated character set at position 6",
    ),
    "seed-in-env": (
        {"environment": (("SM_HVD_SSH_SEED", "x"),)},
        "SM_HVD_SSH_SEED is set by the launcher, fresh for each job",
    ),
    "secret-in-env": (
        {"environment": (("SM_HVD_JOB_SECRET", "x"),)},
        "SM_HVD_JOB_SECRET is set by the launcher, fresh for each job",
    ),
    "env-name": (
        {"environment": (("1X", "x"),)},
        "environment variable name '1X' is not [A-Za-z_][A-Za-z0-9_]*",
    ),
    "seed": ({"ssh_seed": "short"}, "the ssh seed must be 32 random bytes as 64 hex digits"),
    "parameter-servers-on-one-instance": (
        {
            "hyperparameters": (("sagemaker_parameter_server_enabled", "true"),),
            "source": rq.SourceBundle("train.py", "s3://b/s.tar.gz"),
        },
        "sagemaker_parameter_server_enabled=true needs at least 2 hosts (got 1): use "
        "sagemaker_multi_worker_mirrored_strategy_enabled or no distribution on one host",
    ),
    "parameter-servers-with-the-built-in-model": (
        {
            "hyperparameters": (("sagemaker_parameter_server_enabled", "true"),),
            "instance_count": 2,
        },
        "sagemaker_parameter_server_enabled=true: the built-in model trains with Horovod or "
        "sagemaker_multi_worker_mirrored_strategy_enabled; parameter servers need your own "
        "script (sagemaker_program)",
    ),
    "torchrun-with-the-built-in-model": (
        {
            "hyperparameters": (("sagemaker_torch_distributed_enabled", "true"),),
            "instance_count": 2,
        },
        "sagemaker_torch_distributed_enabled=true: the built-in model is TensorFlow; torchrun "
        "runs your own script (sagemaker_program)",
    ),
}


def test_torchrun_with_a_script_is_accepted() -> None:
    # The launcher cannot know the image: the entry point refuses torchrun in a TensorFlow one.
    config = dataclasses.replace(
        BASE,
        hyperparameters=(("sagemaker_torch_distributed_enabled", "true"),),
        source=rq.SourceBundle("train.py", "s3://b/s.tar.gz"),
        instance_count=2,
    )
    request = rq.build_request(config, instance_types=training_instance_types())
    assert request["HyperParameters"]["sagemaker_torch_distributed_enabled"] == "true"


@pytest.mark.parametrize("case", sorted(INVALID))
def test_local_validation_message(case: str) -> None:
    changes, message = INVALID[case]
    config = dataclasses.replace(BASE, **changes)
    with pytest.raises(LaunchError) as info:
        rq.build_request(config, instance_types=training_instance_types())
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_fsx_path_equal_to_the_mount_is_fine() -> None:
    config = dataclasses.replace(
        BASE, channels=_ch("f=fsx://fs-0123abcd/mnt"), fsx_mount_name="mnt", **VPC
    )
    source = rq.build_request(config)["InputDataConfig"][0]["DataSource"]
    assert source["FileSystemDataSource"]["DirectoryPath"] == "/mnt"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            # Script mode: a user's script takes any hyperparameter the model would refuse.
            {"hyperparameters": (*SCRIPT_MODE, ("note", "x" * 2501))},
            "CreateTrainingJob.HyperParameters['note'] is 2501 characters; at most 2500",
        ),
        (
            {"environment": (("LONG", "y" * 513),)},
            "CreateTrainingJob.Environment['LONG'] is 513 characters; at most 512",
        ),
        (
            {"tags": tuple((f"k{i}", "v") for i in range(51))},
            "CreateTrainingJob.Tags has 51 entries; at most 50",
        ),
        (
            {"image_uri": "x" * 256},
            "CreateTrainingJob.AlgorithmSpecification.TrainingImage is 256 characters; at most 255",
        ),
    ],
)
def test_model_constraints_catch_what_botocore_leaves_to_the_server(
    changes: dict[str, Any], problem: str
) -> None:
    request = rq.build_request(dataclasses.replace(BASE, **changes))
    shape = sagemaker_input_shape()
    validate_parameters(request, shape)  # botocore itself lets these through
    assert rq.model_constraint_errors(request, shape) == [problem]


def test_model_constraints_check_enums() -> None:
    request = {**rq.build_request(BASE), "ResourceConfig": {"InstanceType": "ml.nope"}}
    assert rq.model_constraint_errors(request, sagemaker_input_shape()) == [
        "CreateTrainingJob.ResourceConfig.InstanceType is 'ml.nope', not one of the "
        f"{len(training_instance_types())} values the API accepts"
    ]


def test_warnings() -> None:
    assert rq.warnings(BASE) == []
    notes = rq.warnings(
        dataclasses.replace(
            BASE,
            network_isolation=True,
            instance_type="ml.g5.xlarge",
            spot=True,
            checkpoint_s3_uri="s3://b/c",
        )
    )
    assert len(notes) == 3
    assert notes[0].startswith("network isolation: the container gets no network")
    assert "cannot read or write S3" in notes[0]
    assert "CloudWatch" in notes[0]
    assert notes[1] == f"GPU instance ml.g5.xlarge with the CPU image {IMAGE}"
    assert notes[2].startswith("managed spot without --max-retries")


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.job_name = "other"  # type: ignore[misc]
