"""`train`: what SageMaker runs in every container of the job (`docker run IMAGE train`).

Reads and checks the whole contract before starting any process, so bad input fails in
seconds with one line in /opt/ml/output/failure; then hands over to `supervise`.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from entrypoint import protocol, sshkeys, supervise
from entrypoint.contract import (
    MODEL_DIR_PARAM,
    MPI_CUSTOM_OPTIONS_PARAM,
    Backend,
    BuiltinProgram,
    Contract,
    ContractError,
    ContractPaths,
    UserScript,
    read_contract,
)
from entrypoint.coordination import MasterChannel, WorkerChannel
from entrypoint.failure import Reason, format_failure, record_failure
from entrypoint.launchers import LocalPart, MpirunPart, OrtedPart, ProgramPart, TaskGroupPart
from entrypoint.plan import (
    JobPlan,
    build_mpirun_argv,
    format_command,
    host_tasks,
    make_plan,
    rank_environment,
    require_channel,
    sagemaker_environment,
    task_environment,
)
from entrypoint.tf_config import TaskType
from model.hparams import parse_hyperparameters
from tf_s3.model_dir import head_bucket_error_code, missing_bucket_message

log = logging.getLogger("entrypoint")

REQUIREMENTS_FILE = "requirements.txt"
# pip's own lines naming the requirement it could not install.
_PIP_FAILED_REQUIREMENT = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"Could not find a version that satisfies the requirement (\S+)"),
    re.compile(r"Failed to build (\S+)"),
    re.compile(r"Failed building wheel for (\S+)"),
)


def configure_logging(host: str, role: str, level: int = logging.INFO) -> None:
    """Logs go to stdout (SageMaker ships stdout to CloudWatch), host and role on every line."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s %(levelname)s host={host} role={role} entrypoint: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _validate_builtin_program(contract: Contract) -> None:
    """The built-in model's checks, before any process starts: its `train` channel and its
    hyperparameters (with the model's own parser)."""
    paths = contract.paths
    train_dir = paths.data_dir / "train"
    require_channel(contract, "train", channel_dir_exists=train_dir.is_dir())
    try:
        parse_hyperparameters(contract.program_hyperparameters)
    except ValueError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None


def failed_requirement(pip_output: str) -> str | None:
    """The requirement pip names as the one it could not install, if it names one."""
    for pattern in _PIP_FAILED_REQUIREMENT:
        match = pattern.search(pip_output)
        if match:
            return match.group(1).rstrip(".,:")
    return None


