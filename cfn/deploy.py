"""Deploy or delete the sm-horovod stack with boto3 (no aws CLI).

    python -m cfn.deploy deploy --stack NAME --region R --bucket B [--create-nat true|false] ...
    python -m cfn.deploy delete --stack NAME --region R

`deploy` uploads the four nested templates and main.yaml to s3://B/<prefix>/<stack>/<digest>/
(what `aws cloudformation package` does), creates or updates the parent stack, streams its
events until it settles, and prints the outputs. A stack that fails or rolls back exits 1
with every *_FAILED event printed, nested stacks included, so the root cause is on screen.
On an update, parameters not given keep their previous values (like `aws cloudformation
deploy`). `delete` deletes the stack, waits, and names what was retained (the EFS file system).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger("cfn.deploy")

TEMPLATE_DIR = Path(__file__).resolve().parent
MAIN_TEMPLATE = "main.yaml"
NESTED_TEMPLATES: tuple[str, ...] = ("network.yaml", "iam.yaml", "storage.yaml", "notebook.yaml")
CAPABILITIES: tuple[str, ...] = ("CAPABILITY_IAM",)
STACK_TAGS: Mapping[str, str] = {"project": "sm-horovod"}

EXIT_OK = 0
EXIT_FAILED = 1

DEPLOYED_STATUSES = frozenset({"CREATE_COMPLETE", "UPDATE_COMPLETE"})
DELETED_STATUSES = frozenset({"DELETE_COMPLETE"})
FAILURE_STATUSES = frozenset(
    {
        "CREATE_FAILED",
        "DELETE_COMPLETE",
        "ROLLBACK_COMPLETE",
        "ROLLBACK_FAILED",
        "DELETE_FAILED",
        "UPDATE_FAILED",
        "UPDATE_ROLLBACK_COMPLETE",
        "UPDATE_ROLLBACK_FAILED",
        "IMPORT_ROLLBACK_COMPLETE",
        "IMPORT_ROLLBACK_FAILED",
    }
)
# A failed first create leaves a stack that can only be deleted.
DEAD_STATUSES = frozenset({"ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED"})
CANCELLED_REASON = "Resource creation cancelled"
NO_ECHO_MASK = "****"
NESTED_STACK_TYPE = "AWS::CloudFormation::Stack"
MAX_NESTING = 3

# CLI flag -> parent-template parameter, for the flags that map one to one.
FLAG_PARAMETERS: Mapping[str, str] = {
    "ecr_repository": "EcrRepositoryName",
    "training_az": "TrainingAvailabilityZone",
    "secondary_az": "SecondaryAvailabilityZone",
    "create_nat": "CreateNat",
    "create_efs": "CreateEfs",
    "create_fsx": "CreateFsx",
    "create_notebook": "CreateNotebook",
    "fsx_deployment_type": "FsxDeploymentType",
    "fsx_storage_capacity": "FsxStorageCapacity",
    "fsx_throughput": "FsxPerUnitStorageThroughput",
    "fsx_s3_prefix": "FsxS3Prefix",
    "notebook_instance_type": "NotebookInstanceType",
}


class DeployError(Exception):
    """A stack operation that did not succeed; `events` are its *_FAILED stack events."""

    def __init__(self, message: str, events: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self.events = list(events)


@dataclass(frozen=True)
class WaitConfig:
    """How to follow a stack operation."""

    poll_seconds: float = 10.0
    timeout_seconds: float = 90 * 60
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class DeployConfig:
    """What `deploy` needs; `parameters` are the ones given explicitly (flags, --parameter)."""

    stack: str
    region: str
    bucket: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    template_prefix: str = "cfn-templates"
    template_dir: Path = TEMPLATE_DIR
    wait: WaitConfig = field(default_factory=WaitConfig)


@dataclass(frozen=True)
class DeleteConfig:
    stack: str
    region: str
    wait: WaitConfig = field(default_factory=WaitConfig)


# --------------------------------------------------------------------------- templates


def template_digest(template_dir: Path, names: Iterable[str]) -> str:
    """A short content hash of the templates: a new upload folder whenever one changes."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update((template_dir / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def s3_https_url(bucket: str, region: str, key: str) -> str:
    """The virtual-hosted HTTPS URL CloudFormation accepts as a TemplateURL."""
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://{bucket}.s3.{region}.{domain}/{key}"


