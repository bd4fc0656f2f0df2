"""The published reports. `python -m bench`: results.json (everything), results.md (the tables,
with date, machine and versions) and overhead.png (overhead per host count, one bar per
launcher). `python -m bench.scale`: scale.json, scale.md and scale.png (4 to 128 hosts)."""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter, ScalarFormatter

from bench.accuracy import AccuracyResult, AccuracyRun
from bench.bandwidth import AllreducePoint, BandwidthResult
from bench.image import ImageResult
from bench.launchers import LAUNCHER_NAMES_VERSION, Launcher, launcher_named
from bench.machine import Machine
from bench.overhead import FaultRun, HostCost, OverheadRun, RankTimes
from bench.pipeline import PipelineRate, PipelineResult
from bench.provenance import Provenance, duration_text, provenance_from, provenance_text
from bench.restart import RestartResult, restart_from_json, restart_lines
from bench.serving import ServingResult, serving_from_json, serving_goals, serving_lines
from bench.strategies import StrategiesResult, strategies_from_json, strategies_lines
from bench.summary import (
    FaultSummary,
    Goal,
    OverheadSummary,
    fault_down_text,
    fixed,
    growth,
    minus,
    overhead_rows,
    scale_goals,
    sectioned_goals,
    summarize_faults,
    summarize_overhead,
)
from bench.torch_backend import (
    TorchResult,
    failed_runs,
    fault_rows,
    fault_summaries,
    launcher_label,
    overhead_summaries,
    torch_goals,
)
from bench.watchdog import WatchdogResult, watchdog_from_json, watchdog_lines

COLORS = {
    Launcher.OURS: "#1b9e77",
    Launcher.OURS_SSH: "#66a61e",
    Launcher.TOOLKIT: "#d95f02",
    Launcher.MPIRUN: "#7570b3",
}
# Ranges wider than this get a log axis.
LOG_SCALE_RANGE = 10.0
# Where the bars of a log axis start.
LOG_SCALE_BOTTOM_S = 0.1


@dataclasses.dataclass(frozen=True)
class Results:
    machine: Machine
    quick: bool
    repeats: int
    duration_s: float
    overhead_runs: tuple[OverheadRun, ...]
    fault_runs: tuple[FaultRun, ...]
    bandwidth: BandwidthResult | None
    pipeline: PipelineResult | None
    image: ImageResult | None
    accuracy: AccuracyResult | None = None
    serving: ServingResult | None = None
    strategies: StrategiesResult | None = None
    torch_backend: TorchResult | None = None
    watchdog: WatchdogResult | None = None
    restart: RestartResult | None = None
    # Each section's own date, commit, machine, load and duration, by its name in
    # bench.__main__.MEASUREMENTS: `--only NAME` replaces one, the others keep theirs.
    sections: dict[str, Provenance] = dataclasses.field(default_factory=dict)

    @property
    def overhead(self) -> list[OverheadSummary]:
        return summarize_overhead(self.overhead_runs)

    @property
    def faults(self) -> list[FaultSummary]:
        return summarize_faults(self.fault_runs)

    @property
    def goals(self) -> list[Goal]:
        return [goal for _, goal in self.sectioned_goals]

    @property
    def sectioned_goals(self) -> list[tuple[str, Goal]]:
        """Every goal with the section that measured it."""
        goals = sectioned_goals(self.overhead, self.faults, self.bandwidth)
        goals += [("serving", goal) for goal in serving_goals(self.serving)] if self.serving else []
        torch = torch_goals(self.torch_backend) if self.torch_backend else []
        return goals + [("torch", goal) for goal in torch]


def to_json(results: Results) -> str:
    document = dataclasses.asdict(results)
    document["launcher_names"] = LAUNCHER_NAMES_VERSION
    document["summary"] = {
        "overhead": [dataclasses.asdict(s) for s in results.overhead],
        "faults": [dataclasses.asdict(s) for s in results.faults],
        "goals": [dataclasses.asdict(goal) for goal in results.goals],
    }
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


# ---------------------------------------------------------------------------------------------
# Markdown


