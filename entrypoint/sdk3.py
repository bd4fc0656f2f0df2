"""SDK v3's drivers read as the contract: `ModelTrainer(source_code=..., distributed=...)`.

With `source_code`, SDK v3 replaces the image's entry point: PID 1 is `/bin/bash -c "chmod +x
.../sm_drivers/sm_train.sh && .../sm_train.sh"`, and its drivers (mpi_driver.py with its own
sshd and mpirun, torchrun_driver.py, basic_script_driver.py) run unsupervised. The image's
BASH_ENV hook (docker/bash-env.sh) notices that command in bash as PID 1 and execs
`tini -- train` instead, with the command in SDK3_COMMAND_ENV. `train` then reads what v3 asked
for from the `sm_drivers` channel (sourcecode.json, distributed.json, and the driver sm_train.sh
runs) and runs it as the launch the same request has through v2's hyperparameters:

    MPI(process_count_per_node=P, mpi_additional_options=O)  -> Backend.MPI, P ranks per host, O
    Torchrun(process_count_per_node=P)                       -> Backend.TORCH_DISTRIBUTED, P
    SourceCode(entry_script=...) alone                       -> Backend.PER_HOST
    SourceCode(command="train")                              -> the contract as without v3
    any other command or driver                              -> v3's command once per host

So every v3 job keeps the image's guarantees (fail-fast across hosts, SIGTERM to every rank with
its grace, the failure file, stall detection): they are the launches' own. Pure functions; the
one read of the channel's files is `read_sdk3_job`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Set by the BASH_ENV hook: v3's `bash -c` command it replaced with `train`.
SDK3_COMMAND_ENV = "SM_HVD_SDK3_COMMAND"
# The channels v3 adds (sagemaker/train/constants.py).
DRIVERS_CHANNEL = "sm_drivers"
CODE_CHANNEL = "code"
SOURCECODE_JSON = "sourcecode.json"
DISTRIBUTED_JSON = "distributed.json"
TRAIN_SCRIPT = "sm_train.sh"
# v3's hard-coded rendezvous (sagemaker/train/container_drivers/scripts/environment.py).
SDK3_MASTER_PORT = "7777"

# The driver line v3's sm_train.sh template writes (sagemaker/train/templates.py).
_DRIVER_LINE = re.compile(r"/sm_drivers/distributed_drivers/([A-Za-z0-9_]+\.py)")


class Sdk3Error(ValueError):
    """The sm_drivers channel does not say what v3 asked for; one line."""


@dataclasses.dataclass(frozen=True)
class Sdk3Job:
    """What v3's ModelTrainer asked for, from the sm_drivers channel."""

    # The driver sm_train.sh runs (mpi_driver.py, ...), None when it runs a command.
    driver: str | None
    entry_script: str | None
    # SourceCode.command, as v3 runs it (eval'd in /opt/ml/input/data/code).
    command: str | None
    source_dir: str | None
    requirements: str | None
    process_count_per_node: int | None
    mpi_additional_options: tuple[str, ...]
    # distributed.json as v3 wrote it (SM_DISTRIBUTED_CONFIG).
    distributed: Mapping[str, Any]


