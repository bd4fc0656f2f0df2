"""`python -m launch deploy|transform`: argparse in, requests checked, printed or sent."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import boto3

from launch import deploy as dp
from launch import request as rq
from launch import train as train_mod
from launch.errors import LaunchError


def _split(values: list[str]) -> tuple[str, ...]:
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--region", help="AWS region (default: the AWS config's)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    src = p.add_argument_group("model (a finished training job, or all three of the others)")
    src.add_argument("--training-job", help="its model.tar.gz, image and role")
    src.add_argument("--model-data", help="s3://.../model.tar.gz (instead of --training-job)")
    src.add_argument("--image-uri", help="the image (default: the training job's)")
    src.add_argument("--role-arn", help="execution role (default: the training job's)")
    p.add_argument("--name", help="model/endpoint/job name (default: BASE-<timestamp>)")
    p.add_argument("--base-name", default="sm-horovod")
    p.add_argument("--instance-type", default="ml.c5.xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="serve's settings, e.g. SM_SERVE_MAX_BATCH_SIZE=64")  # fmt: skip
    p.add_argument("--subnet", action="append", default=[])
    p.add_argument("--security-group", action="append", default=[])
    p.add_argument("--network-isolation", action="store_true")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--dry-run", action="store_true", help="print the requests and stop")
    p.add_argument("--no-wait", action="store_true", help="create and return")
    p.add_argument("--poll-seconds", type=float, default=30.0)


def add_parsers(sub: Any) -> None:
    deploy = sub.add_parser("deploy", help="CreateModel + EndpointConfig + Endpoint (serve)")
    _model_arguments(deploy)
    transform = sub.add_parser("transform", help="CreateModel + CreateTransformJob (serve)")
    _model_arguments(transform)
    transform.add_argument("--input", required=True, help="s3:// prefix of the inputs")
    transform.add_argument("--output", required=True, help="s3:// prefix for <key>.out files")
    transform.add_argument("--content-type", default="image/png")
    transform.add_argument("--split-type", default="None", choices=dp.SPLIT_TYPES)
    transform.add_argument("--accept", default="application/json")
    transform.add_argument("--max-concurrent", type=int, help="default: the container's answer")
    transform.add_argument("--max-payload-mb", type=int, help="default: the container's answer")
    transform.add_argument("--batch-strategy", choices=dp.BATCH_STRATEGIES)


def _source(args: argparse.Namespace, sm: Any | None) -> dp.ModelSource:
    if args.training_job:
        if sm is None:  # callers open a session whenever --training-job is given
            raise LaunchError("internal: no AWS session")
        found = dp.describe_training_job(sm, args.training_job)
        return dp.ModelSource(
            args.model_data or found.model_data_url,
            args.image_uri or found.image_uri,
            args.role_arn or found.role_arn,
        )
    missing = [
        flag
        for flag, value in (
            ("--model-data", args.model_data),
            ("--image-uri", args.image_uri),
            ("--role-arn", args.role_arn),
        )
        if not value
    ]
    if missing:
        raise LaunchError(f"pass --training-job, or {', '.join(missing)}")
    return dp.ModelSource(args.model_data, args.image_uri, args.role_arn)


def _model_config(args: argparse.Namespace, source: dp.ModelSource) -> dp.ModelConfig:
    name = args.name or train_mod.default_job_name(args.base_name, now=train_mod.now_utc())
    return dp.ModelConfig(
        name=name,
        source=source,
        environment=tuple(rq.parse_pair(e, what="--env") for e in args.env),
        subnets=_split(args.subnet),
        security_group_ids=_split(args.security_group),
        network_isolation=args.network_isolation,
        tags=tuple(rq.parse_pair(t, what="--tag") for t in args.tag),
    )


def requests_from_args(args: argparse.Namespace, source: dp.ModelSource) -> dict[str, Any]:
    """Pure: flags and the model source -> every request, in call order."""
    model = _model_config(args, source)
    if args.command == "deploy":
        return dp.deploy_requests(dp.EndpointConfig(model, args.instance_type, args.instance_count))
    return dp.transform_requests(
        dp.TransformConfig(
            model=model,
            input_s3_uri=args.input,
            output_s3_uri=args.output,
            content_type=args.content_type,
            split_type=args.split_type,
            accept=args.accept,
            instance_type=args.instance_type,
            instance_count=args.instance_count,
            max_concurrent=args.max_concurrent,
            max_payload_mb=args.max_payload_mb,
            batch_strategy=args.batch_strategy,
        )
    )


def cmd_serve(args: argparse.Namespace, session_for: Any) -> int:
    """deploy or transform. `session_for(region)` opens a boto3 session (cli._session)."""
    need_aws = bool(args.training_job or not args.dry_run)
    session: boto3.session.Session | None = session_for(args.region) if need_aws else None
    sm = session.client("sagemaker") if session is not None else None
    requests = requests_from_args(args, _source(args, sm))
    dp.check_with_service_model(requests)
    if args.dry_run:
        print(json.dumps(requests, indent=2))
        return 0
    if sm is None:
        raise LaunchError("internal: no AWS session")
    dp.create_all(sm, requests)
    name = next(iter(requests["CreateModel"].values()))
    print(name)
    if args.no_wait:
        return 0
    if args.command == "deploy":
        desc = dp.wait_for(
            lambda: sm.describe_endpoint(EndpointName=name),
            status_key="EndpointStatus",
            done=dp.ENDPOINT_DONE,
            poll_seconds=args.poll_seconds,
        )
        ok = desc["EndpointStatus"] == "InService"
    else:
        desc = dp.wait_for(
            lambda: sm.describe_transform_job(TransformJobName=name),
            status_key="TransformJobStatus",
            done=dp.TRANSFORM_DONE,
            poll_seconds=args.poll_seconds,
        )
        ok = desc["TransformJobStatus"] == "Completed"
    if not ok:
        reason = desc.get("FailureReason", "no FailureReason given")
        print(f"error: {name}: {' '.join(str(reason).split())}", file=sys.stderr)
        return 1
    return 0
