"""Measurement: `serve` against the servers a user would pick instead, side by side in one run,
on the same models and the same load generator:

- Flask + gunicorn sync workers, calling the model once per request (AWS's bring-your-own
  pattern: bench/programs/flask_baseline.py), in the same image;
- KServe's Python model server and MLServer, each with a custom model class that calls the
  same SavedModel signature (bench/programs/kserve_server.py, mlserver_runtime.py), speaking
  their own protocols (KServe V1 `{"instances"}`, MLServer V2 `{"inputs"}`), with TensorFlow
  2.14 from the image (bench/peers/Dockerfile builds <IMAGE>-peers: the image plus their venv);
- a floor: granian running a raw ASGI app that answers a constant body (bench/programs/floor.py).

Three models: the Keras MLP (one row of 8 floats), the built-in digits CNN (one PNG) and a
SavedModel with a string input (one sentence). The load: wrk (Debian's, in <IMAGE>-peers, run
with `docker exec` from a container of its own) with 1, 8 and 32 keep-alive connections; every
server alone (the others stopped), a warm-up, then each level `runs` times; the table has the
medians and the machine's 1-minute load average beside each figure.

Goals (issue 30), per model: at 32 clients at least 3x Flask's rate with a lower p99, more
than KServe's and MLServer's with a lower p99; on the MLP at least half the floor's rate; at
1 client a p50 no worse than Flask's.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import re
import secrets
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.summary import Goal
from harness.cluster import docker_command
from harness.digits import make_digits
from harness.serving import SERVE_TEST_EPOCHS, ServeContainer, make_models, train_digits_model
from serve.workers import READY_DIR_ENV, HostResources, plan_workers, thread_environment

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "bench" / "programs"
PEERS_CONTEXT = REPO / "bench" / "peers"
CONCURRENCY = (1, 8, 32)
GOAL_CONCURRENCY = 32
GOAL_FLASK_RATIO = 3.0
GOAL_FLOOR_FRACTION = 0.5
# AWS's example sets gunicorn's workers to the CPU count; this machine's is 2.
BASELINE_WORKERS = 2
FLOOR_WORKERS = 2
# Per run of one level; a full run is ~12 minutes with 3 runs, --quick ~7 with 1.
SECONDS_PER_RUN, QUICK_SECONDS_PER_RUN = 3.0, 2.0
WARMUP_SECONDS = 2.0
RUNS, QUICK_RUNS = 3, 1
# Where the build's downloads find the CA bundle, as the Makefile picks it (CA_BUNDLE= empty:
# the image's own).
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
              "/etc/ssl/cert.pem")  # fmt: skip

# Server names: BASELINE is spelled as in earlier results, which still load. serve's default
# is no batching (issue 45); the owner's switch, batching on, is measured beside it. Earlier
# results, named EARLIER_OURS, always merged requests: they load as the batching-on rows.
OURS = "serve (uvicorn), default: each request its own call"
OURS_BATCHING = "serve (uvicorn), batching on"
EARLIER_OURS = "serve (uvicorn + dynamic batching)"
BASELINE = "Flask + gunicorn sync workers"
# What the batching-on server adds to the default's environment.
BATCHING_ON = (("SAGEMAKER_TFS_ENABLE_BATCHING", "true"),)
KSERVE, MLSERVER = "KServe 0.15.2", "MLServer 1.6.1"
FLOOR = "floor: granian 2.8.7, constant body"
# serve's own app (serve.app:create_app, the same settings) under granian instead of uvicorn:
# which HTTP server serves it best, measured side by side (issue 36).
OURS_GRANIAN = "serve's app under granian 2.8.7"
SERVERS = (OURS, OURS_BATCHING, OURS_GRANIAN, BASELINE, KSERVE, MLSERVER, FLOOR)
# serve's own servers: stopped gracefully, so that their drain lines (calls, batches) log.
OUR_SERVERS = (OURS, OURS_BATCHING)
MLP, DIGITS, TEXT = "Keras MLP, 8 floats", "digits CNN, one PNG", "string input, one sentence"
MODELS = (MLP, DIGITS, TEXT)
# One row of the MLP's 8 features, as predictor.predict(np.array([[...]])) sends it.
MLP_ROW = [0.5, -1.0, 0.25, 2.0, -0.75, 1.5, 0.0, -2.5]
MLP_BODY = json.dumps([MLP_ROW]).encode()
SENTENCE = "the quick brown fox jumps over the lazy dog"


@dataclasses.dataclass(frozen=True)
class LoadLevel:
    """One server at one concurrency on one model: medians over `runs` runs."""

    server: str
    concurrency: int
    requests: int  # answered 2xx, over every run
    errors: int  # non-2xx answers and socket errors, over every run
    seconds: float  # per run
    throughput_rps: float
    p50_ms: float | None
    p99_ms: float | None
    model: str = DIGITS
    load1: float | None = None  # the 1-minute load average before the runs (median)
    runs: int = 1
    runs_rps: tuple[float, ...] = ()
    p999_ms: float | None = None  # absent from results measured before it was
    # The server container's CPU time (every process and thread) per answered request: what a
    # request costs, which the machine's load changes far less than the rates.
    cpu_us_per_request: float | None = None


@dataclasses.dataclass(frozen=True)
class ServingResult:
    seconds_per_level: float  # per run
    test_accuracy: float
    levels: tuple[LoadLevel, ...]
    ours_batches: str = ""
    error: str | None = None
    runs: int = 1
    load_generator: str = ""


@dataclasses.dataclass(frozen=True)
class WrkRun:
    """What one wrk run printed (`wrk --latency`)."""

    requests: int  # every response, 2xx or not
    seconds: float
    non_2xx: int
    socket_errors: int
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None = None  # post.lua's done() line

    @property
    def ok_rps(self) -> float:
        return max(self.requests - self.non_2xx, 0) / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Request:
    path: str
    body: bytes
    content_type: str


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    """How to start one server in <IMAGE>-peers and where it answers."""

    name: str
    command: tuple[str, ...]
    ready_path: str
    env: tuple[tuple[str, str], ...] = ()


# --- pure ------------------------------------------------------------------------------------

_DURATION = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _to_ms(value: str, unit: str) -> float:
    return float(value) * _DURATION[unit]


def parse_wrk(output: str) -> WrkRun:
    """wrk 4's report (with --latency): total responses, duration, non-2xx, socket errors and
    the 50th and 99th latency percentiles (and the 99.9th, which post.lua prints). ValueError
    where it has no request count."""
    total = re.search(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h),", output, re.M)
    if total is None:
        raise ValueError(f"not a wrk report: {output.strip()[-300:]!r}")
    percentiles = {
        int(p): _to_ms(v, u)
        for p, v, u in re.findall(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s|m|h)\s*$", output, re.M)
    }
    p999 = re.search(r"^p99\.9 latency: (\d+)us\s*$", output, re.M)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return WrkRun(
        requests=int(total.group(1)),
        seconds=float(total.group(2)) * _SECONDS[total.group(3)],
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(n) for n in sockets.groups()) if sockets else 0,
        p50_ms=percentiles.get(50),
        p99_ms=percentiles.get(99),
        p999_ms=int(p999.group(1)) / 1000 if p999 else None,
    )


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize_runs(
    server: str,
    model: str,
    concurrency: int,
    runs: Sequence[WrkRun],
    loads: Sequence[float | None] = (),
    *,
    cpu_us: Sequence[int | None] = (),
) -> LoadLevel:
    """The medians of a level's runs (each figure its own median); `cpu_us`: the server's CPU
    time over each run, in microseconds."""
    rates = [run.ok_rps for run in runs]
    per_request = [
        used / run.requests if used is not None and run.requests else None
        for run, used in zip(runs, cpu_us, strict=False)
    ]
    return LoadLevel(
        server=server,
        concurrency=concurrency,
        requests=sum(max(run.requests - run.non_2xx, 0) for run in runs),
        errors=sum(run.non_2xx + run.socket_errors for run in runs),
        seconds=_median([run.seconds for run in runs]) or 0.0,
        throughput_rps=_median(rates) or 0.0,
        p50_ms=_median([run.p50_ms for run in runs]),
        p99_ms=_median([run.p99_ms for run in runs]),
        p999_ms=_median([run.p999_ms for run in runs]),
        model=model,
        load1=_median(loads),
        runs=len(runs),
        runs_rps=tuple(round(rate, 1) for rate in rates),
        cpu_us_per_request=_median(per_request),
    )


def parse_cpu_usage(text: str) -> int | None:
    """A cgroup's CPU time so far, in microseconds: cgroup v2's cpu.stat (usage_usec) or v1's
    cpuacct.usage (nanoseconds)."""
    found = re.search(r"^usage_usec (\d+)$", text, re.M)
    if found:
        return int(found.group(1))
    return int(text.strip()) // 1000 if text.strip().isdigit() else None


def container_cpu_us(docker: str, name: str) -> int | None:
    """The CPU time of everything in container `name` so far (its own cgroup, read inside it:
    the path outside depends on the host's cgroup driver). The `cat` itself adds a few ms."""
    read = docker_command(
        docker, "exec", name, "sh", "-c",
        "cat /sys/fs/cgroup/cpu.stat 2>/dev/null || cat /sys/fs/cgroup/cpuacct/cpuacct.usage",
        check=False,
    )  # fmt: skip
    return parse_cpu_usage(read.stdout)


def wrk_argv(url: str, concurrency: int, seconds: float) -> list[str]:
    """wrk with one thread per core (2) at most, never more threads than connections."""
    threads = min(concurrency, 2)
    return ["wrk", "--latency", "-t", str(threads), "-c", str(concurrency),
            "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", "/opt/bench/post.lua", url]  # fmt: skip


def requests_for(server: str, model: str, png: bytes) -> Request:
    """The request each server gets for a model, in its own protocol: the same instance."""
    if model == MLP:
        instances: list = [MLP_ROW]
        v2 = {"name": "features", "shape": [1, 8], "datatype": "FP32", "data": MLP_ROW}
    elif model == DIGITS:
        encoded = base64.b64encode(png).decode()
        instances = [{"b64": encoded}]
        v2 = {"name": "images", "shape": [1], "datatype": "BYTES", "data": [encoded]}
    elif model == TEXT:
        instances = [SENTENCE]
        v2 = {"name": "text", "shape": [1], "datatype": "BYTES", "data": [SENTENCE]}
    else:
        raise ValueError(f"unknown model {model!r}")
    if server == KSERVE:
        body = json.dumps({"instances": instances}).encode()
        return Request("/v1/models/model:predict", body, "application/json")
    if server == MLSERVER:
        return Request(
            "/v2/models/model/infer", json.dumps({"inputs": [v2]}).encode(), "application/json"
        )
    if model == DIGITS:
        return Request("/invocations", png, "image/png")
    body = MLP_BODY if model == MLP else json.dumps({"instances": instances}).encode()
    return Request("/invocations", body, "application/json")


def server_plans() -> dict[str, ServerPlan]:
    peers_env = (("PYTHONPATH", "/opt/bench"),)
    gunicorn = ("gunicorn", "-k", "sync", "-w", str(BASELINE_WORKERS), "-b", "0.0.0.0:8080",
                "--timeout", "60", "--chdir", "/opt/bench", "flask_baseline:app")  # fmt: skip
    # KServe's defaults, less its log line per request (serve logs none either).
    kserve = ("/opt/kserve/bin/python", "/opt/bench/kserve_server.py", "--http_port", "8080",
              "--enable_latency_logging", "false")  # fmt: skip
    mlserver = ("/opt/mlserver/bin/mlserver", "start", "/opt/bench/mlserver")
    granian = ("/opt/kserve/bin/granian", "--interface", "asgi", "--host", "0.0.0.0",  # noqa: S104
               "--port", "8080", "--workers", str(FLOOR_WORKERS), "--working-dir", "/opt/bench",
               "floor:app")  # fmt: skip
    # granian from the KServe venv, which reads the image's /opt/venv (serve, starlette) after
    # its own pins (the same starlette and anyio); uvloop, and the workers and threads `serve`
    # chooses on this machine (serve/workers.py), which granian does not read by itself.
    plan = plan_workers(None, HostResources(os.cpu_count() or 1, 1 << 40, gpu=False), 0,
                        multi_model=False)  # fmt: skip
    ours_granian = ("/opt/kserve/bin/granian", "--interface", "asgi", "--factory",
                    "--host", "0.0.0.0", "--port", "8080",  # noqa: S104
                    "--workers", str(plan.workers), "--loop", "uvloop",
                    "serve.app:create_app")  # fmt: skip
    ours_env = (*sorted(thread_environment(plan, {}).items()),
                ("SAGEMAKER_MODEL_SERVER_WORKERS", str(plan.workers)),
                (READY_DIR_ENV, "/tmp/serve-ready"))  # fmt: skip
    return {
        OURS: ServerPlan(OURS, ("serve",), "/ping"),
        OURS_BATCHING: ServerPlan(OURS_BATCHING, ("serve",), "/ping", BATCHING_ON),
        OURS_GRANIAN: ServerPlan(OURS_GRANIAN, ours_granian, "/ping", ours_env),
        BASELINE: ServerPlan(BASELINE, gunicorn, "/ping"),
        KSERVE: ServerPlan(KSERVE, kserve, "/v1/models/model", peers_env),
        MLSERVER: ServerPlan(MLSERVER, mlserver, "/v2/models/model/ready", peers_env),
        FLOOR: ServerPlan(FLOOR, granian, "/ping"),
    }


def servers_for(model: str) -> tuple[str, ...]:
    """Every server on every model; the floor (no model) only on the MLP, where its goal is."""
    return SERVERS if model == MLP else tuple(s for s in SERVERS if s != FLOOR)


def _levels(result: ServingResult | None, model: str) -> dict[tuple[str, int], LoadLevel]:
    return {
        (lv.server, lv.concurrency): lv
        for lv in (result.levels if result else ())
        if lv.model == model
    }


def _load(level: LoadLevel) -> str:
    return "" if level.load1 is None else f", load {level.load1:.1f}"


def _vs_goal(  # noqa: PLR0917  (one comparison)
    result: ServingResult | None, model: str, peer: str, ratio: float, name: str, target: str
) -> Goal:
    levels = _levels(result, model)
    ours, theirs = levels.get((OURS, GOAL_CONCURRENCY)), levels.get((peer, GOAL_CONCURRENCY))
    if ours is None or theirs is None or not theirs.throughput_rps or not ours.throughput_rps:
        return Goal(name, target, "not measured", None)
    times = ours.throughput_rps / theirs.throughput_rps
    measured = f"{times:.2f}x ({ours.throughput_rps:,.0f} vs {theirs.throughput_rps:,.0f} req/s"
    p99_lower = None
    if ours.p99_ms is not None and theirs.p99_ms is not None:
        measured += f"), p99 {ours.p99_ms:.1f} vs {theirs.p99_ms:.1f} ms"
        p99_lower = ours.p99_ms < theirs.p99_ms
    else:
        measured += ")"
    measured += _load(ours)
    if peer == FLOOR:
        return Goal(name, target, measured, times >= ratio)
    met = times >= ratio and p99_lower is True
    if ratio == 1.0:
        met = times > 1.0 and p99_lower is True
    return Goal(name, target, measured, met)


def _p50_goal(result: ServingResult | None, model: str) -> Goal:
    name = f"serve p50 at 1 client ({model})"
    target = "≤ Flask's p50"
    levels = _levels(result, model)
    ours, base = levels.get((OURS, 1)), levels.get((BASELINE, 1))
    if ours is None or base is None or ours.p50_ms is None or base.p50_ms is None:
        return Goal(name, target, "not measured", None)
    measured = f"{ours.p50_ms:.2f} vs {base.p50_ms:.2f} ms{_load(ours)}"
    return Goal(name, target, measured, ours.p50_ms <= base.p50_ms)


def serving_goals(result: ServingResult | None) -> list[Goal]:
    """Issue 30's goals, per model, then the floor's on the MLP; a goal whose figures this
    run lacks is "not measured" (met None)."""
    at = f"at {GOAL_CONCURRENCY} clients"
    goals: list[Goal] = []
    for model in MODELS:
        goals += [
            _vs_goal(result, model, BASELINE, GOAL_FLASK_RATIO, f"serve vs Flask {at} ({model})",
                     f"≥ {GOAL_FLASK_RATIO:g}x req/s, lower p99"),
            _vs_goal(result, model, KSERVE, 1.0, f"serve vs KServe {at} ({model})",
                     "more req/s, lower p99"),
            _vs_goal(result, model, MLSERVER, 1.0, f"serve vs MLServer {at} ({model})",
                     "more req/s, lower p99"),
            _p50_goal(result, model),
        ]  # fmt: skip
        if model == MLP:
            goals.append(
                _vs_goal(result, MLP, FLOOR, GOAL_FLOOR_FRACTION,
                         f"serve vs the floor {at} ({MLP})",
                         f"≥ {GOAL_FLOOR_FRACTION:g}x the floor's req/s")
            )  # fmt: skip
    return goals


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def serving_lines(result: ServingResult | None) -> list[str]:
    if result is None:
        return []
    lines = ["### Serving", ""]
    if result.error:
        return [*lines, f"Not measured ({result.error}).", ""]
    lines += [
        f"Every server alone on the machine, the same models, one request = one instance, "
        f"load from {result.load_generator or 'the load generator'} (keep-alive connections "
        f"= clients); medians of {result.runs} run(s) of {result.seconds_per_level:g} s per "
        "level after a warm-up; load: the machine's 1-minute load average before the runs; "
        "CPU: the server container's CPU time (every process and thread) per request. "
        f"Digits model test accuracy {result.test_accuracy:.3f}. "
        "Flask: gunicorn with "
        f"{BASELINE_WORKERS} sync workers calling the SavedModel once per request "
        "(`bench/programs/flask_baseline.py`); KServe (V1 protocol) and MLServer (V2) with a "
        "custom model calling the same signature (`bench/programs/`); floor: a raw ASGI app "
        f"answering a constant body under granian ({FLOOR_WORKERS} workers). "
        f"{result.ours_batches}",
        "",
    ]
    order = {name: i for i, name in enumerate(SERVERS)}
    models = {name: i for i, name in enumerate(MODELS)}
    rows = sorted(
        result.levels,
        key=lambda lv: (
            models.get(lv.model, 99),
            lv.model,
            lv.concurrency,
            order.get(lv.server, 99),
        ),
    )
    header = ["Model", "Clients", "Server", "Req/s", "p50 (ms)", "p99 (ms)", "p99.9 (ms)",
              "CPU (µs/req)", "Load 1m", "Errors"]  # fmt: skip
    table = [
        [
            lv.model,
            str(lv.concurrency),
            lv.server,
            f"{lv.throughput_rps:,.0f}",
            _cell(lv.p50_ms, 2),
            _cell(lv.p99_ms, 1),
            _cell(lv.p999_ms, 1),
            _cell(lv.cpu_us_per_request, 0),
            _cell(lv.load1, 1),
            str(lv.errors),
        ]
        for lv in rows
    ]
    return [
        *lines,
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in table),
        "",
    ]