def _cell(text: str) -> str:
    """One table cell: one line, no column separator."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _label(launcher: str) -> str:
    return Launcher(launcher).label if launcher in Launcher._value2member_map_ else launcher


def _machine_lines(results: Results) -> list[str]:
    m = results.machine
    v = m.image_versions
    return [
        "`python -m bench` measures every section; `python -m bench --only NAME` re-measures "
        "one and keeps the others as they were, so each section states its own date, commit "
        "(`-dirty`: with uncommitted changes), cores, memory and the machine's 1-minute load "
        "average before and after it:",
        "",
        *_table(
            ["Section", "Measured", "Commit", "Cores, memory", "Load before, after", "Took"],
            _section_rows(results),
        ),
        f"The machine and image at the latest run ({m.date}, commit `{m.commit}`):",
        "",
        f"- Machine: {m.cpu_model}, {m.cores} cores, {m.memory_gib:g} GiB memory, "
        f"Linux {m.kernel}, Docker Engine {m.docker_engine}; every host is a container on one "
        "user-defined bridge network of this one machine.",
        f"- Image `{m.image}`: TensorFlow {v.get('tensorflow-cpu', '?')}, Horovod "
        f"{v.get('horovod', '?')}, Open MPI {v.get('openmpi', '?')}, sagemaker-training "
        f"{v.get('sagemaker-training', '?')}, Python {v.get('python', '?')}, "
        f"{v.get('openssh', '?')}.",
        "",
    ]


def _section_rows(results: Results) -> list[list[str]]:
    rows = []
    for name, _ in _sections(results):
        p = results.sections.get(name)
        if p is None:
            rows.append([name, "not recorded", "", "", "", ""])
            continue
        rows.append(
            [
                name,
                p.date,
                f"`{p.commit}`",
                f"{p.cores}, {p.memory_gib:g} GiB",
                f"{p.load_before:.1f}, {p.load_after:.1f}",
                duration_text(p.seconds),
            ]
        )
    return rows


def _goal_lines(results: Results) -> list[str]:
    met = {True: "**yes**", False: "**no**", None: "not measured"}

    def when(section: str) -> str:
        provenance = results.sections.get(section)
        return f"{section}, {provenance.date if provenance else 'date not recorded'}"

    rows = [
        [goal.name, goal.target, goal.measured, met[goal.met], when(section)]
        for section, goal in results.sectioned_goals
    ]
    header = ["Goal", "Target", "Measured", "Met", "Section, measured"]
    return ["### Goals", "", *_table(header, rows)]


def _overhead_lines(summaries: Sequence[OverheadSummary]) -> list[str]:
    rows = overhead_rows(summaries, _label)
    header = [
        "Hosts",
        "Launcher",
        "Start (s)",
        "End (s)",
        "Start vs mpirun",
        "End vs mpirun",
        "OK runs",
    ]
    return [
        "### Orchestration overhead",
        "",
        "One rank per container, a trivial Horovod program (`bench/programs/timed.py`). Start: "
        "first container started (bare mpirun: mpirun started) → every rank in user code. "
        "End: last rank left user code → last container exited (bare mpirun: mpirun exited). "
        "The program's own Python and TensorFlow imports count as user code; the interpreter's "
        "tear-down after the program left falls in every launcher's end overhead, the floor's "
        "too.",
        "",
        *_table(header, rows),
    ]


def _fault_lines(summaries: Sequence[FaultSummary]) -> list[str]:
    rows = [[_label(s.launcher), str(s.hosts), str(s.runs), fault_down_text(s)] for s in summaries]
    return [
        "### Fault detection",
        "",
        "A worker container (`algo-2`) killed (`docker kill`) while every rank allreduces → the "
        "last container exited.",
        "",
        *_table(["Launcher", "Hosts", "Runs", "Every host down after (s)"], rows),
    ]


def _bandwidth_lines(result: BandwidthResult | None) -> list[str]:
    lines = ["### Allreduce bandwidth", ""]
    if result is None or (result.error and not result.points):
        return [*lines, f"Not measured ({result.error if result else 'skipped'}).", ""]
    lines += [
        f"Between 2 containers started by our entry point: raw TCP by iperf3 "
        f"({result.iperf3_version.split('(')[0].strip()}, one stream) "
        f"**{fixed(result.iperf3_gbit_s)} Gbit/s**, then Horovod allreduce of float32 tensors "
        f"(tensor fusion on, threshold {result.fusion_threshold}) in the same job. Bus bandwidth "
        "= size / time * 2(n-1)/n (nccl-tests' definition; n = 2).",
        "",
    ]
    rows = [
        [
            f"{p.megabytes} MiB",
            f"{p.seconds * 1e3:.1f}",
            fixed(p.busbw_gbit_s),
            "-" if p.fraction_of_iperf3 is None else f"{p.fraction_of_iperf3:.0%}",
        ]
        for p in result.points
    ]
    return lines + _table(["Tensor", "Time (ms)", "Bus bandwidth (Gbit/s)", "Of iperf3"], rows)


def _pipeline_lines(result: PipelineResult | None) -> list[str]:
    lines = ["### Input pipeline", ""]
    if result is None or result.error:
        return [*lines, f"Not measured ({result.error if result else 'skipped'}).", ""]
    lines += [
        f"The {result.files} digits of the train split in one container "
        f"({result.cores} cores) as PNG folders, JPEG folders and record shards, resized to "
        f"{result.image_size}x{result.image_size}, batches of {result.batch_size}; the "
        "model's pipeline is `model/pipeline.py` (`decoded_images` + batch, uncached). "
        "Best of 10 interleaved passes each. Goal: the model's 1-thread rate at least "
        "90% of the faster bare loop's.",
        "",
    ]
    per_core = {rate.name: rate.per_core for rate in result.rates}

    def of_bare_tf(rate: PipelineRate) -> str:
        # The same format's bare TensorFlow loop, e.g. png:bare_tf for png:model_one_thread.
        bare = per_core.get(rate.name.split(":")[0] + ":bare_tf")
        return "" if rate.of_best_bare is None or not bare else f"{rate.per_core / bare:.0%}"

    rows = [
        [
            rate.description,
            str(rate.cores_used),
            f"{rate.images_per_s:,.0f}",
            f"{rate.per_core:,.0f}",
            "" if rate.of_best_bare is None else f"{rate.of_best_bare:.0%}",
            of_bare_tf(rate),
        ]
        for rate in result.rates
    ]
    header = [
        "Variant",
        "Cores",
        "Images/s",
        "Images/s per core",
        "Of the best bare loop",
        "Of the bare tf.io loop",
    ]
    return lines + _table(header, rows)


def _accuracy_lines(result: AccuracyResult | None) -> list[str]:
    if result is None:
        return []
    lines = [
        "### Built-in model accuracy",
        "",
        "scikit-learn's digits (70/10/20 split, harness/digits.py) as PNG class folders, the "
        f"model's default hyperparameters but epochs={result.epochs} and "
        f"batch_size={result.batch_size} per rank, through our entry point; "
        f"on the raw 8x8 pixels of the same split, LogisticRegression: "
        f"**{result.logistic_regression:.4f}**"
        + ("" if result.svc is None else f", SVC (RBF): {result.svc:.4f}")
        + ".",
        "",
    ]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    rows = [
        [
            str(run.hosts),
            cell(run.train_accuracy),
            cell(run.validation_accuracy),
            cell(run.test_accuracy),
            "-"
            if run.test_accuracy is None
            else f"{run.test_accuracy - result.logistic_regression:+.4f}",
            f"{run.seconds:.0f}",
            _cell(run.error or ""),
        ]
        for run in result.runs
    ]
    header = ["Hosts", "Train", "Validation", "Test", "Test vs LogReg", "Job (s)", "Error"]
    return lines + _table(header, rows)


def _image_lines(result: ImageResult | None) -> list[str]:
    if result is None:
        return []
    if result.rebuild_s is not None:
        rebuild = (
            f"{result.rebuild_s:.1f} s (`make build FLAVOR=cpu` with {result.build_client}; "
            f"the same build before the change: {fixed(result.warm_build_s, 1)} s)"
        )
    else:
        # the first line only: the build's own output is in the bench log
        rebuild = (result.error or "not measured").splitlines()[0].rstrip(":")[:200]
    rows = [[f"`{result.image}`", f"{result.size_bytes / 1e9:.2f} GB", rebuild]]
    return [
        "### Image",
        "",
        *_table(["Image", "Size (uncompressed)", "Rebuild after a one-line code change"], rows),
    ]


TORCH_OVERHEAD_HEADER = (
    "Hosts", "Launcher", "Start (s)", "End (s)", "Start vs torchrun", "End vs torchrun", "OK runs",
)  # fmt: skip


def _torch_lines(result: TorchResult | None) -> list[str]:
    if result is None:
        return []
    failed = failed_runs(result)
    return [
        "### PyTorch backend: ours vs bare torchrun",
        "",
        f"Image `{result.image}` (torch {result.torch_version or '?'}), one rank per container, "
        "a trivial gloo program (`bench/programs/timed_torch.py`), medians of "
        f"{result.repeats} run(s). Ours: `train` with `sagemaker_torch_distributed_enabled="
        "true`. The floor: each container runs, with no entry point, the torchrun command line "
        "our plan builds for its host. Start: first container started → every rank in user "
        "code. End: last rank left user code → last container exited.",
        "",
        *_table(
            TORCH_OVERHEAD_HEADER,
            overhead_rows(overhead_summaries(result.overhead_runs), launcher_label),
        ),
        "A worker (the last host) killed or cut off the network while every rank all-reduces "
        "→ every other container exited (killed: from the killed container's exit; cut off: "
        "from the cut).",
        "",
        *_table(
            ["Worker", "Launcher", "Hosts", "Runs", "Every other host down after (s)"],
            fault_rows(fault_summaries(result.fault_runs)),
        ),
        *([f"Failed runs: {_cell('; '.join(failed))}", ""] if failed else []),
    ]


def _sections(results: Results) -> list[tuple[str, list[str]]]:
    """Each section's name (as `--only` names it) and its rendered lines, in report order; a
    section that rendered nothing is left out."""
    sections = [
        ("overhead", [*_overhead_lines(results.overhead),
                      "![Orchestration overhead per host count](overhead.png)", ""]),
        ("fault", _fault_lines(results.faults)),
        ("bandwidth", _bandwidth_lines(results.bandwidth)),
        ("pipeline", _pipeline_lines(results.pipeline)),
        ("accuracy", _accuracy_lines(results.accuracy)),
        ("rebuild", _image_lines(results.image)),
        ("serving", serving_lines(results.serving)),
        ("strategies", strategies_lines(results.strategies)),
        ("torch", _torch_lines(results.torch_backend)),
        ("watchdog", watchdog_lines(results.watchdog)),
        ("restart", restart_lines(results.restart)),
    ]  # fmt: skip
    return [(name, lines) for name, lines in sections if lines]


def with_provenance(lines: Sequence[str], provenance: Provenance | None) -> list[str]:
    """A section's lines with its provenance line under its heading (its first line)."""
    return [lines[0], "", provenance_text(provenance), *lines[1:]]


