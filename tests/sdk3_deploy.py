"""One SageMaker Python SDK v3 `ModelBuilder` deploy to a local container, then one invoke, as a
user's notebook runs it; tests/test_sdk_v3.py runs this file in a venv with `sagemaker-serve`
(requirements-sdk3.txt).

    python tests/sdk3_deploy.py --image sm-horovod:cpu --model-dir DIR \
        --content-type application/json --body '{"instances": [...]}'

The route: ModelBuilder(image_uri=IMAGE, model_path=DIR, model_server=ModelServer.TORCHSERVE,
mode=Mode.LOCAL_CONTAINER) with no model and no inference_spec, v3's pass-through: the SDK adds
no code of its own to the model and runs `docker run IMAGE serve` with DIR at /opt/ml/model on
port 8080, as a SageMaker endpoint runs the image. ModelServer.TORCHSERVE only picks the SDK's
local runner for that (`serve` on 8080, POST /invocations); on SageMaker the same builder without
`mode` deploys the image as is.

Three things v3 needs that have nothing to do with the image are given here as a user would:
- an execution role ARN, and SAGEMAKER_VALIDATE_ROLE=false (v3 checks the role with IAM even
  for a local container);
- telemetry off (the SDK defaults config, as tests/sdk3_job.py);
- the image from the local daemon: v3's local mode always pulls the image from its registry; a
  local tag has none, so the pull returns the local image (docker-py's images.get).

Prints one JSON line last: {"body": <the response, decoded>, "outside_connections": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outside import outside_connections  # tests/outside.py: this script's folder is on sys.path

NO_TELEMETRY = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}
CONFIG_VARIABLES = ("SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE")
ROLE = "arn:aws:iam::111122223333:role/SageMakerExecution"
BUCKET = "s3://amzn-s3-demo-bucket/model-builder/"


def _pull_from_the_local_daemon() -> None:
    """A local tag has no registry to pull from: return the daemon's own image."""
    from docker.models.images import ImageCollection  # noqa: PLC0415

    def pull(self: ImageCollection, repository: str, tag: str | None = None, **_: Any) -> Any:
        return self.get(f"{repository}:{tag}" if tag else repository)

    ImageCollection.pull = pull


def deploy_and_invoke(args: argparse.Namespace) -> Any:
    """The user's part: build, deploy locally, invoke once, and remove the container."""
    from sagemaker.serve.builder.schema_builder import SchemaBuilder  # noqa: PLC0415
    from sagemaker.serve.mode.function_pointers import Mode  # noqa: PLC0415
    from sagemaker.serve.model_builder import ModelBuilder  # noqa: PLC0415
    from sagemaker.serve.utils.types import ModelServer  # noqa: PLC0415

    body = json.loads(args.body)
    builder = ModelBuilder(
        mode=Mode.LOCAL_CONTAINER,
        image_uri=args.image,
        model_path=str(args.model_dir),
        model_server=ModelServer.TORCHSERVE,
        role_arn=ROLE,
        s3_model_data_url=BUCKET,
        # The health check's request and the JSON the endpoint answers (v3 requires a sample).
        schema_builder=SchemaBuilder(sample_input=body, sample_output={"predictions": []}),
    )
    builder.build()
    endpoint = builder.deploy_local(container_timeout_in_seconds=args.timeout)
    try:
        answer = endpoint.invoke(body=body, content_type="application/json")
        return json.loads(answer.body.read())
    finally:
        # The container v3 started (docker-py, removed once stopped), then the endpoint v3
        # registered with its v2-style LocalSession, which starts a second container with
        # compose on the same port 8080 (it fails: the first holds the port) and removes it.
        builder.modes[str(Mode.LOCAL_CONTAINER)].container.stop(timeout=5)
        second = _compose_container_names(endpoint)
        endpoint.delete()
        # Its delete kills compose but never runs `compose down`: the container it created
        # (and could not start) stays behind, by the name its compose file gave it.
        for name in second:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def _compose_container_names(endpoint: Any) -> list[str]:
    """The container names in the compose file of v3's LocalSession endpoint."""
    import yaml  # noqa: PLC0415

    registered = endpoint._local_session.sagemaker_client._endpoints.get(endpoint.endpoint_name)
    container = getattr(registered, "container", None)
    compose_file = Path(getattr(container, "container_root", "") or "/nonexistent") / (
        "docker-compose.yaml"
    )
    if not compose_file.is_file():
        return []
    services = yaml.safe_load(compose_file.read_text()).get("services", {})
    return [service["container_name"] for service in services.values()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--body", required=True, help="the JSON request")
    parser.add_argument("--timeout", type=int, default=180)
    args = parser.parse_args(argv)
    config = Path(tempfile.mkdtemp(prefix="sdk3-deploy-")) / "sagemaker-config.json"
    config.write_text(json.dumps(NO_TELEMETRY))
    for name in CONFIG_VARIABLES:
        os.environ[name] = str(config)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    _pull_from_the_local_daemon()
    with outside_connections() as attempts:
        body = deploy_and_invoke(args)
    print(json.dumps({"body": body, "outside_connections": attempts}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