def serving_from_json(raw: dict | None) -> ServingResult | None:
    if raw is None:
        return None
    levels = tuple(
        LoadLevel(
            **{
                **level,
                "runs_rps": tuple(level.get("runs_rps", ())),
                # Measured when serve always merged requests: that is batching on.
                "server": OURS_BATCHING if level["server"] == EARLIER_OURS else level["server"],
            }
        )
        for level in raw["levels"]
    )
    return ServingResult(**{**raw, "levels": levels})


def ca_bundle(env: Mapping[str, str], exists: frozenset[str]) -> str | None:
    """The CA bundle the peers' build trusts: CA_BUNDLE as the Makefile's (empty: none), else
    the first system bundle present."""
    if "CA_BUNDLE" in env:
        return env["CA_BUNDLE"] or None
    return next((path for path in CA_BUNDLES if path in exists), None)


def build_argv(  # noqa: PLR0917  (one build)
    docker: str, buildx: bool, image: str, tag: str, context: Path, bundle: str | None
) -> list[str]:
    build = [docker, "buildx", "build", "--load"] if buildx else [docker, "build"]
    secret = ["--secret", f"id=ca,src={bundle}"] if bundle else []
    return [*build, "--build-arg", f"IMAGE={image}", *secret, "--tag", tag, str(context)]


