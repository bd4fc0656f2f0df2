"""The train shell and CLI: --dry-run, --stack (moto CloudFormation), script-mode upload,
job creation, log streaming and failure reporting. No network: moto and Stubber only."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from launch import cli
from launch import train as train_mod
from launch.errors import LaunchError
from launch.gitsha import git_sha

# botocore needs credentials and a region even for stubbed and moto calls.
pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

REPO = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/SmHorovodTraining"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sm-horovod:cpu-0123456789ab"
REQUIRED = ["--image-uri", IMAGE, "--role-arn", ROLE, "--output-s3-uri", "s3://b/out"]

OUTPUTS = {
    "TrainingSubnetIds": "subnet-0aaa, subnet-0bbb",
    "TrainingSecurityGroupId": "sg-0ccc",
    "EfsFileSystemId": "fs-0123abcd",
    "FsxFileSystemId": "fs-0fedcba987654321",
    "FsxMountName": "abcdef12",
    "TrainingRoleArn": ROLE,
    "NotebookRoleArn": "arn:aws:iam::123456789012:role/SmHorovodNotebook",
}

STACK_TEMPLATE = {
    "AWSTemplateFormatVersion": "2010-09-09",
    "Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "hvd-b"}}},
    "Outputs": {
        **{key: {"Value": value} for key, value in OUTPUTS.items()},
        "BucketName": {"Value": {"Ref": "Bucket"}},
    },
}


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def stack(aws: None) -> str:
    cfn = boto3.client("cloudformation", region_name=REGION)
    cfn.create_stack(StackName="hvd", TemplateBody=json.dumps(STACK_TEMPLATE))
    return "hvd"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_request_with_the_seed_redacted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_main(["train", "--dry-run", "--job-name", "j-1", *REQUIRED], capsys)
    assert code == 0, err
    request = json.loads(out)
    assert request["TrainingJobName"] == "j-1"
    assert request["Environment"] == {"SM_HVD_JOB_SECRET": "<redacted>"}
    assert "CheckpointConfig" not in request
    names = [d["Name"] for d in request["AlgorithmSpecification"]["MetricDefinitions"]]
    assert names[:2] == ["epoch", "train:loss"]
    assert not re.search(r"[0-9a-f]{64}", out + err)


def test_dry_run_needs_no_aws_at_all() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, "-m", "launch", "train", "--dry-run", *REQUIRED],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["AlgorithmSpecification"]["TrainingImage"] == IMAGE


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--job-name", "bad_name"], "error: job name 'bad_name' must be letters"),
        (["--channel", "x=ftp://h/p"], "error: channel 'x': 'ftp://h/p' must start with s3://"),
        (["--spot"], "error: managed spot training needs checkpoints (--checkpoint-s3-uri)"),
        (["--instance-type", "ml.c5.mega"], "error: instance type 'ml.c5.mega' is not"),
        (["--hp", "ranks_per_host=0"], "error: hyperparameter ranks_per_host='0' is not a"),
        (["--hp", "epochs=ten"], "error: hyperparameter epochs='ten' is not an integer"),
        (["--hp", "novalue"], "error: --hp must be KEY=VALUE, got 'novalue'"),
        (["--script", "train.py"], "error: --script and --source-dir go together"),
        (
            [
                *("--hp", "sagemaker_program=train.py"),
                *("--hp", "sagemaker_submit_directory=s3://bucket/src.tar.gz"),
                *("--hp", "k=" + "v" * 2501),
            ],
            "error: CreateTrainingJob.HyperParameters['k'] is 2501 characters; at most 2500",
        ),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["train", "--dry-run", *REQUIRED, *extra], capsys)
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert lines[0].startswith(message)
    assert "Traceback" not in err


def test_dry_run_with_instance_groups(capsys: pytest.CaptureFixture[str]) -> None:
    groups = [
        *("--instance-group", "data_group=ml.c5.xlarge:2"),
        *("--instance-group", "dnn_group=ml.g5.xlarge:2"),
        *("--distribution-group", "dnn_group"),
    ]
    code, out, err = run_main(["train", "--dry-run", *REQUIRED, *groups], capsys)
    assert code == 0, err
    request = json.loads(out)
    assert request["ResourceConfig"] == {
        "InstanceGroups": [
            {"InstanceGroupName": "data_group", "InstanceType": "ml.c5.xlarge", "InstanceCount": 2},
            {"InstanceGroupName": "dnn_group", "InstanceType": "ml.g5.xlarge", "InstanceCount": 2},
        ],
        "VolumeSizeInGB": 50,
    }
    assert request["HyperParameters"]["sagemaker_distribution_instance_groups"] == '["dnn_group"]'


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--instance-group", "a=ml.c5.xlarge:1", "--instance-type", "ml.c5.xlarge"],
            "error: --instance-group replaces --instance-type and --instance-count",
        ),
        (
            ["--instance-group", "a=ml.c5.xlarge:1", "--instance-count", "2"],
            "error: --instance-group replaces --instance-type and --instance-count",
        ),
        (["--instance-group", "a:1"], "error: --instance-group must be NAME=TYPE:COUNT"),
        (
            ["--instance-group", "a=ml.c5.xlarge:1", "--distribution-group", "b"],
            "error: --distribution-group 'b' is not one of the instance groups (a)",
        ),
        (
            ["--instance-group", "a=ml.c5.xlarge:1", "--instance-group", "b=ml.c5.xlarge:1"],
            "error: 2 instance groups (a, b) and no hyperparameter",
        ),
    ],
)
def test_instance_group_errors_are_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["train", "--dry-run", *REQUIRED, *extra], capsys)
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert lines[0].startswith(message)


def test_missing_output_and_role(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["train", "--dry-run", "--image-uri", IMAGE], capsys)
    assert code == 2
    assert err.strip().endswith("error: --output-s3-uri is required (or --stack with a bucket)")


def test_stack_outputs_fill_role_vpc_file_systems_and_bucket(
    stack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    defaults = train_mod.lookup_stack(boto3.client("cloudformation", region_name=REGION), stack)
    assert defaults == train_mod.StackDefaults(
        role_arn=ROLE,
        subnets=("subnet-0aaa", "subnet-0bbb"),
        security_group_ids=("sg-0ccc",),
        efs_id="fs-0123abcd",
        fsx_id="fs-0fedcba987654321",
        fsx_mount_name="abcdef12",
        bucket="hvd-b",
    )
    argv = ["train", "--dry-run", "--stack", stack, "--image-uri", IMAGE, "--job-name", "j-2"]
    argv += ["--channel", "a=efs:///data", "--channel", "b=fsx:///abcdef12/imagenet"]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    request = json.loads(out)
    assert request["RoleArn"] == ROLE
    assert request["VpcConfig"] == {
        "SecurityGroupIds": ["sg-0ccc"],
        "Subnets": ["subnet-0aaa", "subnet-0bbb"],
    }
    assert request["OutputDataConfig"] == {"S3OutputPath": "s3://hvd-b/output"}
    assert request["CheckpointConfig"] == {
        "S3Uri": "s3://hvd-b/checkpoints/j-2",
        "LocalPath": "/opt/ml/checkpoints",
    }
    sources = [c["DataSource"]["FileSystemDataSource"] for c in request["InputDataConfig"]]
    assert [(s["FileSystemId"], s["DirectoryPath"]) for s in sources] == [
        ("fs-0123abcd", "/data"),
        ("fs-0fedcba987654321", "/abcdef12/imagenet"),
    ]


def test_stack_fsx_mount_name_is_enforced(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--dry-run", "--stack", stack, "--image-uri", IMAGE, "--job-name", "j-3"]
    code, _, err = run_main([*argv, "--channel", "b=fsx:///fsx/imagenet"], capsys)
    assert code == 2
    assert err.strip().endswith(
        "error: channel 'b': FSx directory path '/fsx/imagenet' must start with /abcdef12 "
        "(the file system's mount name)"
    )


def test_missing_stack_is_a_one_line_error(aws: None) -> None:
    with pytest.raises(LaunchError) as info:
        train_mod.lookup_stack(boto3.client("cloudformation", region_name=REGION), "nope")
    assert str(info.value) == (
        "stack 'nope' does not exist in us-east-1 (deploy it with `make stack`)"
    )


def _source_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "util.py").write_text("X = 1\n")
    (src / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    return src


def test_program_path_and_tarball(tmp_path: Path) -> None:
    src = _source_dir(tmp_path)
    assert train_mod.program_path(source_dir=src, script=src / "train.py") == "train.py"
    assert train_mod.program_path(source_dir=src, script=Path("pkg/util.py")) == "pkg/util.py"
    with pytest.raises(LaunchError, match="is not a file inside --source-dir"):
        train_mod.program_path(source_dir=src, script=tmp_path / "elsewhere.py")
    with tarfile.open(fileobj=io.BytesIO(train_mod.source_tarball(src))) as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/util.py", "train.py"]
        assert {m.uid for m in tar.getmembers()} == {0}


def test_default_job_name_fits() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    assert train_mod.default_job_name("sm-horovod", now=now) == (
        "sm-horovod-2025-01-02-03-04-05-678"
    )
    long = train_mod.default_job_name("x" * 80, now=now)
    assert len(long) == 63
    assert long.endswith("-2025-01-02-03-04-05-678")


def test_host_of_stream() -> None:
    assert train_mod.host_of_stream("j", "j/algo-2-1700000000") == "algo-2"
    assert train_mod.host_of_stream("j", "j/other") == "other"


def _put_logs(job: str, lines: dict[str, list[str]]) -> None:
    logs = boto3.client("logs", region_name=REGION)
    group = train_mod.LOG_GROUP
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=group)
    now = int(time.time() * 1000)
    for stream, messages in lines.items():
        logs.create_log_stream(logGroupName=group, logStreamName=f"{job}/{stream}")
        logs.put_log_events(
            logGroupName=group,
            logStreamName=f"{job}/{stream}",
            logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(messages)],
        )


def test_train_creates_uploads_waits_and_streams_every_host(
    aws: None,
    stack: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = boto3.session.Session(region_name=REGION)
    sent: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], **_: Any) -> None:
        sent.append(params)

    session.events.register("provide-client-params.sagemaker.CreateTrainingJob", capture)
    monkeypatch.setattr(cli, "_session", lambda region: session)
    _put_logs(
        "j-4",
        {"algo-1-1700000000": ["epoch=1 loss=0.5", "done"], "algo-2-1700000000": ["ready"]},
    )
    src = _source_dir(tmp_path)
    argv = ["train", "--stack", stack, "--image-uri", IMAGE, "--job-name", "j-4"]
    argv += ["--script", str(src / "train.py"), "--source-dir", str(src), "--poll-seconds", "0"]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert out.splitlines() == [
        "j-4",
        "[algo-1] epoch=1 loss=0.5",
        "[algo-1] done",
        "[algo-2] ready",
    ]
    (request,) = sent
    seed = request["Environment"]["SM_HVD_JOB_SECRET"]
    assert re.fullmatch(r"[0-9a-f]{64}", seed)
    assert seed not in out + err
    assert request["HyperParameters"] == {
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": "s3://hvd-b/code/j-4/source/sourcedir.tar.gz",
    }
    body = boto3.client("s3", region_name=REGION).get_object(
        Bucket="hvd-b", Key="code/j-4/source/sourcedir.tar.gz"
    )["Body"]
    with tarfile.open(fileobj=io.BytesIO(body.read())) as tar:
        assert "train.py" in tar.getnames()


def record_seeds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the CLI's boto3 session record the ssh seed of every CreateTrainingJob it sends."""
    session = boto3.session.Session(region_name=REGION)
    seeds: list[str] = []
    session.events.register(
        "provide-client-params.sagemaker.CreateTrainingJob",
        lambda params, **_: seeds.append(params["Environment"]["SM_HVD_JOB_SECRET"]),
    )
    monkeypatch.setattr(cli, "_session", lambda region: session)
    return seeds


