"""`python -m launch push|train|deploy|transform ...`: argparse in, one-line errors out (exit 2),
no tracebacks."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError
from botocore.model import StringShape
from botocore.validate import validate_parameters

from launch import deploy_cli
from launch import push as push_mod
from launch import request as rq
from launch import train as train_mod
from launch.docker import Docker, default_docker
from launch.errors import LaunchError
from launch.gitsha import git_sha

log = logging.getLogger("launch")

EXIT_USAGE = 2
EXIT_FAILED = 1
_QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="AWS region (default: the AWS config's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("push", help="tag IMAGE:FLAVOR-<sha> and push it (make push)")
    _add_common(p)
    p.add_argument("--image", default="sm-horovod", help="local image name (default sm-horovod)")
    p.add_argument("--flavor", required=True, choices=push_mod.FLAVORS)
    p.add_argument("--registry", help="host:port of another registry; no ECR calls then")
    p.add_argument("--repository", help="repository name (default: the image name)")
    p.add_argument("--immutable-tags", action="store_true", help="create the repo IMMUTABLE")
    p.add_argument("--docker", default=default_docker(), help="docker command ($DOCKER)")
    p.add_argument("--sha", help="git sha of the build (default: git rev-parse --short=12 HEAD)")

    _train_parser(sub.add_parser("train", help="build, check and send CreateTrainingJob"))
    deploy_cli.add_parsers(sub)
    return parser


def _train_parser(t: argparse.ArgumentParser) -> None:
    _add_common(t)
    img = t.add_argument_group("image")
    img.add_argument("--image-uri", help="training image URI (default: ECR REPO:FLAVOR-<sha>)")
    img.add_argument("--flavor", choices=push_mod.FLAVORS, help="resolve the pushed ECR image")
    img.add_argument("--repository", default="sm-horovod", help="ECR repository for --flavor")
    img.add_argument("--sha", help="git sha for --flavor (default: HEAD)")
    job = t.add_argument_group("job")
    job.add_argument("--job-name", help="default: BASE-<timestamp>")
    job.add_argument("--base-job-name", default="sm-horovod")
    job.add_argument("--stack", help="CloudFormation stack: role, VPC, file systems, bucket")
    job.add_argument("--role-arn")
    job.add_argument("--instance-type", help="default ml.c5.xlarge")
    job.add_argument("--instance-count", type=int, help="default 1")
    job.add_argument(
        "--instance-group",
        action="append",
        default=[],
        metavar="NAME=TYPE:COUNT",
        help="a heterogeneous cluster, one group per flag (instead of --instance-type/-count)",
    )
    job.add_argument(
        "--distribution-group",
        metavar="NAME",
        help="the instance group that runs the distributed program (the others run the "
        "program once per host and are stopped when it ends)",
    )
    job.add_argument("--volume-size", type=int, default=50, help="GB per instance")
    job.add_argument("--input-mode", default="File", help="File, Pipe or FastFile")
    job.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="NAME=URI",
        help="s3://bucket/prefix, efs://fs-id/path or fsx://fs-id/mountname/path; "
        "options ?mode=File|FastFile|Pipe, ?distribution=ShardedByS3Key, ?access=rw",
    )
    job.add_argument("--output-s3-uri", help="default: s3://<stack bucket>/output")
    job.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE")
    job.add_argument("--metric", action="append", default=[], metavar="NAME=REGEX")
    job.add_argument("--no-default-metrics", action="store_true")
    job.add_argument("--checkpoint-s3-uri", help="default: s3://<stack bucket>/checkpoints/<job>")
    job.add_argument("--spot", action="store_true", help="managed spot training")
    job.add_argument("--max-runtime", type=int, default=86_400, help="seconds")
    job.add_argument("--max-wait", type=int, help="seconds, spot only (default 2x runtime)")
    job.add_argument("--max-retries", type=int, help="RetryStrategy MaximumRetryAttempts")
    job.add_argument("--subnet", action="append", default=[], help="repeat or comma-separate")
    job.add_argument("--security-group", action="append", default=[])
    job.add_argument("--fsx-mount-name")
    job.add_argument("--encrypt-inter-container", action="store_true")
    job.add_argument("--network-isolation", action="store_true")
    job.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    job.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    job.add_argument("--script", type=Path, help="entry script (script mode)")
    job.add_argument("--source-dir", type=Path, help="directory tarred to S3 with --script")
    job.add_argument("--code-s3-prefix", help="default: s3://<stack bucket>/code")
    run = t.add_argument_group("run")
    run.add_argument("--dry-run", action="store_true", help="print the request and stop")
    run.add_argument("--no-wait", action="store_true", help="create the job and return")
    run.add_argument("--poll-seconds", type=float, default=30.0)


def _split(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


def _session(region: str | None) -> Any:
    session = boto3.session.Session(region_name=region)
    if not session.region_name:
        raise LaunchError("no AWS region: pass --region or set AWS_REGION")
    return session


def cmd_push(args: argparse.Namespace) -> int:
    sha = args.sha or git_sha()
    repository = args.repository or args.image
    ecr = None if args.registry else _session(args.region).client("ecr")
    uri = push_mod.push(
        docker=Docker(command=args.docker),
        image=args.image,
        flavor=args.flavor,
        sha=sha,
        repository=repository,
        registry=args.registry,
        ecr=ecr,
        immutable_tags=args.immutable_tags,
    )
    print(uri)
    return 0


def _metrics(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    if not args.no_default_metrics:
        from model.logline import metric_definitions  # noqa: PLC0415  (needs the checkout)

        pairs.extend((d["Name"], d["Regex"]) for d in metric_definitions())
    pairs.extend(rq.parse_pair(m, what="--metric") for m in args.metric)
    return tuple(pairs)


def config_from_args(
    args: argparse.Namespace,
    *,
    stack: train_mod.StackDefaults,
    image_uri: str,
    job_name: str,
    ssh_seed: str,
) -> rq.TrainConfig:
    """Merge flags over stack defaults into the frozen config. Pure (no I/O)."""
    bucket = stack.bucket
    output = args.output_s3_uri or (f"s3://{bucket}/output" if bucket else None)
    if output is None:
        raise LaunchError("--output-s3-uri is required (or --stack with a bucket)")
    checkpoint = args.checkpoint_s3_uri or (
        f"s3://{bucket}/checkpoints/{job_name}" if bucket else None
    )
    role = args.role_arn or stack.role_arn
    if not role:
        raise LaunchError("--role-arn is required (or --stack)")
    source = None
    if (args.script is None) != (args.source_dir is None):
        raise LaunchError("--script and --source-dir go together")
    if args.script is not None:
        prefix = args.code_s3_prefix or (f"s3://{bucket}/code" if bucket else None)
        if prefix is None:
            raise LaunchError("--script needs --code-s3-prefix (or --stack with a bucket)")
        program = train_mod.program_path(source_dir=args.source_dir, script=args.script)
        source = rq.SourceBundle(program=program, s3_uri=train_mod.source_s3_uri(prefix, job_name))
    subnets = _split(args.subnet) or stack.subnets
    groups = _split(args.security_group) or stack.security_group_ids
    if args.instance_group and (args.instance_type is not None or args.instance_count is not None):
        raise LaunchError("--instance-group replaces --instance-type and --instance-count")
    return rq.TrainConfig(
        job_name=job_name,
        image_uri=image_uri,
        role_arn=role,
        output_s3_uri=output,
        ssh_seed=ssh_seed,
        instance_type=args.instance_type or "ml.c5.xlarge",
        instance_count=1 if args.instance_count is None else args.instance_count,
        instance_groups=tuple(rq.parse_instance_group(g) for g in args.instance_group),
        distribution_group=args.distribution_group,
        volume_size_gb=args.volume_size,
        input_mode=args.input_mode,
        channels=tuple(rq.parse_channel(c) for c in args.channel),
        hyperparameters=tuple(rq.parse_pair(h, what="--hp") for h in args.hp),
        metric_definitions=_metrics(args),
        checkpoint_s3_uri=checkpoint,
        spot=args.spot,
        max_runtime_seconds=args.max_runtime,
        max_wait_seconds=args.max_wait,
        max_retry_attempts=args.max_retries,
        subnets=subnets,
        security_group_ids=groups,
        inter_container_encryption=args.encrypt_inter_container,
        network_isolation=args.network_isolation,
        environment=tuple(rq.parse_pair(e, what="--env") for e in args.env),
        tags=tuple(rq.parse_pair(t, what="--tag") for t in args.tag),
        efs_id=stack.efs_id,
        fsx_id=stack.fsx_id,
        fsx_mount_name=args.fsx_mount_name or stack.fsx_mount_name,
        source=source,
    )


def sagemaker_input_shape() -> Any:
    """CreateTrainingJob's input shape from botocore's bundled model (no network)."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape


