"""The SageMaker training contract, parsed once into frozen dataclasses.

https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html

The platform writes three JSON files under /opt/ml/input/config and sets TRAINING_JOB_NAME
(and TRAINING_JOB_ARN); it does not set the SM_* variables: those are the sagemaker-training
toolkit's derivations, so when a user (or SageMaker local mode) sets SM_HOSTS / SM_CURRENT_HOST
they override the files. Everything here is pure: `parse_contract` takes texts and a mapping.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Hyperparameters that belong to the entry point and are not passed to the training program.
RANKS_PER_HOST = "ranks_per_host"
HOST_WAIT_TIMEOUT = "host_wait_timeout"
SIGTERM_GRACE_SECONDS = "sigterm_grace_seconds"
ENTRYPOINT_HYPERPARAMETERS = (RANKS_PER_HOST, HOST_WAIT_TIMEOUT, SIGTERM_GRACE_SECONDS)
# The toolkit's own parameters (sagemaker_program, sagemaker_region, ...) share this prefix.
SAGEMAKER_PREFIX = "sagemaker_"
PROGRAM_PARAM = "sagemaker_program"
SUBMIT_DIR_PARAM = "sagemaker_submit_directory"

DEFAULT_HOST_WAIT_TIMEOUT_S = 300.0
# SageMaker sends SIGKILL 120 s after SIGTERM; leave room for mpirun and the workers to end.
DEFAULT_SIGTERM_GRACE_S = 90.0

# RFC 1123 labels: what Docker and SageMaker accept as host names.
_HOST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,251}[A-Za-z0-9])?$")
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
_HYPERPARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


class ContractError(ValueError):
    """The SageMaker contract is unusable; the message is one line naming the source."""


@dataclasses.dataclass(frozen=True)
class ContractPaths:
    """Where the contract lives; the defaults are SageMaker's."""

    ml_root: Path = Path("/opt/ml")

    @property
    def config_dir(self) -> Path:
        return self.ml_root / "input" / "config"

    @property
    def resource_config(self) -> Path:
        return self.config_dir / "resourceconfig.json"

    @property
    def hyperparameters(self) -> Path:
        return self.config_dir / "hyperparameters.json"

    @property
    def input_data_config(self) -> Path:
        return self.config_dir / "inputdataconfig.json"

    @property
    def data_dir(self) -> Path:
        return self.ml_root / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.ml_root / "model"

    @property
    def output_dir(self) -> Path:
        return self.ml_root / "output"

    @property
    def code_dir(self) -> Path:
        return self.ml_root / "code"


@dataclasses.dataclass(frozen=True)
class BuiltinProgram:
    """The image's own training program, `python -m model.train`."""


@dataclasses.dataclass(frozen=True)
class UserScript:
    """Script mode: the user's entry point, from a local directory or an s3:// tarball."""

    program: str
    submit_dir: str


Program = BuiltinProgram | UserScript


@dataclasses.dataclass(frozen=True)
class EntrypointSettings:
    """The entry point's own hyperparameters."""

    ranks_per_host: int | None = None
    host_wait_timeout_s: float = DEFAULT_HOST_WAIT_TIMEOUT_S
    sigterm_grace_s: float = DEFAULT_SIGTERM_GRACE_S


@dataclasses.dataclass(frozen=True)
class Contract:
    """What one host knows about the job before any process starts."""

    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str
    current_instance_type: str
    # Hyperparameters for the training program, JSON-decoded as the SageMaker SDK encodes them,
    # as strings; the entry point's own and the toolkit's sagemaker_* ones are removed.
    program_hyperparameters: Mapping[str, str]
    # Every hyperparameter as given, decoded: what SM_HPS and SM_HP_* carry.
    all_hyperparameters: Mapping[str, Any]
    channels: tuple[str, ...]
    input_data_config: Mapping[str, Any]
    resource_config: Mapping[str, Any]
    program: Program
    settings: EntrypointSettings
    job_name: str | None
    paths: ContractPaths = ContractPaths()

    @property
    def master_host(self) -> str:
        return choose_master(self.hosts)

    @property
    def ranks_per_host(self) -> int | None:
        return self.settings.ranks_per_host

    @property
    def host_wait_timeout_s(self) -> float:
        return self.settings.host_wait_timeout_s

    @property
    def sigterm_grace_s(self) -> float:
        return self.settings.sigterm_grace_s


