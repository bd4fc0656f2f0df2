"""Script mode: the user's code on every host before anything starts, as the toolkit does.

The code is fetched from `sagemaker_submit_directory` (an s3:// tarball) unless SageMaker
already placed it in /opt/ml/code, then its requirements.txt is installed with pip; a failure
of either is one line naming the package or the source, before any host serves ssh or reports
ready. The only module besides `supervise` and `launchers` that starts a process (pip).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from entrypoint.contract import ContractError, ContractPaths, UserScript
from smcommon.pipoutput import failed_requirement, last_error_line

log = logging.getLogger("entrypoint")

REQUIREMENTS_FILE = "requirements.txt"
# How long pip gets to exit on SIGTERM when the host stops during its install.
GROUP_END_WAIT_S = 2.0


def install_requirements(code_dir: Path, name: str = REQUIREMENTS_FILE) -> None:
    """What the toolkit does for script mode (entry_point.install): pip install -r
    requirements.txt (or SDK v3's SourceCode.requirements) from the source directory, into the
    image's Python, on every host."""
    requirements = code_dir / name
    if not requirements.is_file():
        return
    log.info("installing %s from the source directory", name)
    command = [
        sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
        "--progress-bar", "off", "-r", name,
    ]  # fmt: skip
    returncode, output = run_own_group(command, code_dir)
    for line in output.splitlines():
        log.info("pip: %s", line)
    if returncode != 0:
        package = failed_requirement(output)
        what = f"cannot install {package}" if package else "pip install failed"
        raise ContractError(f"{name}: {what} ({last_error_line(output)})")


def run_own_group(command: Sequence[str], cwd: Path) -> tuple[int, str]:
    """Run `command` in its own session and return its exit code and output (stdout, then
    stderr). Whatever interrupts the wait (a stop during set-up raises SetupStopped here) ends
    the command's whole process group first: pip's build backends and compilers are its
    children, and ours to end."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        _end_group(process)
        raise
    return process.returncode, stdout + stderr


def _end_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the group, GROUP_END_WAIT_S for the leader, then SIGKILL to the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(GROUP_END_WAIT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def prepare_user_code(program: UserScript, paths: ContractPaths) -> None:
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
    install_requirements(paths.code_dir, program.requirements)
