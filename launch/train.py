"""The imperative shell of `python -m launch train`: stack outputs, source upload, the
CreateTrainingJob call, then polling the job and streaming its CloudWatch logs."""

from __future__ import annotations

import io
import logging
import re
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from botocore.exceptions import ClientError

from cfn.outputs import StackOutputsError, stack_outputs
from launch.errors import LaunchError

log = logging.getLogger(__name__)

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
SOURCE_TARBALL = "sourcedir.tar.gz"
_EXCLUDED = frozenset({"__pycache__", ".git", ".venv", ".pytest_cache", ".ruff_cache"})
_STREAM_HOST = re.compile(r"(algo-\d+)")


@dataclass(frozen=True)
class StackDefaults:
    """What a `--stack` fills in, from the CloudFormation stack's outputs."""

    role_arn: str | None = None
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    efs_id: str | None = None
    fsx_id: str | None = None
    fsx_mount_name: str | None = None
    bucket: str | None = None


def stack_defaults(outputs: Mapping[str, str]) -> StackDefaults:
    """Map the stack's outputs (see cfn/outputs.py) to launcher defaults. Pure."""

    def get(key: str) -> str | None:
        return outputs.get(key) or None

    subnets = tuple(s.strip() for s in (get("TrainingSubnetIds") or "").split(",") if s.strip())
    sg = get("TrainingSecurityGroupId")
    return StackDefaults(
        role_arn=get("TrainingRoleArn"),
        subnets=subnets,
        security_group_ids=(sg,) if sg else (),
        efs_id=get("EfsFileSystemId"),
        fsx_id=get("FsxFileSystemId"),
        fsx_mount_name=get("FsxMountName"),
        bucket=get("BucketName"),
    )


def lookup_stack(cfn_client: Any, stack_name: str) -> StackDefaults:
    """Read the stack's outputs; a missing or unusable stack is a one-line LaunchError."""
    try:
        outputs = stack_outputs(cfn_client, stack_name)
    except StackOutputsError as exc:
        raise LaunchError(str(exc)) from exc
    log.info("stack %s outputs: %s", stack_name, ", ".join(sorted(outputs)))
    return stack_defaults(outputs)


def default_job_name(base: str, *, now: datetime) -> str:
    """`<base>-YYYY-MM-DD-HH-MM-SS-mmm`, the base cut so the name fits 63 characters."""
    stamp = now.strftime("%Y-%m-%d-%H-%M-%S-") + f"{now.microsecond // 1000:03d}"
    return f"{base[: 63 - len(stamp) - 1].rstrip('-')}-{stamp}"


def now_utc() -> datetime:
    return datetime.now(UTC)


def source_s3_uri(code_prefix: str, job_name: str) -> str:
    """`s3://bucket/prefix/<job>/source/sourcedir.tar.gz` (as the SageMaker SDK lays it out)."""
    return f"{code_prefix.rstrip('/')}/{job_name}/source/{SOURCE_TARBALL}"


def program_path(*, source_dir: Path, script: Path) -> str:
    """The script's path inside source_dir, as `sagemaker_program` wants it."""
    root = source_dir.resolve()
    if not root.is_dir():
        raise LaunchError(f"--source-dir {source_dir} is not a directory")
    for candidate in (script, root / script):
        full = candidate.resolve()
        if full.is_file() and full.is_relative_to(root):
            return full.relative_to(root).as_posix()
    raise LaunchError(f"--script {script} is not a file inside --source-dir {source_dir}")


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if any(p in _EXCLUDED for p in parts) or info.name.endswith(".pyc"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def source_tarball(source_dir: Path) -> bytes:
    """source_dir's contents (no caches, no .git) as a gzipped tar, paths relative to it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(source_dir.iterdir()):
            tar.add(child, arcname=child.name, filter=_tar_filter)
    return buffer.getvalue()


def upload_source(s3: Any, *, source_dir: Path, s3_uri: str) -> None:
    bucket, _, key = s3_uri.removeprefix("s3://").partition("/")
    body = source_tarball(source_dir)
    log.info("uploading %s (%d bytes) to %s", source_dir, len(body), s3_uri)
    s3.put_object(Bucket=bucket, Key=key, Body=body)


# --- following a job -----------------------------------------------------------------------


def host_of_stream(job_name: str, stream: str) -> str:
    """`<job>/algo-2-1700000000` -> `algo-2`."""
    rest = stream.removeprefix(f"{job_name}/")
    match = _STREAM_HOST.match(rest)
    return match.group(1) if match else rest


@dataclass
class LogTail:
    """Where each log stream of one job was read up to (state of one follow, not global)."""

    job_name: str
    tokens: dict[str, str]

    def poll(self, logs: Any, out: TextIO) -> int:
        """Print new events of every host's stream, each line prefixed `[algo-N] `."""
        try:
            pages = logs.get_paginator("describe_log_streams").paginate(
                logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.job_name}/"
            )
            streams = sorted(s["logStreamName"] for page in pages for s in page["logStreams"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return 0
            raise
        printed = 0
        for stream in streams:
            host = host_of_stream(self.job_name, stream)
            while True:
                kwargs: dict[str, Any] = {
                    "logGroupName": LOG_GROUP,
                    "logStreamName": stream,
                    "startFromHead": True,
                }
                if stream in self.tokens:
                    kwargs["nextToken"] = self.tokens[stream]
                page = logs.get_log_events(**kwargs)
                for event in page["events"]:
                    for line in event["message"].splitlines() or [""]:
                        out.write(f"[{host}] {line}\n")
                        printed += 1
                token = page.get("nextForwardToken")
                if not token or token == self.tokens.get(stream):
                    break
                self.tokens[stream] = token
                if not page["events"]:
                    break
        out.flush()
        return printed


def follow_job(
    sm: Any,
    logs: Any,
    *,
    job_name: str,
    out: TextIO,
    poll_seconds: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll DescribeTrainingJob until the job ends, streaming logs; return the last description."""
    tail = LogTail(job_name=job_name, tokens={})
    last_status = ""
    while True:
        desc = sm.describe_training_job(TrainingJobName=job_name)
        status = f"{desc['TrainingJobStatus']}/{desc.get('SecondaryStatus', '')}"
        if status != last_status:
            log.info("job %s: %s", job_name, status)
            last_status = status
        tail.poll(logs, out)
        if desc["TrainingJobStatus"] in TERMINAL_STATUSES:
            tail.poll(logs, out)
            return desc
        sleep(poll_seconds)


def job_outcome(desc: Mapping[str, Any]) -> str | None:
    """None if the job completed, else the one-line reason it did not."""
    status = desc["TrainingJobStatus"]
    if status == "Completed":
        return None
    reason = desc.get("FailureReason") or desc.get("SecondaryStatus") or "no reason given"
    return f"training job {desc['TrainingJobName']} {status.lower()}: {' '.join(reason.split())}"
