"""The entry point's own settings: every hyperparameter of ours (and the toolkit's that the
launch reads: ranks per host, custom mpirun options, the log level), parsed once with one-line
errors into EntrypointSettings. The launcher checks a request with the same functions. Pure."""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Mapping
from typing import Any

from entrypoint.contract import (
    DEFAULT_HOST_WAIT_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS,
    DEFAULT_SIGTERM_GRACE_S,
    DEFAULT_STALL_TIMEOUT_S,
    HOST_WAIT_TIMEOUT,
    LOG_LEVEL_PARAM,
    MAX_RESTARTS,
    MAX_RESTARTS_WITHOUT_PROGRESS,
    MIN_STALL_TIMEOUT_S,
    MPI_CUSTOM_OPTIONS_PARAM,
    MPI_PROCESSES_PER_HOST_PARAM,
    MPI_REMOTE_SHELL,
    ORTED_CALLBACK_TIMEOUT,
    PS_ENABLED_PARAM,
    PS_LAYOUT,
    PS_LAYOUTS,
    RANKS_PER_HOST,
    SIGTERM_GRACE_SECONDS,
    SMDDP_CUSTOM_OPTIONS_PARAM,
    STALL_TIMEOUT_SECONDS,
    Backend,
    ContractError,
    EntrypointSettings,
    RemoteShell,
    hyperparameter_text,
)
from entrypoint.contract.distribution import check_distribution_supported, choose_backend


def _positive_number(name: str, raw: Any, *, integer: bool) -> float:
    text = hyperparameter_text(raw)
    try:
        number = int(text) if integer else float(text)
    except ValueError:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ContractError(f"hyperparameter {name}={text!r} is not {kind}") from None
    if not math.isfinite(number) or number <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ContractError(f"hyperparameter {name}={text!r} is not {kind}")
    return number


def _seconds_or_off(name: str, raw: Any, *, floor: float = 0.0) -> float:
    """A number of seconds (at least `floor`), or 0 for off."""
    text = hyperparameter_text(raw)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ContractError(
            f"hyperparameter {name}={text!r} is not a number of seconds (0 turns it off)"
        )
    if 0 < number < floor:
        raise ContractError(
            f"hyperparameter {name}={text!r} is below its floor of {floor:.0f} s (0 turns it off)"
        )
    return number


def _count(hyperparameters: Mapping[str, Any], name: str, default: int, *, least: int) -> int:
    """A whole number of at least `least` (max_restarts: 0 turns restarts off)."""
    if name not in hyperparameters:
        return default
    text = hyperparameter_text(hyperparameters[name]).strip()
    if not text.isdigit() or int(text) < least:
        kind = "a whole number (0 turns it off)" if least == 0 else f"a whole number >= {least}"
        raise ContractError(f"hyperparameter {name}={text!r} is not {kind}")
    return int(text)


def _requested_ranks_per_host(hyperparameters: Mapping[str, Any]) -> int | None:
    """ranks_per_host is the short name of the toolkit's sagemaker_mpi_num_of_processes_per_host
    (what the SDK's distribution={"mpi": {"processes_per_host": N}} sends); both may be given
    only if they agree."""
    values = {
        name: int(_positive_number(name, hyperparameters[name], integer=True))
        for name in (RANKS_PER_HOST, MPI_PROCESSES_PER_HOST_PARAM)
        if name in hyperparameters
    }
    if len(set(values.values())) > 1:
        given = " and ".join(f"{name}={value}" for name, value in values.items())
        raise ContractError(f"hyperparameters {given} disagree: give one of them")
    return next(iter(values.values()), None)