def to_markdown(results: Results) -> str:
    lines = ["## Benchmark results", "", *_machine_lines(results), *_goal_lines(results)]
    for name, section in _sections(results):
        lines += with_provenance(section, results.sections.get(name))
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Plot


def _bars(axis: Axes, summaries: Sequence[OverheadSummary], field: str, title: str) -> None:
    hosts = sorted({s.hosts for s in summaries})
    launchers = [
        launcher for launcher in Launcher if any(s.launcher == launcher for s in summaries)
    ]
    width = 0.8 / max(1, len(launchers))
    values = []
    for index, launcher in enumerate(launchers):
        by_hosts = {s.hosts: getattr(s, field) for s in summaries if s.launcher == launcher}
        heights = [by_hosts.get(h) or 0.0 for h in hosts]
        values += [h for h in heights if h > 0]
        positions = [i + (index - (len(launchers) - 1) / 2) * width for i in range(len(hosts))]
        bars = axis.bar(positions, heights, width, label=launcher.label, color=COLORS[launcher])
        axis.bar_label(bars, labels=[f"{h:.1f}" if h else "" for h in heights], fontsize=8)
    axis.set_xticks(range(len(hosts)), [f"{h} hosts" for h in hosts])
    axis.set_title(title)
    axis.set_ylabel("seconds (median)")
    if values and max(values) / min(values) > LOG_SCALE_RANGE:
        axis.set_yscale("log")
        axis.set_ylim(bottom=LOG_SCALE_BOTTOM_S, top=max(values) * 2)
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.yaxis.set_minor_formatter(NullFormatter())
        axis.set_ylabel("seconds (median, log scale)")
    else:
        axis.set_ylim(top=max(values, default=1.0) * 1.15)
    axis.grid(axis="y", alpha=0.3)