def _object(text: str, name: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise Sdk3Error(f"{name}: not JSON ({error.msg})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Sdk3Error(f"{name}: expected a JSON object")
    return value


def _count(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Sdk3Error(f"{DISTRIBUTED_JSON}: process_count_per_node={value!r} is not >= 1")
    return value


def parse_sdk3_job(sourcecode_text: str, distributed_text: str, train_script: str) -> Sdk3Job:
    """The three files of the sm_drivers channel, as v3 writes them."""
    source = _object(sourcecode_text, SOURCECODE_JSON)
    distributed = _object(distributed_text, DISTRIBUTED_JSON)
    match = _DRIVER_LINE.search(train_script)
    options = distributed.get("mpi_additional_options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise Sdk3Error(f"{DISTRIBUTED_JSON}: mpi_additional_options is not a list of strings")
    if distributed.get("smp"):
        raise Sdk3Error(
            "Torchrun(smp=...): SageMaker model parallelism is not in this image; "
            "remove smp or use AWS's SMP container"
        )
    return Sdk3Job(
        driver=match.group(1) if match else None,
        entry_script=source.get("entry_script") or None,
        command=source.get("command") or None,
        source_dir=source.get("source_dir") or None,
        requirements=source.get("requirements") or None,
        process_count_per_node=_count(distributed.get("process_count_per_node")),
        mpi_additional_options=tuple(options),
        distributed=distributed,
    )


def read_sdk3_job(drivers_dir: Path) -> Sdk3Job:
    """Read the sm_drivers channel (v3 writes every file; distributed.json may be `{}`)."""

    def read(name: str) -> str:
        try:
            return (drivers_dir / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as error:
            raise Sdk3Error(f"{drivers_dir / name}: unreadable ({error})") from None

    if not (drivers_dir / TRAIN_SCRIPT).is_file():
        raise Sdk3Error(f"{drivers_dir / TRAIN_SCRIPT}: missing (the {DRIVERS_CHANNEL} channel)")
    return parse_sdk3_job(read(SOURCECODE_JSON), read(DISTRIBUTED_JSON), read(TRAIN_SCRIPT))


_BASIC_DRIVER = "basic_script_driver.py"
_PER_HOST: Mapping[str, Any] = {"sagemaker_mpi_enabled": False}
# Each v3 driver as the hyperparameters v2's estimators send for the same launch.
_DRIVERS: Mapping[str, Mapping[str, Any]] = {
    "mpi_driver.py": {"sagemaker_mpi_enabled": True},
    "torchrun_driver.py": {"sagemaker_torch_distributed_enabled": True},
    _BASIC_DRIVER: _PER_HOST,
}


@dataclasses.dataclass(frozen=True)
class Sdk3Request:
    """A v3 job as the contract reads it: the hyperparameters v2's estimators would have sent
    (the backend, ranks, mpirun options, the script), or v3's own command to run per host."""

    hyperparameters: Mapping[str, Any]
    # True: v3's own command (SDK3_COMMAND_ENV) runs once per host under `bash -c`, supervised
    # (a SourceCode.command, or a DistributedConfig of the user's own and its driver).
    runs_sdk_command: bool = False
    # SourceCode.requirements, relative to the code (None: requirements.txt, if present).
    requirements: str | None = None


def _submit_dir(job: Sdk3Job, code_dir: str) -> str:
    """v3 ships source_dir as the code channel; a .tar.gz source_dir arrives as that file."""
    source = job.source_dir or ""
    if source.endswith(".tar.gz"):
        return f"{code_dir}/{Path(source).name}"
    return code_dir


def sdk3_request(job: Sdk3Job, *, code_dir: str) -> Sdk3Request | None:
    """What the job runs; None for `command="train"` (our entry point itself: the contract
    reads as without v3)."""
    if job.command is not None:
        if job.command.strip() == "train":
            return None
        return Sdk3Request(_PER_HOST, runs_sdk_command=True)
    driver = _DRIVERS.get(job.driver or "")
    if job.entry_script is None or driver is None:
        # A DistributedConfig of the user's own: its driver runs, supervised per host.
        return Sdk3Request(_PER_HOST, runs_sdk_command=True)
    hyperparameters: dict[str, Any] = {
        "sagemaker_program": job.entry_script,
        "sagemaker_submit_directory": _submit_dir(job, code_dir),
        **driver,
    }
    if job.process_count_per_node is not None and driver is not _PER_HOST:
        hyperparameters["sagemaker_mpi_num_of_processes_per_host"] = job.process_count_per_node
    if job.mpi_additional_options:
        hyperparameters["sagemaker_mpi_custom_mpi_options"] = shlex.join(job.mpi_additional_options)
    return Sdk3Request(hyperparameters, requirements=job.requirements)


def sdk3_environment(
    job: Sdk3Job,
    *,
    hosts: tuple[str, ...],
    current_host: str,
    code_dir: str,
    master_host: str | None = None,
) -> dict[str, str]:
    """The variables v3's environment.py adds to the toolkit's (the rest are the same names):
    scripts written for v3 read them. The master is the job's (the distribution group's first
    host in a heterogeneous cluster), where v3 itself writes "algo-1"."""
    env = {
        "SM_MASTER_ADDR": master_host or hosts[0],
        "SM_MASTER_PORT": SDK3_MASTER_PORT,
        "SM_HOST_COUNT": str(len(hosts)),
        "SM_CURRENT_HOST_RANK": str(hosts.index(current_host)),
        "SM_SOURCE_DIR": code_dir,
    }
    if job.entry_script:
        env["SM_ENTRY_SCRIPT"] = job.entry_script
    if job.distributed:
        env["SM_DISTRIBUTED_CONFIG"] = json.dumps(dict(job.distributed))
    return env