def test_each_job_gets_a_fresh_seed(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = record_seeds(monkeypatch)
    for name in ("j-5", "j-6"):
        assert cli.main(["train", "--no-wait", *REQUIRED, "--job-name", name]) == 0
    assert len(seeds) == 2
    assert seeds[0] != seeds[1]


def test_failed_job_prints_failure_reason_and_exits_nonzero(
    aws: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    session = boto3.session.Session(region_name=REGION)
    sm = session.client("sagemaker")
    stub = Stubber(sm)
    stub.add_response(
        "create_training_job",
        {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/j-7"},
    )
    base = {
        "TrainingJobName": "j-7",
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/j-7",
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "ResourceConfig": {
            "InstanceType": "ml.c5.xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 30,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": datetime(2025, 1, 1, tzinfo=UTC),
    }
    stub.add_response(
        "describe_training_job",
        {**base, "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"},
        {"TrainingJobName": "j-7"},
    )
    stub.add_response(
        "describe_training_job",
        {
            **base,
            "TrainingJobStatus": "Failed",
            "SecondaryStatus": "Failed",
            "FailureReason": "AlgorithmError: mpirun exited 1\nsee logs",
        },
        {"TrainingJobName": "j-7"},
    )
    stub.activate()
    real_client: Callable[..., Any] = session.client

    def client(name: str, **kwargs: Any) -> Any:
        return sm if name == "sagemaker" else real_client(name, **kwargs)

    monkeypatch.setattr(session, "client", client)
    monkeypatch.setattr(cli, "_session", lambda region: session)
    _put_logs("j-7", {"algo-1-1700000000": ["boom"]})
    code, out, err = run_main(
        ["train", *REQUIRED, "--job-name", "j-7", "--poll-seconds", "0"], capsys
    )
    assert code == 1
    assert out.splitlines() == ["j-7", "[algo-1] boom"]
    assert err.splitlines()[-1] == (
        "error: training job j-7 failed: AlgorithmError: mpirun exited 1 see logs"
    )
    stub.assert_no_pending_responses()


def test_log_tail_reads_only_new_events(aws: None) -> None:
    _put_logs("j-8", {"algo-1-1": ["a"]})
    logs = boto3.client("logs", region_name=REGION)
    tail = train_mod.LogTail(job_name="j-8", tokens={})
    out = io.StringIO()
    assert tail.poll(logs, out) == 1
    assert tail.poll(logs, out) == 0
    logs.put_log_events(
        logGroupName=train_mod.LOG_GROUP,
        logStreamName="j-8/algo-1-1",
        logEvents=[{"timestamp": int(time.time() * 1000) + 10, "message": "b"}],
    )
    assert tail.poll(logs, out) == 1
    assert out.getvalue() == "[algo-1] a\n[algo-1] b\n"


def test_no_log_group_yet_is_not_an_error(aws: None) -> None:
    tail = train_mod.LogTail(job_name="j-9", tokens={})
    assert tail.poll(boto3.client("logs", region_name=REGION), io.StringIO()) == 0


def test_git_sha_is_rev_parse_short_12(tmp_path: Path) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
    }
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"],
        check=True,
        env=env,
    )
    full = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert git_sha(cwd=tmp_path) == full[:12]


def test_git_sha_without_commits_is_a_launch_error(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    with pytest.raises(LaunchError, match=r"git rev-parse --short=12 HEAD failed in"):
        git_sha(cwd=tmp_path)


def test_flavor_resolves_the_image_pushed_from_this_sha(
    aws: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ecr = boto3.client("ecr", region_name=REGION)
    uri = ecr.create_repository(repositoryName="sm-horovod")["repository"]["repositoryUri"]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    }
    ecr.put_image(
        repositoryName="sm-horovod", imageManifest=json.dumps(manifest), imageTag="gpu-0123456789ab"
    )
    rest = ["--role-arn", ROLE, "--output-s3-uri", "s3://b/out", "--sha", "0123456789ab"]
    code, out, err = run_main(["train", "--dry-run", "--flavor", "gpu", *rest], capsys)
    assert code == 0, err
    assert json.loads(out)["AlgorithmSpecification"]["TrainingImage"] == f"{uri}:gpu-0123456789ab"
    code, out, err = run_main(["train", "--dry-run", "--flavor", "cpu", *rest], capsys)
    assert code == 2
    assert err.splitlines()[-1] == (
        "error: sm-horovod:cpu-0123456789ab is not in ECR: run `make push FLAVOR=cpu` first"
    )


def test_no_image_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["train", "--dry-run", "--role-arn", ROLE], capsys)
    assert code == 2
    assert err.splitlines() == [
        "error: pass --image-uri, or --flavor to use the image pushed from HEAD"
    ]


def test_verbose_logging_never_shows_the_seed(
    aws: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seeds = record_seeds(monkeypatch)
    caplog.set_level(logging.DEBUG)
    code, out, err = run_main(["train", "-v", "--no-wait", *REQUIRED, "--job-name", "j-10"], capsys)
    assert code == 0, err
    (seed,) = seeds
    assert any(r.name.startswith("launch") for r in caplog.records)
    assert seed not in caplog.text + out + err