def training_instance_types() -> frozenset[str]:
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.shape_for("TrainingInstanceType")
    if not isinstance(shape, StringShape):
        raise TypeError(f"botocore's TrainingInstanceType is a {shape.type_name}, not a string")
    return frozenset(shape.enum)


def checked_request(config: rq.TrainConfig) -> dict[str, Any]:
    """build_request, then botocore's own validation and the model's max/pattern/enum checks."""
    request = rq.build_request(config, instance_types=training_instance_types())
    shape = sagemaker_input_shape()
    try:
        validate_parameters(request, shape)
    except ParamValidationError as exc:
        raise LaunchError(" ".join(str(exc).split())) from exc
    problems = rq.model_constraint_errors(request, shape)
    if problems:
        raise LaunchError(problems[0])
    return request


def cmd_train(args: argparse.Namespace) -> int:
    if not args.image_uri and not args.flavor:
        raise LaunchError("pass --image-uri, or --flavor to use the image pushed from HEAD")
    need_aws = bool(args.stack or not args.image_uri or not args.dry_run)
    session = _session(args.region) if need_aws else None
    stack = (
        train_mod.lookup_stack(session.client("cloudformation"), args.stack)
        if session is not None and args.stack
        else train_mod.StackDefaults()
    )
    if args.image_uri:
        image_uri = args.image_uri
    elif session is not None:
        image_uri = push_mod.resolve_ecr_image_uri(
            session.client("ecr"),
            repository=args.repository,
            flavor=args.flavor,
            sha=args.sha or git_sha(),
        )
    else:  # unreachable: no --image-uri means need_aws
        raise LaunchError("pass --image-uri, or --flavor to use the image pushed from HEAD")
    job_name = args.job_name or train_mod.default_job_name(
        args.base_job_name, now=train_mod.now_utc()
    )
    config = config_from_args(
        args,
        stack=stack,
        image_uri=image_uri,
        job_name=job_name,
        ssh_seed=secrets.token_hex(32),
    )
    request = checked_request(config)
    for note in rq.warnings(config):
        log.warning("%s", note)
    if args.dry_run:
        if config.source is not None:
            log.info("dry run: would upload %s to %s", args.source_dir, config.source.s3_uri)
        print(json.dumps(rq.redact(request), indent=2))
        return 0
    if session is None:  # need_aws is true without --dry-run
        raise LaunchError("internal: no AWS session")
    if config.source is not None:
        train_mod.upload_source(
            session.client("s3"), source_dir=args.source_dir, s3_uri=config.source.s3_uri
        )
    sm = session.client("sagemaker")
    arn = sm.create_training_job(**request)["TrainingJobArn"]
    log.info("created %s", arn)
    print(job_name)
    if args.no_wait:
        return 0
    desc = train_mod.follow_job(
        sm,
        session.client("logs"),
        job_name=job_name,
        out=sys.stdout,
        poll_seconds=args.poll_seconds,
    )
    failure = train_mod.job_outcome(desc)
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        return EXIT_FAILED
    log.info("job %s completed; model in %s", job_name, desc.get("ModelArtifacts", {}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # botocore's DEBUG log prints request bodies, which hold the job's ssh seed: never below INFO.
    for noisy in _QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command in ("deploy", "transform"):
            return deploy_cli.cmd_serve(args, _session)
        return cmd_push(args) if args.command == "push" else cmd_train(args)
    except LaunchError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    except (BotoCoreError, ClientError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