def parse_custom_mpi_options(text: str, name: str = MPI_CUSTOM_OPTIONS_PARAM) -> tuple[str, ...]:
    """sagemaker_mpi_custom_mpi_options, split as a shell would. The toolkit's one option of its
    own, `--NCCL_DEBUG LEVEL` (sagemaker_training/mpi.py _parse_custom_mpi_options), becomes
    what the toolkit makes of it: `-x NCCL_DEBUG=LEVEL`; everything else goes to mpirun as is."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise ContractError(f"hyperparameter {name}={text!r} cannot be split ({error})") from None
    options: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--NCCL_DEBUG" or word.startswith("--NCCL_DEBUG="):
            if "=" in word:
                level = word.partition("=")[2]
            elif index + 1 < len(words):
                index += 1
                level = words[index]
            else:
                level = ""
            if not level:
                raise ContractError(f"hyperparameter {name}={text!r}: --NCCL_DEBUG needs a level")
            options += ["-x", f"NCCL_DEBUG={level}"]
        else:
            options.append(word)
        index += 1
    return tuple(options)


def _log_level(raw: Any) -> int:
    """sagemaker_container_log_level: a logging level number, as the SDK sends it (20 for
    INFO), or its name."""
    text = hyperparameter_text(raw).strip()
    if text.isdigit() and 0 <= int(text) <= logging.CRITICAL:
        return int(text)
    level = logging.getLevelName(text.upper())
    if isinstance(level, int):
        return level
    raise ContractError(
        f"hyperparameter {LOG_LEVEL_PARAM}={text!r} is not a logging level "
        "(10, 20, 30, 40, 50 or DEBUG, INFO, WARNING, ERROR, CRITICAL)"
    )


def _custom_mpi_options(hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
    """mpi's custom_mpi_options, then the data-parallel library's (the SDK sends "" for each
    distribution that has none)."""
    options: list[str] = []
    for name in (MPI_CUSTOM_OPTIONS_PARAM, SMDDP_CUSTOM_OPTIONS_PARAM):
        value = hyperparameters.get(name)
        if value not in (None, ""):
            options += parse_custom_mpi_options(hyperparameter_text(value), name)
    return tuple(options)


def parse_entrypoint_settings(hyperparameters: Mapping[str, Any]) -> EntrypointSettings:
    """Read the entry point's own hyperparameters and the toolkit's it acts on (decoded values);
    the launcher checks a job's request with this same function before it is sent."""

    def seconds(name: str, default: float) -> float:
        if name not in hyperparameters:
            return default
        return _positive_number(name, hyperparameters[name], integer=False)

    check_distribution_supported(hyperparameters)
    ranks = _requested_ranks_per_host(hyperparameters)
    backend = choose_backend(hyperparameters, ranks)
    return EntrypointSettings(
        ranks_per_host=ranks,
        host_wait_timeout_s=seconds(HOST_WAIT_TIMEOUT, DEFAULT_HOST_WAIT_TIMEOUT_S),
        sigterm_grace_s=seconds(SIGTERM_GRACE_SECONDS, DEFAULT_SIGTERM_GRACE_S),
        stall_timeout_s=(
            _seconds_or_off(
                STALL_TIMEOUT_SECONDS,
                hyperparameters[STALL_TIMEOUT_SECONDS],
                floor=MIN_STALL_TIMEOUT_S,
            )
            if STALL_TIMEOUT_SECONDS in hyperparameters
            else DEFAULT_STALL_TIMEOUT_S
        ),
        max_restarts=_count(hyperparameters, MAX_RESTARTS, DEFAULT_MAX_RESTARTS, least=0),
        max_restarts_without_progress=_count(
            hyperparameters,
            MAX_RESTARTS_WITHOUT_PROGRESS,
            DEFAULT_MAX_RESTARTS_WITHOUT_PROGRESS,
            least=1,
        ),
        backend=backend,
        custom_mpi_options=_custom_mpi_options(hyperparameters),
        log_level=(
            _log_level(hyperparameters[LOG_LEVEL_PARAM])
            if LOG_LEVEL_PARAM in hyperparameters
            else logging.INFO
        ),
        remote_shell=_remote_shell(
            hyperparameters.get(MPI_REMOTE_SHELL, RemoteShell.CHANNEL.value)
        ),
        orted_callback_timeout_s=(
            seconds(ORTED_CALLBACK_TIMEOUT, 0.0)
            if ORTED_CALLBACK_TIMEOUT in hyperparameters
            else None
        ),
        ps_layout=_ps_layout(hyperparameters, backend),
    )


def _ps_layout(hyperparameters: Mapping[str, Any], backend: Backend) -> str:
    if PS_LAYOUT not in hyperparameters:
        return PS_LAYOUTS[0]
    value = hyperparameters[PS_LAYOUT]
    text = hyperparameter_text(value).strip().lower()
    if text not in PS_LAYOUTS:
        raise ContractError(f"{PS_LAYOUT}={value!r}: expected one of {', '.join(PS_LAYOUTS)}")
    if backend is not Backend.PARAMETER_SERVER:
        raise ContractError(
            f"{PS_LAYOUT}={text} applies to parameter servers only: set {PS_ENABLED_PARAM}=true "
            f"or remove it"
        )
    return text


def _remote_shell(value: Any) -> RemoteShell:
    text = hyperparameter_text(value).strip().lower()
    try:
        return RemoteShell(text)
    except ValueError:
        choices = ", ".join(shell.value for shell in RemoteShell)
        raise ContractError(f"{MPI_REMOTE_SHELL}={value!r}: expected one of {choices}") from None