def choose_master(hosts: tuple[str, ...]) -> str:
    """The master is the first host of the sorted list: algo-1 on SageMaker, and still a single
    deterministic choice when local runs use other names."""
    if not hosts:
        raise ContractError("the host list is empty")
    return sorted(hosts)[0]


def decode_hyperparameter(value: Any) -> Any:
    """Undo the SageMaker Python SDK's JSON encoding of values (`"\\"adam\\""`, `"10"`), as the
    toolkit's read_hyperparameters does; anything that is not JSON stays the string it was."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def hyperparameter_text(value: Any) -> str:
    """The command-line form of a decoded hyperparameter: strings as they are, JSON otherwise
    (so booleans stay `true`/`false` and lists stay parseable)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _load_json_object(text: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ContractError(f"{source}: malformed JSON ({error})") from None
    if not isinstance(value, dict):
        raise ContractError(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value


def _parse_hosts_env(text: str) -> tuple[str, ...]:
    try:
        hosts = json.loads(text)
    except ValueError:
        # Tolerate the comma-separated form people type by hand.
        hosts = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"SM_HOSTS: expected a JSON list of host names, got {text!r}")
    return tuple(hosts)


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


def parse_entrypoint_settings(hyperparameters: Mapping[str, Any]) -> EntrypointSettings:
    """Read the entry point's own hyperparameters (decoded values); the launcher checks a job's
    request with this same function before it is sent."""

    def seconds(name: str, default: float) -> float:
        if name not in hyperparameters:
            return default
        return _positive_number(name, hyperparameters[name], integer=False)

    ranks = None
    if RANKS_PER_HOST in hyperparameters:
        ranks = int(_positive_number(RANKS_PER_HOST, hyperparameters[RANKS_PER_HOST], integer=True))
    return EntrypointSettings(
        ranks_per_host=ranks,
        host_wait_timeout_s=seconds(HOST_WAIT_TIMEOUT, DEFAULT_HOST_WAIT_TIMEOUT_S),
        sigterm_grace_s=seconds(SIGTERM_GRACE_SECONDS, DEFAULT_SIGTERM_GRACE_S),
    )


def program_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, str]:
    """What the training program gets: all but the entry point's and the toolkit's own."""
    return {
        name: hyperparameter_text(value)
        for name, value in sorted(hyperparameters.items())
        if name not in ENTRYPOINT_HYPERPARAMETERS and not name.startswith(SAGEMAKER_PREFIX)
    }


def _parse_program(hyperparameters: Mapping[str, Any], env: Mapping[str, str]) -> Program:
    program = env.get("SAGEMAKER_PROGRAM") or hyperparameters.get(PROGRAM_PARAM)
    submit_dir = env.get("SAGEMAKER_SUBMIT_DIRECTORY") or hyperparameters.get(SUBMIT_DIR_PARAM)
    if program in (None, ""):
        if submit_dir not in (None, ""):
            raise ContractError(
                f"hyperparameter {SUBMIT_DIR_PARAM} is set but {PROGRAM_PARAM} is not: "
                "name the script to run"
            )
        return BuiltinProgram()
    if not isinstance(program, str):
        raise ContractError(f"hyperparameter {PROGRAM_PARAM}={program!r} is not a file name")
    if Path(program).is_absolute() or ".." in Path(program).parts:
        raise ContractError(
            f"hyperparameter {PROGRAM_PARAM}={program!r} must be relative to the submit directory"
        )
    return UserScript(program=program, submit_dir=str(submit_dir or "/opt/ml/code"))


def _parse_hosts(
    resource_config: Mapping[str, Any], env: Mapping[str, str], resource_source: str
) -> tuple[str, ...]:
    if "SM_HOSTS" in env:
        hosts = _parse_hosts_env(env["SM_HOSTS"])
        source = "SM_HOSTS"
    else:
        raw_hosts = resource_config.get("hosts")
        if not isinstance(raw_hosts, list) or not all(isinstance(h, str) for h in raw_hosts):
            raise ContractError(f"{resource_source}: 'hosts' must be a list of host names")
        hosts = tuple(raw_hosts)
        source = resource_source
    if not hosts:
        raise ContractError(f"{source}: the host list is empty")
    for host in hosts:
        if not _HOST_NAME.match(host):
            raise ContractError(f"{source}: {host!r} is not a valid host name")
    duplicates = sorted({host for host in hosts if hosts.count(host) > 1})
    if duplicates:
        raise ContractError(f"{source}: duplicate hosts {', '.join(duplicates)}")
    return hosts