def upload_templates(s3_client: Any, config: DeployConfig) -> str:
    """Upload main.yaml and the nested templates; return the folder URL (TemplateBaseUrl)."""
    names = (MAIN_TEMPLATE, *NESTED_TEMPLATES)
    folder = "/".join(
        part
        for part in (
            config.template_prefix.strip("/"),
            config.stack,
            template_digest(config.template_dir, names),
        )
        if part
    )
    for name in names:
        key = f"{folder}/{name}"
        s3_client.put_object(
            Bucket=config.bucket,
            Key=key,
            Body=(config.template_dir / name).read_bytes(),
            ContentType="application/x-yaml",
        )
        log.debug("uploaded s3://%s/%s", config.bucket, key)
    log.info("templates uploaded to s3://%s/%s/", config.bucket, folder)
    return s3_https_url(config.bucket, config.region, folder)


# --------------------------------------------------------------------------- stack state


def _is_missing_stack(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    return error.get("Code") == "ValidationError" and "does not exist" in error.get("Message", "")


def describe_stack(cfn_client: Any, stack: str) -> dict[str, Any] | None:
    """The stack's description, or None when it does not exist."""
    try:
        stacks = cfn_client.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if _is_missing_stack(exc):
            return None
        raise
    return stacks[0] if stacks else None


def newest_event_id(cfn_client: Any, stack: str) -> str | None:
    events = cfn_client.describe_stack_events(StackName=stack).get("StackEvents", [])
    return events[0]["EventId"] if events else None


class EventFeed:
    """New events of one stack, oldest first, each once; events up to `after_id` are old."""

    def __init__(self, cfn_client: Any, stack_id: str, after_id: str | None) -> None:
        self._cfn = cfn_client
        self._stack_id = stack_id
        self._seen: set[str] = {after_id} if after_id else set()
        self.events: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        fresh: list[dict[str, Any]] = []
        paginator = self._cfn.get_paginator("describe_stack_events")
        done = False
        for page in paginator.paginate(StackName=self._stack_id):
            for event in page.get("StackEvents", []):  # newest first
                if event["EventId"] in self._seen:
                    done = True
                    break
                fresh.append(event)
            if done:
                break
        fresh.reverse()
        self._seen.update(event["EventId"] for event in fresh)
        self.events.extend(fresh)
        return fresh


def format_event(event: Mapping[str, Any]) -> str:
    reason = event.get("ResourceStatusReason")
    line = (
        f"{event.get('ResourceStatus', '?'):<28} {event.get('ResourceType', '?'):<40} "
        f"{event.get('LogicalResourceId', '?')}"
    )
    return f"{line}: {reason}" if reason else line


def _nested_stack_ids(events: Iterable[Mapping[str, Any]], own_id: str) -> list[str]:
    ids: list[str] = []
    for event in events:
        physical = event.get("PhysicalResourceId") or ""
        if (
            event.get("ResourceType") == NESTED_STACK_TYPE
            and physical.startswith("arn:")
            and physical != own_id
            and physical not in ids
        ):
            ids.append(physical)
    return ids


def collect_events(
    cfn_client: Any,
    stack_id: str,
    events: Sequence[Mapping[str, Any]],
    keep: Callable[[Mapping[str, Any]], bool],
    depth: int = 0,
) -> list[dict[str, Any]]:
    """Events of this operation that `keep` selects, from this stack and its nested stacks.

    `events` are the parent's events of this operation; a nested stack's events are those
    at or after the operation's first event. Each result carries `StackName`.
    """
    found = [dict(event) for event in events if keep(event)]
    if depth >= MAX_NESTING or not events:
        return found
    since = min(event["Timestamp"] for event in events)
    for child_id in _nested_stack_ids(events, stack_id):
        try:
            child_events = _events_since(cfn_client, child_id, since)
        except ClientError as exc:
            log.warning("could not read the events of nested stack %s: %s", child_id, exc)
            continue
        found.extend(collect_events(cfn_client, child_id, child_events, keep, depth + 1))
    found.sort(key=lambda event: event["Timestamp"])
    return found


def _events_since(cfn_client: Any, stack_id: str, since: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    paginator = cfn_client.get_paginator("describe_stack_events")
    for page in paginator.paginate(StackName=stack_id):
        batch = page.get("StackEvents", [])
        out.extend(event for event in batch if event["Timestamp"] >= since)
        if batch and batch[-1]["Timestamp"] < since:
            break
    out.reverse()
    return out


def _is_failure(event: Mapping[str, Any]) -> bool:
    return str(event.get("ResourceStatus", "")).endswith("_FAILED")


def wait_for_stack(
    cfn_client: Any,
    stack_id: str,
    after_event_id: str | None,
    wait: WaitConfig,
    success: frozenset[str] = DEPLOYED_STATUSES,
) -> str:
    """Stream the stack's events until it settles; return a `success` status or raise.

    Any other settled status raises DeployError with the operation's *_FAILED events,
    those of nested stacks included.
    """
    feed = EventFeed(cfn_client, stack_id, after_event_id)
    deadline = wait.clock() + wait.timeout_seconds
    while True:
        stack = describe_stack(cfn_client, stack_id)
        status = stack["StackStatus"] if stack else "DELETE_COMPLETE"
        name = stack["StackName"] if stack else stack_id
        if stack is not None:
            for event in feed.poll():
                log.info("%s", format_event(event))
        if status in success:
            return status
        if status in FAILURE_STATUSES:
            failed = collect_events(cfn_client, stack_id, feed.events, _is_failure)
            reason = (stack or {}).get("StackStatusReason")
            detail = f" ({reason})" if reason else ""
            raise DeployError(f"stack {name} ended in {status}{detail}", failed)
        if wait.clock() >= deadline:
            raise DeployError(
                f"stack {name} still {status} after {wait.timeout_seconds:.0f} s; "
                "it goes on in CloudFormation"
            )
        wait.sleep(wait.poll_seconds)


# --------------------------------------------------------------------------- operations


def choose_availability_zones(
    ec2_client: Any | None, training: str | None, secondary: str | None
) -> tuple[str, str]:
    """The given zones, or else the first available ones of the Region (sorted by name)."""
    if training and secondary:
        if training == secondary:
            raise DeployError(f"--training-az and --secondary-az are both {training}")
        return training, secondary
    if ec2_client is None:
        raise DeployError("no Availability Zones given and no EC2 client to look them up")
    zones = ec2_client.describe_availability_zones(
        Filters=[
            {"Name": "state", "Values": ["available"]},
            {"Name": "zone-type", "Values": ["availability-zone"]},
        ]
    )["AvailabilityZones"]
    names = sorted(zone["ZoneName"] for zone in zones)
    training = training or (names[0] if names else None)
    others = [name for name in names if name != training]
    secondary = secondary or (others[0] if others else None)
    if not training or not secondary:
        raise DeployError(f"need two Availability Zones, the Region has {names}")
    return training, secondary


def _parameter_list(values: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"ParameterKey": key, "ParameterValue": value} for key, value in values.items()]


def _tags() -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in STACK_TAGS.items()]