def last_error_line(output: str) -> str:
    """pip's last ERROR line (else its last line): the one that says what went wrong."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1]


def _install_requirements(code_dir: Path) -> None:
    """What the toolkit does for script mode (entry_point.install): pip install -r
    requirements.txt from the source directory, into the image's Python, on every host."""
    requirements = code_dir / REQUIREMENTS_FILE
    if not requirements.is_file():
        return
    log.info("installing %s from the source directory", REQUIREMENTS_FILE)
    command = [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--progress-bar", "off", "-r", REQUIREMENTS_FILE,
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=code_dir, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    for line in (result.stdout + result.stderr).splitlines():
        log.info("pip: %s", line)
    if result.returncode != 0:
        output = result.stdout + result.stderr
        package = failed_requirement(output)
        what = f"cannot install {package}" if package else "pip install failed"
        raise ContractError(f"{REQUIREMENTS_FILE}: {what} ({last_error_line(output)})")


def _prepare_user_code(program: UserScript, paths: ContractPaths) -> None:
    """Script mode: every host fetches the user's code before it serves ssh, so a worker that
    answers the master is a worker that can run the script."""
    if program.submit_dir != str(paths.code_dir):
        # Imported only here: it pulls in boto3 (0.27 s, more on a busy host), and code that
        # SageMaker already placed in /opt/ml/code needs no download.
        from sagemaker_training import files  # noqa: PLC0415

        log.info("fetching the user's code from %s", program.submit_dir)
        try:
            files.download_and_extract(program.submit_dir, str(paths.code_dir))
        except Exception as error:  # noqa: BLE001 - boto3/tarfile/OS errors all mean the same
            raise ContractError(
                f"sagemaker_submit_directory {program.submit_dir}: cannot fetch ({error})"
            ) from None
    script = paths.code_dir / program.program
    if not script.is_file():
        raise ContractError(
            f"sagemaker_program {program.program}: no such file in {paths.code_dir}"
        )
    # Before this host serves ssh or reports ready: a failed install fails the job here.
    _install_requirements(paths.code_dir)


def _job_seed(env: Mapping[str, str]) -> bytes:
    """The job's secret, from which the ssh keys and the channel key are derived."""
    seed = sshkeys.choose_seed(env)
    if seed is None:
        raise ContractError(
            f"no job identity for ssh: set {sshkeys.SeedSource.LAUNCHER_SECRET.value} "
            "(the launcher does) or TRAINING_JOB_NAME (SageMaker does)"
        )
    source, material = seed
    if source.is_weak:
        log.warning(
            "job keys derived from %s, which anyone who can describe the job can read; "
            "launch with a per-job %s secret for real isolation",
            source.value,
            sshkeys.SeedSource.LAUNCHER_SECRET.value,
        )
    return material


def _install_ssh_keys(seed: bytes) -> None:
    keys = sshkeys.derive_keys(seed)
    sshkeys.install_keys(keys)
    log.info("ssh keys installed (user key %s)", sshkeys.fingerprint(keys.user_public))


def _local_part(plan: JobPlan, argv: list[str], env: Mapping[str, str]) -> LocalPart:
    """This host's part of the job, by backend and role (launchers.py)."""
    if plan.backend is Backend.PER_HOST:
        return ProgramPart(plan.program_argv, env, plan.working_dir)
    if plan.backend.uses_tf_config:
        tasks = host_tasks(plan)
        # One task per host (MWMS) needs no prefix: its lines are the host's.
        prefixed = len(tasks) > 1
        processes = [
            (
                task.name,
                ProgramPart(
                    plan.program_argv,
                    task_environment(env, plan, task),
                    plan.working_dir,
                    prefix=f"[{task.name}] " if prefixed else "",
                ),
            )
            for task in tasks
        ]
        chief = next((task.name for task in tasks if task.type is TaskType.CHIEF), None)
        return TaskGroupPart(processes, chief)
    if plan.is_master:
        return MpirunPart(argv, env, None)
    return OrtedPart()


def _supervise(
    plan: JobPlan,
    part: LocalPart,
    config: supervise.ShellConfig,
    stop: threading.Event,
    *,
    job_key: bytes | None,
    command_for_log: str,
) -> int:
    """Open this host's end of the coordination channel (multi-host jobs) and run its loop."""
    if plan.is_master:
        channel = MasterChannel(job_key=job_key, workers=plan.worker_hosts) if job_key else None
        try:
            return supervise.run_master(
                plan, part, channel, config, stop, command_for_log=command_for_log
            )
        finally:
            if channel is not None:
                channel.close()
    if job_key is None:
        raise AssertionError("a worker always has a job key")
    worker_channel = WorkerChannel(
        job_key=job_key,
        host=plan.current_host,
        master=plan.master_host,
        deadline=supervise.master_arrival_deadline(config),
    )
    try:
        return supervise.run_worker(plan, part, worker_channel, config, stop)
    finally:
        worker_channel.close()


def run(env: Mapping[str, str], paths: ContractPaths) -> int:
    contract = read_contract(paths, env)
    role = "master" if contract.current_host == contract.master_host else "worker"
    configure_logging(contract.current_host, role, contract.settings.log_level)
    # The toolkit's SAGEMAKER_JOB_NAME, SAGEMAKER_REGION and SM_LOG_LEVEL reach the program.
    env = {**env, **contract.toolkit_environment}
    log.info(
        "job %s: hosts %s, interface %s",
        contract.job_name or "(unnamed)",
        ",".join(contract.hosts),
        contract.network_interface_name,
    )
    if contract.settings.custom_mpi_options:
        log.info(
            "%s: appending to mpirun: %s",
            MPI_CUSTOM_OPTIONS_PARAM,
            format_command(list(contract.settings.custom_mpi_options)),
        )
    if isinstance(contract.program, BuiltinProgram):
        _validate_builtin_program(contract)
    model_dir = contract.program_hyperparameters.get(MODEL_DIR_PARAM, "")
    if model_dir.startswith("s3://"):
        missing = missing_bucket_message(MODEL_DIR_PARAM, model_dir, head_bucket_error_code(env))
        if missing:
            raise ContractError(missing)
    gpu_count = supervise.detect_gpu_count()
    plan: JobPlan = make_plan(contract, gpu_count=gpu_count)
    if isinstance(contract.program, UserScript):
        _prepare_user_code(contract.program, paths)
    job_key = None
    if plan.is_multi_host:
        seed = _job_seed(env)
        job_key = protocol.derive_job_key(seed)
        if plan.backend.needs_ssh:
            _install_ssh_keys(seed)

    stop = threading.Event()
    supervise.install_stop_handlers(stop)
    config = supervise.ShellConfig(
        output_dir=paths.output_dir,
        host_wait_timeout_s=contract.host_wait_timeout_s,
        sigterm_grace_s=contract.sigterm_grace_s,
    )
    sm_env = sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=os.cpu_count() or 1)
    program_env = rank_environment(env, sm_env, plan)
    argv = build_mpirun_argv(plan, program_env)
    command = argv if plan.backend is Backend.MPI else list(plan.program_argv)
    part = _local_part(plan, argv, program_env)
    # sshd first: a worker that connects to the channel is one that mpirun can reach.
    sshd = supervise.Sshd(plan.current_host) if job_key and plan.backend.needs_ssh else None
    try:
        return _supervise(
            plan, part, config, stop, job_key=job_key, command_for_log=format_command(command)
        )
    finally:
        if sshd is not None:
            sshd.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print(f"usage: train (no arguments; got {' '.join(args)})", file=sys.stderr)
        return 64
    env = dict(os.environ)
    paths = ContractPaths(Path(env.get("SM_HVD_ML_ROOT", "/opt/ml")))
    configure_logging(env.get("SM_CURRENT_HOST", "?"), "starting")
    code = _run_reporting_failures(env, paths)
    # The last line of every host's log: when this host was done, and with what.
    log.info("exiting with code %d", code)
    return code


def _run_reporting_failures(env: Mapping[str, str], paths: ContractPaths) -> int:
    try:
        return run(env, paths)
    except ContractError as error:
        log.error("%s", format_failure(Reason.BAD_INPUT, str(error)))
        record_failure(paths.output_dir, Reason.BAD_INPUT, str(error))
        return 1
    except Exception as error:
        log.exception("entry point failed")
        record_failure(paths.output_dir, Reason.INTERNAL, f"{type(error).__name__}: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