def plot_overhead(results: Results, path: Path) -> None:
    summaries = results.overhead
    figure, (start, end) = plt.subplots(1, 2, figsize=(11, 5), constrained_layout=True)
    _bars(
        start,
        summaries,
        "start_median_s",
        "Start: first container started → all ranks in user code",
    )
    _bars(end, summaries, "end_median_s", "End: last rank done → last container exited")
    handles, labels = start.get_legend_handles_labels()
    figure.legend(
        handles, labels, loc="outside lower center", ncol=max(1, len(labels)), fontsize=10
    )
    m = results.machine
    figure.suptitle(
        f"Orchestration overhead, lower is better ({m.date}, {m.cores} cores, "
        f"{m.memory_gib:g} GiB, commit {m.commit})",
        fontsize=11,
    )
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _host_cost(raw: dict) -> HostCost:
    return HostCost(**{**raw, "peak_process_names": tuple(raw.get("peak_process_names", ()))})


def _overhead_run(raw: dict, names_version: int) -> OverheadRun:
    costs = {key: _host_cost(raw[key]) for key in ("master", "worker") if raw.get(key)}
    ranks = tuple(RankTimes(**r) for r in raw.get("ranks", ()))
    launcher = launcher_named(raw["launcher"], names_version)
    return OverheadRun(**{**raw, "launcher": launcher, "ranks": ranks, **costs})