def deploy(
    config: DeployConfig, *, cfn_client: Any, s3_client: Any, ec2_client: Any | None = None
) -> dict[str, str]:
    """Create or update the stack; return its outputs. Raises DeployError on failure."""
    existing = describe_stack(cfn_client, config.stack)
    if existing is not None:
        status = existing["StackStatus"]
        if status in DEAD_STATUSES:
            raise DeployError(
                f"stack {config.stack} is {status} from a failed create and can only be "
                f"deleted: python -m cfn.deploy delete --stack {config.stack} "
                f"--region {config.region}"
            )
        if status.endswith("_IN_PROGRESS"):
            raise DeployError(f"stack {config.stack} is busy ({status}); try again when it settles")

    template_url_base = upload_templates(s3_client, config)
    main_url = f"{template_url_base}/{MAIN_TEMPLATE}"
    given = {
        **config.parameters,
        "BucketName": config.bucket,
        "TemplateBaseUrl": template_url_base,
    }

    if existing is None:
        training, secondary = choose_availability_zones(
            ec2_client,
            given.get("TrainingAvailabilityZone"),
            given.get("SecondaryAvailabilityZone"),
        )
        given["TrainingAvailabilityZone"] = training
        given["SecondaryAvailabilityZone"] = secondary
        log.info("creating stack %s in %s", config.stack, config.region)
        stack_id = cfn_client.create_stack(
            StackName=config.stack,
            TemplateURL=main_url,
            Parameters=_parameter_list(given),
            Capabilities=list(CAPABILITIES),
            Tags=_tags(),
        )["StackId"]
        after = None
    else:
        stack_id = existing["StackId"]
        template_keys = {
            p["ParameterKey"]
            for p in cfn_client.get_template_summary(TemplateURL=main_url).get("Parameters", [])
        }
        # Parameters not given keep their values (a NoEcho one by UsePreviousValue).
        parameters = _parameter_list(given)
        for previous in existing.get("Parameters", []):
            key = previous["ParameterKey"]
            if key in given or key not in template_keys:
                continue
            value = previous.get("ParameterValue")
            if value is None or value == NO_ECHO_MASK:
                parameters.append({"ParameterKey": key, "UsePreviousValue": True})
            else:
                parameters.append({"ParameterKey": key, "ParameterValue": value})
        after = newest_event_id(cfn_client, stack_id)
        log.info("updating stack %s in %s", config.stack, config.region)
        try:
            cfn_client.update_stack(
                StackName=stack_id,
                TemplateURL=main_url,
                Parameters=parameters,
                Capabilities=list(CAPABILITIES),
                Tags=_tags(),
            )
        except ClientError as exc:
            if "No updates are to be performed" not in str(exc):
                raise
            log.info("stack %s is up to date", config.stack)
            return _outputs(describe_stack(cfn_client, stack_id))

    status = wait_for_stack(cfn_client, stack_id, after, config.wait)
    log.info("stack %s: %s", config.stack, status)
    return _outputs(describe_stack(cfn_client, stack_id))


