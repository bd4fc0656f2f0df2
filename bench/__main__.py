"""`python -m bench`: every measurement in one run, then the report.

python -m bench --image sm-horovod:cpu --docker docker --out bench/results
python -m bench --quick          # 1 run each, 2 hosts only, small tensors (~8 minutes)
python -m bench --only accuracy  # one measurement, merged into the existing results.json
python -m bench --only serving   # serve vs Flask, KServe, MLServer, a floor (~12 min)
python -m bench --only strategies  # Horovod vs MultiWorkerMirroredStrategy, and the MWMS fault
python -m bench --only torch       # our torch backend vs bare torchrun (--torch-image)
python -m bench --only watchdog    # what stall detection costs a healthy job (off vs default)
python -m bench --only restart     # a restart in place after a killed rank, beside a fresh start
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from bench.accuracy import AccuracyResult, measure_accuracy
from bench.bandwidth import BandwidthResult, measure_bandwidth
from bench.image import ImageResult, measure_image
from bench.launchers import Launcher
from bench.machine import describe_machine
from bench.overhead import FaultRun, OverheadRun, measure_fault, measure_overhead
from bench.pipeline import PipelineResult, measure_pipeline
from bench.provenance import Provenance, start_measuring
from bench.report import Results, load_results, write_report
from bench.restart import RestartResult, measure_restart
from bench.serving import ServingResult, measure_serving
from bench.strategies import StrategiesResult, measure_strategies
from bench.torch_backend import DEFAULT_IMAGE as DEFAULT_TORCH_IMAGE
from bench.torch_backend import TorchResult, image_exists, measure_torch
from bench.watchdog import WatchdogResult, measure_watchdog
from bench.workspace import Workspace, workspace

log = logging.getLogger("bench")

MEASUREMENTS = (
    "overhead",
    "fault",
    "bandwidth",
    "pipeline",
    "rebuild",
    "accuracy",
    "serving",
    "strategies",
    "torch",
    "watchdog",
    "restart",
)
# Which field of Results each measurement fills (for --only's merge).
RESULT_FIELDS = {
    "overhead": "overhead_runs",
    "fault": "fault_runs",
    "bandwidth": "bandwidth",
    "pipeline": "pipeline",
    "rebuild": "image",
    "accuracy": "accuracy",
    "serving": "serving",
    "strategies": "strategies",
    "torch": "torch_backend",
    "watchdog": "watchdog",
    "restart": "restart",
}
# How long a fault run waits for the surviving hosts: the toolkit's workers poll for the
# master's status file every 30 s and check the master only every 2 minutes.
FAULT_TIMEOUT_S = {Launcher.OURS: 60.0, Launcher.TOOLKIT: 240.0}


@dataclasses.dataclass(frozen=True)
class Settings:
    image: str
    docker: str
    out: Path
    quick: bool
    repeats: int
    hosts: tuple[int, ...]
    fault_hosts: int
    fault_repeats: int
    toolkit_fault_repeats: int
    sizes_mb: tuple[int, ...]
    pipeline_seconds: float
    skip: frozenset[str]
    keep_scratch: bool
    render_only: bool
    only: str | None = None
    torch_image: str = DEFAULT_TORCH_IMAGE


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="sm-horovod:cpu", help="the CPU flavor's tag")
    parser.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    parser.add_argument(
        "--torch-image",
        default=DEFAULT_TORCH_IMAGE,
        help="the torch CPU image, for `torch` (skipped if it does not exist)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="1 run each, 2 hosts, small tensors")
    parser.add_argument("--repeats", type=int, help="runs per overhead figure (default 3)")
    parser.add_argument("--hosts", help="host counts, comma-separated (default 2,3,4)")
    parser.add_argument(
        "--toolkit-fault-repeats",
        type=int,
        help="fault runs of the toolkit, which take minutes each (default 1)",
    )
    parser.add_argument("--skip", action="append", default=[], choices=MEASUREMENTS)
    parser.add_argument(
        "--only",
        choices=MEASUREMENTS,
        help="run this measurement alone and merge it into OUT/results.json",
    )
    parser.add_argument("--keep-scratch", action="store_true", help="keep the temp folder")
    parser.add_argument(
        "--render",
        action="store_true",
        help="only re-render results.md and overhead.png from OUT/results.json",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    hosts = args.hosts or ("2" if args.quick else "2,3,4")
    return Settings(
        image=args.image,
        docker=args.docker,
        out=args.out,
        quick=args.quick,
        repeats=repeats,
        hosts=tuple(int(count) for count in hosts.split(",")),
        fault_hosts=2 if args.quick else 3,
        fault_repeats=repeats,
        toolkit_fault_repeats=args.toolkit_fault_repeats or 1,
        sizes_mb=(1, 4) if args.quick else (1, 4, 16, 64, 256),
        pipeline_seconds=2.0 if args.quick else 5.0,
        skip=frozenset(set(MEASUREMENTS) - {args.only} if args.only else set(args.skip)),
        only=args.only,
        keep_scratch=args.keep_scratch,
        render_only=args.render,
        torch_image=args.torch_image,
    )


def overhead_runs(space: Workspace, settings: Settings) -> list[OverheadRun]:
    """Interleaved (repeat, hosts, launcher), so that noise on a shared machine spreads over
    every launcher instead of landing on one."""
    return [
        measure_overhead(space, launcher, hosts, repeat)
        for repeat in range(settings.repeats)
        for hosts in settings.hosts
        for launcher in Launcher
    ]


def fault_runs(space: Workspace, settings: Settings) -> list[FaultRun]:
    runs = [
        measure_fault(
            space, Launcher.OURS, settings.fault_hosts, repeat, FAULT_TIMEOUT_S[Launcher.OURS]
        )
        for repeat in range(settings.fault_repeats)
    ]
    runs += [
        measure_fault(
            space, Launcher.TOOLKIT, settings.fault_hosts, repeat, FAULT_TIMEOUT_S[Launcher.TOOLKIT]
        )
        for repeat in range(settings.toolkit_fault_repeats)
    ]
    return runs


T = TypeVar("T")


@dataclasses.dataclass
class SectionRecorder:
    """Runs each section's measurement and keeps its own provenance (date, commit, machine,
    load before and after, duration), under the section's name in MEASUREMENTS."""

    settings: Settings
    sections: dict[str, Provenance] = dataclasses.field(default_factory=dict)

    def measure(self, name: str, measurement: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        started = start_measuring(settings_text(self.settings))
        value = measurement(*args, **kwargs)
        self.sections[name] = started.finish()
        log.info("%s: took %.1f s", name, self.sections[name].seconds)
        return value


def settings_text(settings: Settings) -> str:
    return "`--quick`, 1 run each" if settings.quick else f"medians of {settings.repeats} runs"


def run(settings: Settings) -> Results:
    started = time.monotonic()
    machine = describe_machine(settings.docker, settings.image)
    log.info("machine: %s", machine)
    recorder = SectionRecorder(settings)
    measure = recorder.measure
    overhead: list[OverheadRun] = []
    faults: list[FaultRun] = []
    bandwidth: BandwidthResult | None = None
    pipeline: PipelineResult | None = None
    image: ImageResult | None = None
    accuracy: AccuracyResult | None = None
    serving: ServingResult | None = None
    strategies: StrategiesResult | None = None
    torch_backend: TorchResult | None = None
    watchdog: WatchdogResult | None = None
    restart: RestartResult | None = None
    if "serving" not in settings.skip:
        serving = measure("serving", measure_serving, settings.docker, settings.image,
                          quick=settings.quick)  # fmt: skip
    with workspace(settings.docker, settings.image, keep=settings.keep_scratch) as space:
        if "overhead" not in settings.skip:
            overhead = measure("overhead", overhead_runs, space, settings)
        if "fault" not in settings.skip:
            faults = measure("fault", fault_runs, space, settings)
        if "bandwidth" not in settings.skip:
            bandwidth = measure("bandwidth", measure_bandwidth, space, settings.sizes_mb)
        if "pipeline" not in settings.skip:
            pipeline = measure("pipeline", measure_pipeline, space, settings.pipeline_seconds)
        if "accuracy" not in settings.skip:
            accuracy = measure("accuracy", measure_accuracy, space,
                               (1,) if settings.quick else (1, 2, 3))  # fmt: skip
        if "strategies" not in settings.skip:
            strategies = measure("strategies", measure_strategies, space, quick=settings.quick)
        if "torch" not in settings.skip:
            torch_backend = measure("torch", _measure_torch, space, settings)
            if torch_backend is None:
                del recorder.sections["torch"]
        if "watchdog" not in settings.skip:
            watchdog = measure("watchdog", measure_watchdog, space, quick=settings.quick)
        if "restart" not in settings.skip:
            restart = measure("restart", measure_restart, space, quick=settings.quick)
        if settings.only in {None, "rebuild"}:
            image = measure("rebuild", measure_image, settings.docker, settings.image,
                            space.root, rebuild="rebuild" not in settings.skip)  # fmt: skip
    return Results(
        machine=machine,
        quick=settings.quick,
        repeats=settings.repeats,
        duration_s=time.monotonic() - started,
        overhead_runs=tuple(overhead),
        fault_runs=tuple(faults),
        bandwidth=bandwidth,
        pipeline=pipeline,
        image=image,
        accuracy=accuracy,
        serving=serving,
        strategies=strategies,
        torch_backend=torch_backend,
        watchdog=watchdog,
        restart=restart,
        sections=recorder.sections,
    )


def _measure_torch(space: Workspace, settings: Settings) -> TorchResult | None:
    if not image_exists(settings.docker, settings.torch_image):
        log.warning(
            "torch: skipped, no image %s (make build FLAVOR=torch-cpu)", settings.torch_image
        )
        return None
    return measure_torch(space, settings.torch_image, settings.repeats, settings.quick)


def merge_into(existing: Path, fresh: Results, only: str) -> Results:
    """`fresh`'s `only` section into the results at `existing` (kept as they are otherwise, and
    wholly where `only` was skipped, e.g. torch without its image); `fresh` as it is when there
    is nothing to merge into."""
    if not existing.is_file():
        return fresh
    field = RESULT_FIELDS[only]
    if getattr(fresh, field) is None:
        return load_results(existing)
    old = load_results(existing)
    # The machine (and the image's versions) as this run saw them; every other section keeps
    # its own date, commit and load.
    return dataclasses.replace(
        old,
        machine=fresh.machine,
        sections={**old.sections, **fresh.sections},
        **{field: getattr(fresh, field)},
    )


def _terminate(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, through every finally that removes containers.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = parse_args(argv)
    if settings.render_only:
        paths = write_report(load_results(settings.out / "results.json"), settings.out)
        log.info("rendered %s", ", ".join(map(str, paths.values())))
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    try:
        results = run(settings)
    except KeyboardInterrupt as interrupt:
        log.error("interrupted (%s); containers, networks and scratch files removed", interrupt)
        return 130
    took_s = results.duration_s  # this run's, not the merged file's
    if settings.only:
        results = merge_into(settings.out / "results.json", results, settings.only)
    paths = write_report(results, settings.out)
    log.info("took %.1f min; wrote %s", took_s / 60, ", ".join(map(str, paths.values())))
    print(paths["markdown"].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
