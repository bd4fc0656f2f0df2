"""One SageMaker Python SDK v3 `ModelTrainer` job in local container mode, as a user's notebook
runs it; tests/test_sdk_v3.py runs this file in the SDK v3 venv (.venv-sdk3: v3 cannot share a
venv with the v2 `sagemaker` of requirements-dev.txt).

    .venv-sdk3/bin/python tests/sdk3_job.py --image sm-horovod:cpu --root DIR --instance-count 2 \
        --channel train=DIR --hyperparameters '{"epochs": "1"}' [--source-dir DIR --command train]
        [--source-dir DIR --entry-script x.py --distributed mpi|torchrun --process-count N]
        [--write-only]

--write-only stops where the SDK would run `docker compose up`: the compose file, the hosts'
config files and the sm_drivers channel stay under --root for a test to start each host itself
(v3's compose stops every container once one exits; SageMaker's hosts run independently).

Nothing leaves this machine: telemetry opted out (the SDK's defaults config, written under
--root), local data (bind mounts, no S3), a local image (no ECR pull). An audit hook records
every outside name lookup or connection this process tries. Prints one JSON line last:
{"artifacts": <root>/artifacts, "outside_connections": [...]}; exits 1 when the job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from outside import outside_connections  # tests/outside.py: this script's folder is on sys.path

# The SDK defaults config that switches telemetry off (sagemaker/core/config/config.py reads
# the files these two variables name).
NO_TELEMETRY = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}
CONFIG_VARIABLES = ("SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE")


def _compose_down(root: Path) -> None:
    """The SDK runs `compose up` and never `down`: remove its containers."""
    compose_file = root / "docker-compose.yaml"
    if not compose_file.is_file():
        return
    compose = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
    subprocess.run(
        [*compose, "-f", str(compose_file), "down", "--timeout", "1"],
        capture_output=True,
        check=False,
    )


class StopBeforeComposeError(Exception):
    """--write-only: the SDK wrote its compose file and was about to run it."""


def _stop_before_compose() -> None:
    """--write-only: the SDK writes the compose file, then asks for its command; stop there."""
    from sagemaker.train.local import local_container  # noqa: PLC0415

    def stop(self: object, wait: bool) -> list[str]:
        raise StopBeforeComposeError

    local_container._LocalContainer._generate_compose_command = stop


def _keep_drivers(trainer: object, root: Path) -> None:
    """--write-only: v3 deletes its sm_drivers folder (a TemporaryDirectory) with the trainer;
    copy it under root and point the compose file at the copy."""
    temporary = trainer._temp_code_dir.name  # type: ignore[attr-defined]
    kept = root / "sm_drivers"
    shutil.copytree(temporary, kept)
    compose = root / "docker-compose.yaml"
    compose.write_text(compose.read_text().replace(f"{temporary}:", f"{kept}:"))


def _distributed(args: argparse.Namespace) -> object | None:
    """distributed=MPI(...) or Torchrun(...), as a user writes it."""
    from sagemaker.train.distributed import MPI, Torchrun  # noqa: PLC0415

    if args.distributed == "mpi":
        return MPI(
            process_count_per_node=args.process_count, mpi_additional_options=args.mpi_option
        )
    if args.distributed == "torchrun":
        return Torchrun(process_count_per_node=args.process_count)
    return None


def _train(args: argparse.Namespace, root: Path) -> bool:
    """The user's part: build the ModelTrainer and train; False when the job failed."""
    # Imported after the environment is set: the SDK reads its config at import.
    from sagemaker.core.training.configs import Compute, InputData, SourceCode  # noqa: PLC0415
    from sagemaker.train.model_trainer import Mode, ModelTrainer  # noqa: PLC0415

    source_code = None
    if args.entry_script:
        source_code = SourceCode(source_dir=str(args.source_dir), entry_script=args.entry_script)
    elif args.source_dir:
        source_code = SourceCode(source_dir=str(args.source_dir), command=args.command)
    if args.write_only:
        _stop_before_compose()
    trainer = ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image=args.image,
        compute=Compute(instance_type="local_cpu", instance_count=args.instance_count),
        local_container_root=str(root),
        base_job_name="sm-horovod-sdk3",
        hyperparameters=json.loads(args.hyperparameters),
        environment=json.loads(args.environment),
        source_code=source_code,
        distributed=_distributed(args),
    )
    channels = [
        InputData(channel_name=name, data_source=str(Path(path).resolve()))
        for name, path in (channel.split("=", 1) for channel in args.channel)
    ]
    try:
        trainer.train(input_data_config=channels, wait=True)
    except StopBeforeComposeError:
        _keep_drivers(trainer, root)
        return True
    except RuntimeError as error:
        print(f"sdk3_job: training failed: {error}", file=sys.stderr)
        return False
    finally:
        if not args.write_only:
            _compose_down(root)
    return True


def run_job(args: argparse.Namespace) -> int:
    root: Path = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "sagemaker-config.json"
    config.write_text(json.dumps(NO_TELEMETRY))
    for name in CONFIG_VARIABLES:
        os.environ[name] = str(config)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

    with outside_connections() as attempts:
        failed = not _train(args, root)
    result = {"artifacts": str(root / "artifacts"), "outside_connections": attempts}
    print(json.dumps(result), flush=True)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--channel", action="append", default=[], help="NAME=LOCAL_DIR")
    parser.add_argument("--hyperparameters", default="{}", help="a JSON object")
    parser.add_argument("--environment", default="{}", help="a JSON object")
    parser.add_argument("--source-dir", type=Path, help="SourceCode(source_dir=...)")
    parser.add_argument("--command", default="train", help="SourceCode(command=...)")
    parser.add_argument("--entry-script", help="SourceCode(entry_script=...), not --command")
    parser.add_argument("--distributed", choices=("mpi", "torchrun"))
    parser.add_argument("--process-count", type=int, help="process_count_per_node")
    parser.add_argument("--mpi-option", action="append", help="MPI(mpi_additional_options)")
    parser.add_argument("--write-only", action="store_true", help="stop before compose up")
    return run_job(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