def delete(config: DeleteConfig, *, cfn_client: Any) -> list[dict[str, Any]]:
    """Delete the stack and wait; return the DELETE_SKIPPED (retained) resource events."""
    existing = describe_stack(cfn_client, config.stack)
    if existing is None:
        log.info("stack %s does not exist in %s; nothing to delete", config.stack, config.region)
        return []
    stack_id = existing["StackId"]
    after = newest_event_id(cfn_client, stack_id)
    log.info("deleting stack %s in %s", config.stack, config.region)
    cfn_client.delete_stack(StackName=stack_id)
    wait_for_stack(cfn_client, stack_id, after, config.wait, success=DELETED_STATUSES)
    retained = collect_events(
        cfn_client,
        stack_id,
        _events_since_id(cfn_client, stack_id, after),
        lambda event: event.get("ResourceStatus") == "DELETE_SKIPPED",
    )
    for event in retained:
        log.warning(
            "retained %s %s (%s); delete it by hand when it is no longer needed",
            event.get("ResourceType"),
            event.get("PhysicalResourceId"),
            event.get("LogicalResourceId"),
        )
    log.info("stack %s deleted", config.stack)
    return retained


def _events_since_id(cfn_client: Any, stack_id: str, after_id: str | None) -> list[dict[str, Any]]:
    try:
        feed = EventFeed(cfn_client, stack_id, after_id)
        feed.poll()
    except ClientError as exc:
        log.debug("events of %s not readable after deletion: %s", stack_id, exc)
        return []
    return feed.events


def _outputs(stack: Mapping[str, Any] | None) -> dict[str, str]:
    outputs = (stack or {}).get("Outputs", [])
    return {o["OutputKey"]: o.get("OutputValue", "") for o in outputs}