def _fault_run(raw: dict, names_version: int) -> FaultRun:
    launcher = launcher_named(raw["launcher"], names_version)
    lines = tuple(raw.get("failure_lines", ()))
    return FaultRun(**{**raw, "launcher": launcher, "failure_lines": lines})


def load_results(path: Path) -> Results:
    """Results back from a results.json, to re-render the report without measuring again."""
    raw = json.loads(path.read_text())
    names = raw.get("launcher_names", 1)
    bandwidth = raw["bandwidth"]
    if bandwidth is not None:
        points = tuple(AllreducePoint(**point) for point in bandwidth["points"])
        bandwidth = BandwidthResult(**{**bandwidth, "points": points})
    pipeline = raw["pipeline"]
    if pipeline is not None:
        rates = tuple(PipelineRate(**rate) for rate in pipeline["rates"])
        pipeline = PipelineResult(**{**pipeline, "rates": rates})
    return Results(
        machine=Machine(**raw["machine"]),
        quick=raw["quick"],
        repeats=raw["repeats"],
        duration_s=raw["duration_s"],
        overhead_runs=tuple(_overhead_run(run, names) for run in raw["overhead_runs"]),
        fault_runs=tuple(_fault_run(run, names) for run in raw["fault_runs"]),
        bandwidth=bandwidth,
        pipeline=pipeline,
        image=ImageResult(**raw["image"]) if raw["image"] else None,
        accuracy=_accuracy_from(raw.get("accuracy")),
        serving=serving_from_json(raw.get("serving")),
        strategies=strategies_from_json(raw.get("strategies")),
        torch_backend=_torch_from(raw.get("torch_backend")),
        watchdog=watchdog_from_json(raw.get("watchdog")),
        restart=restart_from_json(raw.get("restart")),
        sections={
            name: provenance
            for name, raw_provenance in raw.get("sections", {}).items()
            if (provenance := provenance_from(raw_provenance)) is not None
        },
    )


def _accuracy_from(raw: dict | None) -> AccuracyResult | None:
    if raw is None:
        return None
    return AccuracyResult(**{**raw, "runs": tuple(AccuracyRun(**run) for run in raw["runs"])})


def _torch_from(raw: dict | None) -> TorchResult | None:
    if raw is None:
        return None
    # The torch section's launchers ("ours", "torchrun") were never renamed.
    overhead = tuple(_overhead_run(run, LAUNCHER_NAMES_VERSION) for run in raw["overhead_runs"])
    faults = tuple(_fault_run(run, LAUNCHER_NAMES_VERSION) for run in raw["fault_runs"])
    return TorchResult(**{**raw, "overhead_runs": overhead, "fault_runs": faults})