# --- shell -----------------------------------------------------------------------------------


@dataclasses.dataclass
class PeerContainer(ServeContainer):
    """A server in <IMAGE>-peers that is ready when `ready_path` answers 200."""

    ready_path: str = "/ping"

    def ping(self) -> int | None:
        connection = self.client(timeout=2)
        try:
            connection.request("GET", self.ready_path)
            return connection.getresponse().status
        except OSError:
            return None
        finally:
            connection.close()


def _builder(docker: str) -> tuple[str, bool]:
    """A client that builds with BuildKit (secrets need it), and whether it has buildx: `docker`
    where it can, else the one `make build` picks (docker/setup-docker.sh --pick-client)."""
    if (
        subprocess.run([docker, "buildx", "version"], capture_output=True, check=False).returncode
        == 0
    ):
        return docker, True
    picked = subprocess.run(
        [str(REPO / "docker" / "setup-docker.sh"), "--pick-client"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if not picked or picked == docker:
        return docker, False
    return _builder(picked)


def build_error(output: str) -> str:
    """The line of a failed build that says why: its last ERROR line, else its last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1]


def build_peers_image(docker: str, image: str) -> str:
    """<image>-peers from bench/peers/Dockerfile (cached layers: seconds when nothing changed)."""
    tag = f"{image}-peers"
    client, buildx = _builder(docker)
    present = frozenset(path for path in CA_BUNDLES if Path(path).is_file())
    argv = build_argv(client, buildx, image, tag, PEERS_CONTEXT, ca_bundle(os.environ, present))
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    built = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=1800)
    if built.returncode != 0:
        why = build_error(built.stdout + "\n" + built.stderr)
        raise RuntimeError(f"cannot build {tag} (bench/peers/Dockerfile): {why}")
    return tag


class LoadGenerator:
    """wrk in a container of <IMAGE>-peers that sleeps between runs; `docker exec` per run."""

    def __init__(self, docker: str, image: str, bodies: Path) -> None:
        self.docker = docker
        self.bodies = bodies
        self.name = f"smbench-wrk-{secrets.token_hex(3)}"
        docker_command(
            docker, "run", "--detach", "--name", self.name, "--entrypoint", "sleep",
            "--volume", f"{PROGRAMS}:/opt/bench:ro", "--volume", f"{bodies}:/bodies:ro",
            image, "infinity",
        )  # fmt: skip
        found = docker_command(docker, "exec", self.name, "sh", "-c", "command -v wrk", check=False)
        if found.returncode != 0:
            self.remove()
            raise RuntimeError(f"wrk is not in {image}: rebuild it from bench/peers/Dockerfile")
        self.version = (
            docker_command(
                docker, "exec", self.name, "sh", "-c", "wrk --version 2>&1 | head -1", check=False
            )
            .stdout.split(" [")[0]
            .strip()
            or "wrk"
        )

    def run(
        self, url: str, request: Request, concurrency: int, seconds: float
    ) -> tuple[WrkRun, float | None]:
        """One wrk run, and the 1-minute load average just before it."""
        (self.bodies / "body").write_bytes(request.body)
        argv = wrk_argv(url, concurrency, seconds)
        result = docker_command(
            self.docker, "exec", "--env", "BODY_FILE=/bodies/body",
            "--env", f"CONTENT_TYPE={request.content_type}", self.name,
            "sh", "-c", 'cut -d" " -f1 /proc/loadavg; exec "$@"', "wrk", *argv,
            check=False,
        )  # fmt: skip
        first, _, report = result.stdout.partition("\n")
        try:
            load: float | None = float(first)
        except ValueError:
            load = None
        return parse_wrk(report + result.stderr), load

    def remove(self) -> None:
        subprocess.run([self.docker, "rm", "-f", self.name], capture_output=True, check=False)


def start_server(docker: str, image: str, plan: ServerPlan, model_dir: Path) -> PeerContainer:
    server = PeerContainer(
        docker,
        image,
        model_dir,
        env=dict(plan.env),
        command=plan.command,
        extra_mounts=((PROGRAMS, "/opt/bench"),),
        ready_path=plan.ready_path,
    )
    server.start()
    return server


def measure_model(  # noqa: PLR0917  (one model's parameters)
    docker: str,
    image: str,
    wrk: LoadGenerator,
    model: str,
    model_dir: Path,
    png: bytes,
    seconds: float,
    runs: int,
) -> tuple[list[LoadLevel], str]:
    """Every server on `model`, one at a time: start, check one answer, warm up, measure."""
    levels: list[LoadLevel] = []
    note = ""
    for name in servers_for(model):
        request = requests_for(name, model, png)
        server = start_server(docker, image, server_plans()[name], model_dir)
        try:
            server.wait_ready(timeout=600)
            status, _, content = post_to(server, request)
            if status != 200:
                raise RuntimeError(f"{name} on {model}: {status} {content[:300]!r}")
            url = f"http://{server.address}:{server.port}{request.path}"
            wrk.run(url, request, 8, WARMUP_SECONDS)
            for concurrency in CONCURRENCY:
                done, used = [], []
                for _ in range(runs):
                    before = container_cpu_us(docker, server.name)
                    done.append(wrk.run(url, request, concurrency, seconds))
                    after = container_cpu_us(docker, server.name)
                    used.append(after - before if after is not None and before is not None
                                else None)  # fmt: skip
                level = summarize_runs(
                    name, model, concurrency, [r for r, _ in done], [lo for _, lo in done],
                    cpu_us=used,
                )  # fmt: skip
                log.info(
                    "serving %s, %s c=%d: %.0f req/s p50 %s ms p99 %s ms, %s us CPU/request "
                    "(load %s, %d errors)",
                    model, name, concurrency, level.throughput_rps, _cell(level.p50_ms, 2),
                    _cell(level.p99_ms), _cell(level.cpu_us_per_request, 0), _cell(level.load1),
                    level.errors,
                )  # fmt: skip
                levels.append(level)
        finally:
            if name in OUR_SERVERS:
                # A graceful stop: our server logs its batch statistics once drained.
                server.stop()
            logs = server.logs()
            server.remove()
        if name in OUR_SERVERS:
            drained = [line.split("drained; ", 1)[-1] for line in logs.splitlines()
                       if "drained; served" in line or "drained; gc:" in line]  # fmt: skip
            # Its start-up line: the workers and threads it chose for this machine.
            started = [line.split(" on port ", 1)[-1].split(" ", 2)[-1]
                       for line in logs.splitlines() if " worker(s) (" in line]  # fmt: skip
            if drained:
                chose = f" ran {started[0]};" if started else ""
                note += (f" For the {model}, {name}{chose} each worker at drain: "
                         f"{'; '.join(drained)}.")  # fmt: skip
    return levels, note.strip()


def post_to(server: ServeContainer, request: Request) -> tuple[int, dict[str, str], bytes]:
    connection = server.client(60)
    try:
        connection.request("POST", request.path, body=request.body,
                           headers={"Content-Type": request.content_type})  # fmt: skip
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def measure_serving(docker: str, image: str, *, quick: bool = False) -> ServingResult:
    seconds = QUICK_SECONDS_PER_RUN if quick else SECONDS_PER_RUN
    runs = QUICK_RUNS if quick else RUNS
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as scratch:
        root = Path(scratch)
        wrk: LoadGenerator | None = None
        try:
            peers = build_peers_image(docker, image)
            digits = make_digits(root / "digits")
            trained = train_digits_model(docker, image, root / "train", digits, SERVE_TEST_EPOCHS)
            png = sorted(digits["test"].glob("*/*.png"))[0].read_bytes()
            make_models(docker, image, root / "generic", "mlp,text")
            dirs = {
                MLP: root / "generic" / "mlp",
                DIGITS: trained.model_dir,
                TEXT: root / "generic" / "text",
            }
            (root / "bodies").mkdir()
            wrk = LoadGenerator(docker, peers, root / "bodies")
            levels: list[LoadLevel] = []
            notes: list[str] = []
            for model in MODELS:
                got, note = measure_model(
                    docker, peers, wrk, model, dirs[model], png, seconds, runs
                )
                levels += got
                notes.append(note)
        except (
            OSError,
            RuntimeError,
            TimeoutError,
            ValueError,
            subprocess.CalledProcessError,
        ) as error:
            log.warning("serving measurement failed: %s", error)
            return ServingResult(
                seconds, 0.0, (), error=f"{type(error).__name__}: {error}"[:500], runs=runs
            )
        finally:
            if wrk is not None:
                wrk.remove()
    return ServingResult(
        seconds,
        trained.test_accuracy,
        tuple(levels),
        ours_batches=" ".join(filter(None, notes)),
        runs=runs,
        load_generator=wrk.version if wrk else "",
    )