def _parse_current_host(
    resource_config: Mapping[str, Any],
    env: Mapping[str, str],
    hosts: tuple[str, ...],
    resource_source: str,
) -> str:
    current_host = env.get("SM_CURRENT_HOST") or resource_config.get("current_host")
    source = "SM_CURRENT_HOST" if env.get("SM_CURRENT_HOST") else resource_source
    if not isinstance(current_host, str) or not current_host:
        raise ContractError(f"{resource_source}: 'current_host' is missing")
    if current_host not in hosts:
        raise ContractError(
            f"{source}: current host {current_host!r} is not in the host list [{', '.join(hosts)}]"
        )
    return current_host


def _decode_hyperparameters(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    decoded = {}
    for name, value in raw.items():
        if not _HYPERPARAMETER_NAME.match(name):
            raise ContractError(f"{source}: {name!r} is not a valid name")
        decoded[name] = decode_hyperparameter(value)
    return decoded


def _check_channels(input_data_config: Mapping[str, Any], source: str) -> None:
    for channel, config in input_data_config.items():
        if not _CHANNEL_NAME.match(channel):
            raise ContractError(f"{source}: {channel!r} is not a channel name")
        if not isinstance(config, dict):
            raise ContractError(f"{source}: channel {channel!r} must map to an object")


def parse_contract(
    *,
    resource_config_text: str,
    hyperparameters_text: str | None,
    input_data_config_text: str | None,
    env: Mapping[str, str],
    paths: ContractPaths = ContractPaths(),
) -> Contract:
    """Turn the contract's file contents and environment into a Contract, or raise
    ContractError with one line that names the file or variable at fault."""
    resource_source = str(paths.resource_config)
    resource_config = _load_json_object(resource_config_text, resource_source)
    raw_hyperparameters = (
        _load_json_object(hyperparameters_text, str(paths.hyperparameters))
        if hyperparameters_text is not None
        else {}
    )
    input_data_config = (
        _load_json_object(input_data_config_text, str(paths.input_data_config))
        if input_data_config_text is not None
        else {}
    )
    hosts = _parse_hosts(resource_config, env, resource_source)
    current_host = _parse_current_host(resource_config, env, hosts, resource_source)
    interface = resource_config.get("network_interface_name", "eth0")
    if not isinstance(interface, str) or not _INTERFACE_NAME.match(interface):
        raise ContractError(
            f"{resource_source}: network_interface_name {interface!r} is not an interface name"
        )
    decoded = _decode_hyperparameters(raw_hyperparameters, str(paths.hyperparameters))
    _check_channels(input_data_config, str(paths.input_data_config))
    try:
        settings = parse_entrypoint_settings(decoded)
    except ContractError as error:
        raise ContractError(f"{paths.hyperparameters}: {error}") from None
    return Contract(
        current_host=current_host,
        hosts=tuple(sorted(hosts)),
        network_interface_name=interface,
        current_instance_type=str(resource_config.get("current_instance_type", "local")),
        program_hyperparameters=program_hyperparameters(decoded),
        all_hyperparameters=decoded,
        channels=tuple(sorted(input_data_config)),
        input_data_config=input_data_config,
        resource_config=resource_config,
        program=_parse_program(decoded, env),
        settings=settings,
        job_name=env.get("TRAINING_JOB_NAME") or None,
        paths=paths,
    )


def read_contract(paths: ContractPaths, env: Mapping[str, str]) -> Contract:
    """Read the contract files (hyperparameters and input data config are optional, as the
    platform omits them when empty) and parse them."""

    def read(path: Path, *, required: bool) -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if required:
                raise ContractError(f"{path}: missing (is /opt/ml mounted?)") from None
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ContractError(f"{path}: unreadable ({error})") from None

    resource_text = read(paths.resource_config, required="SM_HOSTS" not in env)
    if resource_text is None:
        # SM_HOSTS and SM_CURRENT_HOST alone describe the cluster.
        resource_text = "{}"
    return parse_contract(
        resource_config_text=resource_text,
        hyperparameters_text=read(paths.hyperparameters, required=False),
        input_data_config_text=read(paths.input_data_config, required=False),
        env=env,
        paths=paths,
    )