def failure_report(error: DeployError) -> str:
    """What a failed operation prints: the message, then each failed event, oldest first."""
    lines = [f"error: {error}"]
    causes = [e for e in error.events if e.get("ResourceStatusReason") != CANCELLED_REASON]
    cancelled = len(error.events) - len(causes)
    if causes:
        lines.append("failed resource events (oldest first):")
        lines.extend(f"  [{e.get('StackName', '?')}] {format_event(e)}" for e in causes)
    if cancelled:
        lines.append(f"  (+{cancelled} resource(s) cancelled because of the failures above)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def _bool_flag(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    parser.add_argument(flag, choices=("true", "false"), help=help_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cfn.deploy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    dep = sub.add_parser("deploy", help="create or update the stack and wait")
    dep.add_argument("--stack", required=True, help="parent stack name")
    dep.add_argument("--region", help="AWS Region (default: the AWS config's)")
    dep.add_argument("--bucket", required=True, help="existing S3 bucket in the Region")
    dep.add_argument("--template-prefix", default="cfn-templates", help="S3 key prefix")
    dep.add_argument("--ecr-repository", help="ECR repository of the image (sm-horovod)")
    dep.add_argument("--training-az", help="AZ of training and FSx (default: first AZ)")
    dep.add_argument("--secondary-az", help="second AZ (default: second AZ)")
    _bool_flag(dep, "--create-nat", "NAT gateway for internet egress (false)")
    _bool_flag(dep, "--create-efs", "encrypted EFS file system (true)")
    _bool_flag(dep, "--create-fsx", "FSx for Lustre linked to the bucket (false)")
    _bool_flag(dep, "--create-notebook", "SageMaker notebook instance (true)")
    dep.add_argument("--fsx-deployment-type", choices=("SCRATCH_2", "PERSISTENT_2"))
    dep.add_argument("--fsx-storage-capacity", help="GiB: 1200, 2400, n*2400")
    dep.add_argument("--fsx-throughput", help="MB/s per TiB for PERSISTENT_2")
    dep.add_argument("--fsx-s3-prefix", help="S3 prefix linked to the FSx root (data)")
    dep.add_argument("--notebook-instance-type", help="ml.t3.medium")
    dep.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other main.yaml parameter; repeatable",
    )
    dep.add_argument("--poll-seconds", type=float, default=10.0)
    dep.add_argument("--timeout-minutes", type=float, default=90.0)

    rm = sub.add_parser("delete", help="delete the stack and wait")
    rm.add_argument("--stack", required=True, help="parent stack name")
    rm.add_argument("--region", help="AWS Region (default: the AWS config's)")
    rm.add_argument("--poll-seconds", type=float, default=10.0)
    rm.add_argument("--timeout-minutes", type=float, default=60.0)
    return parser


def parameters_from_args(args: argparse.Namespace) -> dict[str, str]:
    """Template parameters from the flags that were given (and --parameter KEY=VALUE)."""
    values: dict[str, str] = {}
    for raw in args.parameter:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise DeployError(f"--parameter wants KEY=VALUE, got {raw!r}")
        values[key] = value
    for attr, key in FLAG_PARAMETERS.items():
        value = getattr(args, attr)
        if value is not None:
            values[key] = str(value)
    return values


def main(
    argv: Sequence[str] | None = None,
    *,
    session_factory: Callable[..., Any] = boto3.session.Session,
) -> int:
    """The CLI; 0 on success, 1 with the failure report on stderr otherwise."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    wait = WaitConfig(poll_seconds=args.poll_seconds, timeout_seconds=args.timeout_minutes * 60)
    try:
        session = session_factory(region_name=args.region)
        region = session.region_name
        if not region:
            raise DeployError("no AWS Region: pass --region (or set AWS_REGION)")
        cfn_client = session.client("cloudformation")
        if args.command == "deploy":
            config = DeployConfig(
                stack=args.stack,
                region=region,
                bucket=args.bucket,
                parameters=parameters_from_args(args),
                template_prefix=args.template_prefix,
                wait=wait,
            )
            outputs = deploy(
                config,
                cfn_client=cfn_client,
                s3_client=session.client("s3"),
                ec2_client=session.client("ec2"),
            )
            for key in sorted(outputs):
                print(f"{key}={outputs[key]}")
        else:
            delete(DeleteConfig(stack=args.stack, region=region, wait=wait), cfn_client=cfn_client)
    except DeployError as exc:
        print(failure_report(exc), file=sys.stderr)
        return EXIT_FAILED
    except (ClientError, BotoCoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
