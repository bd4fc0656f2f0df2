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

from entrypoint import sshkeys, supervise
from entrypoint.contract import (
    MPI_CUSTOM_OPTIONS_PARAM,
    MPI_ENABLED_PARAM,
    Backend,
    BuiltinProgram,
    Contract,
    ContractError,
    ContractPaths,
    UserScript,
    read_contract,
)
from entrypoint.failure import Reason, format_failure, record_failure
from entrypoint.plan import (
    JobPlan,
    build_mpirun_argv,
    format_command,
    make_plan,
    rank_environment,
    require_channel,
    sagemaker_environment,
)
from model.hparams import parse_hyperparameters

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
    # Imported here, not at the top: it pulls in boto3, a fifth of the entry point's start-up,
    # and only script mode needs it.
    from sagemaker_training import files  # noqa: PLC0415

    if program.submit_dir != str(paths.code_dir):
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


def _install_ssh_keys(env: Mapping[str, str]) -> None:
    seed = sshkeys.choose_seed(env)
    if seed is None:
        raise ContractError(
            f"no job identity for ssh: set {sshkeys.SeedSource.LAUNCHER_SECRET.value} "
            "(the launcher does) or TRAINING_JOB_NAME (SageMaker does)"
        )
    source, material = seed
    if source.is_weak:
        log.warning(
            "ssh keys derived from %s, which anyone who can describe the job can read; "
            "launch with a per-job %s secret for real isolation",
            source.value,
            sshkeys.SeedSource.LAUNCHER_SECRET.value,
        )
    keys = sshkeys.derive_keys(material)
    sshkeys.install_keys(keys)
    log.info("ssh keys installed (user key %s)", sshkeys.fingerprint(keys.user_public))


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
    if contract.backend is Backend.PER_HOST and len(contract.hosts) > 1:
        # Placeholder until the shell runs the program once per host and gathers the codes.
        raise ContractError(
            f"hyperparameter {MPI_ENABLED_PARAM}=false with {len(contract.hosts)} hosts (the "
            "program once per host, independently) is not supported yet: enable mpi "
            "(distribution={'mpi': {'enabled': True}}) or use one host"
        )
    if isinstance(contract.program, BuiltinProgram):
        _validate_builtin_program(contract)
    gpu_count = supervise.detect_gpu_count()
    plan: JobPlan = make_plan(contract, gpu_count=gpu_count)
    if isinstance(contract.program, UserScript):
        _prepare_user_code(contract.program, paths)
    if plan.is_multi_host:
        _install_ssh_keys(env)

    stop = threading.Event()
    supervise.install_stop_handlers(stop)
    config = supervise.ShellConfig(
        output_dir=paths.output_dir,
        host_wait_timeout_s=contract.host_wait_timeout_s,
        sigterm_grace_s=contract.sigterm_grace_s,
    )
    if not plan.is_master:
        return supervise.run_worker(plan, config, stop)
    sm_env = sagemaker_environment(contract, gpu_count=gpu_count, cpu_count=os.cpu_count() or 1)
    mpirun_env = rank_environment(env, sm_env, plan)
    argv = build_mpirun_argv(plan, mpirun_env)
    return supervise.run_master(
        plan,
        mpirun_argv=argv,
        mpirun_env=mpirun_env,
        config=config,
        stop=stop,
        command_for_log=format_command(argv),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print(f"usage: train (no arguments; got {' '.join(args)})", file=sys.stderr)
        return 64
    env = dict(os.environ)
    paths = ContractPaths(Path(env.get("SM_HVD_ML_ROOT", "/opt/ml")))
    configure_logging(env.get("SM_CURRENT_HOST", "?"), "starting")
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