def write_text_atomically(path: Path, text: str) -> None:
    """A reader never sees half a file: write beside it, then rename over it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def write_report(results: Results, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "results.json",
        "markdown": out / "results.md",
        "plot": out / "overhead.png",
    }
    write_text_atomically(paths["json"], to_json(results))
    write_text_atomically(paths["markdown"], to_markdown(results))
    plot_overhead(results, paths["plot"])
    return paths


# ---------------------------------------------------------------------------------------------
# bench.scale's report: scale.json, scale.md, scale.png


@dataclasses.dataclass(frozen=True)
class ScaleResults:
    header: str
    runs: tuple[OverheadRun, ...]
    faults: tuple[FaultRun, ...]

    def merged(self, later: ScaleResults) -> ScaleResults:
        """`later`'s cells over these (a cell: launcher and host count, or launcher, fault and
        host count); both headers kept, as the cells come from two invocations."""
        runs = {(run.launcher, run.hosts): run for run in (*self.runs, *later.runs)}
        faults = {
            (fault.launcher, fault.fault, fault.hosts): fault
            for fault in (*self.faults, *later.faults)
        }
        header = f"{self.header} Then: {later.header}"
        return ScaleResults(header, tuple(runs.values()), tuple(faults.values()))


def scale_to_json(results: ScaleResults) -> str:
    document = {"launcher_names": LAUNCHER_NAMES_VERSION, **dataclasses.asdict(results)}
    return json.dumps(document, indent=2) + "\n"


def scale_from_json(text: str) -> ScaleResults:
    """Results back from scale.json; files written before the channel launch existed name
    the ssh launch "ours", which comes back as "ours-ssh"."""
    raw = json.loads(text)
    names = raw.get("launcher_names", 1)
    return ScaleResults(
        header=raw["header"],
        runs=tuple(_overhead_run(run, names) for run in raw["runs"]),
        faults=tuple(_fault_run(fault, names) for fault in raw["faults"]),
    )


def _launcher_order(run: OverheadRun) -> tuple[int, int]:
    return run.hosts, list(Launcher).index(Launcher(run.launcher))


def process_counts(names: Sequence[str]) -> str:
    """Command names as a short list: ("orted", "sshd", "sshd") -> "orted, 2 sshd"."""
    counts = sorted(collections.Counter(names).items())
    return ", ".join(name if count == 1 else f"{count} {name}" for name, count in counts) or "-"


def _processes(cost: HostCost) -> str:
    return str(len(cost.peak_process_names)) if cost.peak_process_names else "-"


def _timing_rows(runs: Sequence[OverheadRun]) -> list[list[str]]:
    floor = {run.hosts: run for run in runs if run.launcher == Launcher.MPIRUN.value}
    rows = []
    for run in runs:
        base = floor.get(run.hosts)
        label = Launcher(run.launcher).label
        if run.error:
            rows.append([str(run.hosts), label, f"failed: {run.error[:120]}", *[""] * 5])
            continue
        versus = [
            "-"
            if run.launcher == Launcher.MPIRUN.value or base is None
            else f"+{fixed(minus(getattr(run, field), getattr(base, field)))} s"
            for field in ("start_overhead_s", "end_overhead_s")
        ]
        rows.append(
            [
                str(run.hosts),
                label,
                fixed(run.start_overhead_s),
                fixed(run.start_after_up_s),
                fixed(run.end_overhead_s),
                fixed(run.end_logged_s),
                *versus,
            ]
        )
    return rows


def growth_rows(runs: Sequence[OverheadRun]) -> tuple[list[str], list[list[str]]]:
    """The start after every host is up, one row per launcher and one column per host count,
    then its growth over the counts it completed and the floor's over the same counts."""
    counts = sorted({run.hosts for run in runs})
    floor = {run.hosts: run for run in runs if run.launcher == Launcher.MPIRUN.value}
    header = ["Launcher", *(f"{hosts} hosts" for hosts in counts), "Growth", "Bare mpirun's"]
    rows = []
    for launcher in Launcher:
        mine = {run.hosts: run for run in runs if run.launcher == launcher.value}
        if not mine:
            continue
        cells = [
            ("failed" if mine[hosts].error else fixed(mine[hosts].start_after_up_s))
            if hosts in mine
            else ""
            for hosts in counts
        ]
        own = growth(mine, "start_after_up_s")
        floors = None if own is None else growth(floor, "start_after_up_s", list(mine))
        rows.append(
            [
                launcher.label,
                *cells,
                "-" if own is None else f"{own.low_hosts}->{own.high_hosts}: +{own.seconds:.1f} s",
                "-"
                if floors is None or launcher is Launcher.MPIRUN
                else f"+{floors.seconds:.1f} s",
            ]
        )
    return header, rows


