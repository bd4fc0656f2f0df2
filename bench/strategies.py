"""Measurement: the built-in model under Horovod (mpirun) and under tf.distribute's
MultiWorkerMirroredStrategy (TF_CONFIG), side by side in one run, and the MWMS fault figure.

- Accuracy and step time: the digits as PNG class folders (harness/digits.py), the accuracy
  benchmark's hyperparameters (bench/accuracy.py: epochs, batch_size per rank), so both
  backends see the same data, batch and schedule; at 1 and 2 hosts each. The step time is the
  median over the epochs after the first (tracing) of `batch_size * hosts / images_per_sec`
  from the metrics line, i.e. wall time per step including fit()'s per-epoch overhead.
- Fault: a user's MWMS script (tests/programs/mwms_keras.py) on FAULT_HOSTS hosts; once every
  host trains, algo-2's container is killed; the figure is from the killed container's exit to
  the last other container's exit (as bench/overhead.py measures Horovod's).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import statistics
from collections.abc import Mapping
from pathlib import Path

from bench.accuracy import BATCH_SIZE, EPOCHS, SPLIT_SEED, train_builtin_model
from bench.containers import RUN_ERRORS
from bench.launchers import host_names
from bench.workspace import Workspace
from harness.cluster import Cluster
from harness.digits import make_digits

log = logging.getLogger(__name__)

BACKENDS = ("horovod", "multi_worker_mirrored")
HOST_COUNTS = (1, 2)
FAULT_HOSTS = 3
FAULT_REPEATS = 2
FAULT_TIMEOUT_S = 60.0
PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "programs"
MWMS_HYPERPARAMETERS = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}
_IMAGES_PER_SEC = re.compile(r"epoch=(\d+) .*images_per_sec=([0-9.]+)")


@dataclasses.dataclass(frozen=True)
class StrategyRun:
    backend: str
    hosts: int
    test_accuracy: float | None
    step_s: float | None
    seconds: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class StrategyFault:
    hosts: int
    repeat: int
    # killed container exited -> last other container exited; None if not within the timeout
    detection_s: float | None
    exit_codes: dict[str, int | None]
    failure: str | None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class StrategiesResult:
    epochs: int
    batch_size: int
    runs: tuple[StrategyRun, ...]
    faults: tuple[StrategyFault, ...]


def step_seconds(log_text: str, batch_size: int, hosts: int) -> float | None:
    """Median wall time per step over the epochs after the first, from the metrics lines."""
    rates = [float(rate) for epoch, rate in _IMAGES_PER_SEC.findall(log_text) if int(epoch) > 1]
    rates = [rate for rate in rates if rate > 0]
    if not rates:
        return None
    return statistics.median(batch_size * hosts / rate for rate in rates)


def _train(space: Workspace, backend: str, hosts: int, channels: Mapping[str, Path]) -> StrategyRun:
    hyperparameters = {"epochs": str(EPOCHS), "batch_size": str(BATCH_SIZE)}
    if backend == "multi_worker_mirrored":
        hyperparameters.update(MWMS_HYPERPARAMETERS)
    trained = train_builtin_model(
        space, f"strategies-{backend}-{hosts}", hosts, channels, hyperparameters
    )
    if trained.metrics is None:
        return StrategyRun(backend, hosts, None, None, trained.seconds, error=trained.error)
    step = step_seconds(trained.master_log, BATCH_SIZE, hosts)
    return StrategyRun(backend, hosts, trained.metrics["test"]["accuracy"], step, trained.seconds)


def _fault(space: Workspace, repeat: int) -> StrategyFault:
    cluster = Cluster(
        docker=space.docker,
        image=space.image,
        root=space.cluster_root(f"strategies-fault-{repeat}"),
        hosts=host_names(FAULT_HOSTS),
        hyperparameters={
            **MWMS_HYPERPARAMETERS,
            "sagemaker_program": "mwms_keras.py",
            "seconds": "300",
        },
        code_dir=PROGRAMS,
    )
    victim = "algo-2"
    survivors = [host for host in cluster.hosts if host != victim]
    try:
        cluster.start()
        for host in cluster.hosts:
            cluster.wait_for_log(host, "MWMS_RUNNING", timeout=240)
        cluster.kill(victim)
        try:
            codes: dict[str, int | None] = dict(
                cluster.wait(FAULT_TIMEOUT_S, hosts=[victim, *survivors])
            )
            killed_at = cluster.exit_time(victim)
            detection = max(cluster.exit_time(host) for host in survivors) - killed_at
        except TimeoutError as error:
            return StrategyFault(FAULT_HOSTS, repeat, None, {}, None, error=str(error))
        return StrategyFault(FAULT_HOSTS, repeat, detection, codes, cluster.failure("algo-1"))
    finally:
        cluster.remove()


def measure_strategies(space: Workspace, quick: bool = False) -> StrategiesResult:
    channels = make_digits(space.root / "strategies-digits", seed=SPLIT_SEED)
    runs = []
    # Interleaved by host count, so that noise on a shared machine spreads over both.
    for hosts in (2,) if quick else HOST_COUNTS:
        for backend in BACKENDS:
            try:
                run = _train(space, backend, hosts, channels)
            except RUN_ERRORS as error:
                run = StrategyRun(backend, hosts, None, None, 0.0, error=f"{error}"[:500])
            log.info("strategies: %s", run)
            runs.append(run)
    faults = []
    for repeat in range(1 if quick else FAULT_REPEATS):
        try:
            fault = _fault(space, repeat)
        except RUN_ERRORS as error:
            fault = StrategyFault(FAULT_HOSTS, repeat, None, {}, None, error=f"{error}"[:500])
        log.info("strategies fault: %s", fault)
        faults.append(fault)
    return StrategiesResult(EPOCHS, BATCH_SIZE, tuple(runs), tuple(faults))


def strategies_from_json(raw: dict | None) -> StrategiesResult | None:
    if raw is None:
        return None
    return StrategiesResult(
        epochs=raw["epochs"],
        batch_size=raw["batch_size"],
        runs=tuple(StrategyRun(**run) for run in raw["runs"]),
        faults=tuple(StrategyFault(**fault) for fault in raw["faults"]),
    )


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def strategies_lines(result: StrategiesResult | None) -> list[str]:
    if result is None:
        return []
    label = {"horovod": "Horovod (mpirun)", "multi_worker_mirrored": "MWMS (TF_CONFIG)"}
    lines = [
        "### Backends: Horovod vs MultiWorkerMirroredStrategy",
        "",
        "The built-in model on the digits (PNG class folders, harness/digits.py), default "
        f"hyperparameters but epochs={result.epochs} and batch_size={result.batch_size} per "
        "rank, the same for both backends. Step: median wall time per step over the epochs "
        "after the first.",
        "",
        "| Backend | Hosts | Test accuracy | Step (ms) | Job (s) | Error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in result.runs:
        step_ms = None if run.step_s is None else run.step_s * 1000
        lines.append(
            f"| {label.get(run.backend, run.backend)} | {run.hosts} | "
            f"{_number(run.test_accuracy, 4)} | {_number(step_ms, 0)} | {run.seconds:.0f} | "
            f"{(run.error or '').replace('|', '/')} |"
        )
    if result.faults:
        lines += [
            "",
            "MWMS fault: a user's MWMS script on "
            f"{result.faults[0].hosts} hosts, algo-2's container killed mid-training; time from "
            "its exit to the last other host's exit.",
            "",
            "| Run | Every host down (s) | Exit codes | algo-1's failure line |",
            "| --- | --- | --- | --- |",
        ]
        for fault in result.faults:
            codes = ", ".join(f"{host}: {code}" for host, code in sorted(fault.exit_codes.items()))
            failure = (fault.failure or fault.error or "").replace("|", "/")
            lines.append(
                f"| {fault.repeat + 1} | {_number(fault.detection_s, 1)} | {codes} | {failure} |"
            )
    return [*lines, ""]