def _cost_rows(runs: Sequence[OverheadRun]) -> list[list[str]]:
    nothing = HostCost(None, None, None)
    rows = []
    for run in (run for run in runs if not run.error):
        master, worker = run.master or nothing, run.worker or nothing
        rows.append(
            [
                str(run.hosts),
                Launcher(run.launcher).label,
                fixed(master.peak_mib, 0),
                _processes(master),
                "-" if master.peak_processes is None else str(master.peak_processes),
                fixed(master.cpu_s, 1),
                fixed(worker.peak_mib, 0),
                _processes(worker),
                "-" if worker.peak_processes is None else str(worker.peak_processes),
                fixed(worker.cpu_s, 1),
                fixed(run.longest_silence_s, 1),
            ]
        )
    return rows


def scale_markdown(results: ScaleResults) -> str:
    runs = sorted(results.runs, key=_launcher_order)
    met = {True: "yes", False: "**no**", None: "not measured"}
    goals = [
        [goal.name, goal.target, goal.measured, met[goal.met]]
        for goal in scale_goals(results.runs, results.faults)
    ]
    timing_header = [
        "Hosts", "Launcher", "Start (s)", "Start after all up (s)", "End (s)",
        "End, exit logged (s)", "Start vs mpirun", "End vs mpirun",
    ]  # fmt: skip
    cost_header = [
        "Hosts", "Launcher", "Master peak MiB", "Master peak processes", "Master peak tasks",
        "Master CPU (s)", "Worker peak MiB", "Worker peak processes", "Worker peak tasks",
        "Worker CPU (s)", "Longest silence (s)",
    ]  # fmt: skip
    named = [run for run in runs if run.master and run.master.peak_process_names]
    process_rows = [
        [
            str(run.hosts),
            Launcher(run.launcher).label,
            process_counts(run.master.peak_process_names if run.master else ()),
            process_counts(run.worker.peak_process_names if run.worker else ()),
        ]
        for run in named
    ]
    fault_rows = [
        [
            _label(fault.launcher),
            "worker killed" if fault.fault == "kill" else "worker cut off the network",
            str(fault.hosts),
            fixed(fault.detection_s),
            str(fault.nonzero_exits),
            fault.error or "<br>".join(line.replace("|", "/") for line in fault.failure_lines),
        ]
        for fault in results.faults
    ]
    fault_header = [
        "Launcher", "Fault", "Hosts", "Every other host down after (s)", "Non-zero exits",
        "Failure lines",
    ]  # fmt: skip
    lines = [
        "## Scale: 4 to 64 hosts",
        "",
        "### Goals",
        "",
        results.header,
        "",
        "Goals are the channel launch's (our default) unless a row names the ssh launch.",
        "",
        *_table(["Goal", "Target", "Measured", "Met"], goals),
        "### Start and end",
        "",
        *_table(timing_header, _timing_rows(runs)),
        "Start after every host is up (s), by host count:",
        "",
        *_table(*growth_rows(runs)),
        "### Cost per host",
        "",
        *_table(cost_header, _cost_rows(runs)),
    ]
    if process_rows:
        header = ["Hosts", "Launcher", "Master's processes at their most", "Worker's"]
        lines += _table(header, process_rows)
    lines += ["### Faults", "", *_table(fault_header, fault_rows)] if fault_rows else []
    return "\n".join(lines).rstrip() + "\n"


def plot_scale(runs: Sequence[OverheadRun], path: Path) -> None:
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for axis, field, title in (
        (axes[0], "start_overhead_s", "start: first container -> last rank in code"),
        (axes[1], "start_after_up_s", "start: last container -> last rank in code"),
        (axes[2], "end_overhead_s", "end: last rank left -> last container exit"),
    ):
        for launcher in Launcher:
            points = sorted(
                (run.hosts, getattr(run, field))
                for run in runs
                if run.launcher == launcher.value and getattr(run, field) is not None
            )
            if points:
                axis.plot(
                    *zip(*points, strict=True),
                    marker="o",
                    label=launcher.label,
                    color=COLORS[launcher],
                )
        axis.set_xscale("log")
        axis.set_xticks(sorted({run.hosts for run in runs}))
        axis.get_xaxis().set_major_formatter(ScalarFormatter())
        axis.set_xlabel("hosts (one rank each)")
        axis.set_ylabel("seconds")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_scale_report(results: ScaleResults, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    markdown = scale_markdown(results)
    write_text_atomically(out / "scale.json", scale_to_json(results))
    write_text_atomically(out / "scale.md", markdown)
    plot_scale(results.runs, out / "scale.png")
    return markdown
