"""Measurement: `serve` (uvicorn + dynamic batching) against the usual hand-written baseline
(gunicorn sync workers + Flask, one model call per request: bench/programs/flask_baseline.py),
in the same image, on the same model, one server at a time, for two models: the built-in
model trained on the digits (single-PNG requests) and a generic SavedModel, a small Keras MLP
on 8 float features (what the SDK's predictor.predict(array) sends: a bare JSON list).

Concurrency 1, 8 and 32 from a load generator on this machine (one thread and one keep-alive
connection per concurrent client), each level bounded by time and by a request count; latency
p50/p99 and throughput. Goal, for each model: at concurrency 32, at least 3x the baseline's
throughput with a lower p99.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.summary import Goal
from harness.digits import make_digits
from harness.serving import SERVE_TEST_EPOCHS, ServeContainer, make_models, train_digits_model

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = (1, 8, 32)
GOAL_CONCURRENCY = 32
GOAL_THROUGHPUT_RATIO = 3.0
# AWS's example sets gunicorn's workers to the CPU count; this machine's is 2.
BASELINE_WORKERS = 2
# Each level stops at whichever comes first.
MAX_REQUESTS_PER_LEVEL = 20_000
OURS, BASELINE = "serve (uvicorn + dynamic batching)", "Flask + gunicorn sync workers"
DIGITS, MLP = "digits CNN, one PNG", "Keras MLP, 8 floats"
# One row of the MLP's 8 features, as predictor.predict(np.array([[...]])) sends it.
MLP_BODY = b"[[0.5, -1.0, 0.25, 2.0, -0.75, 1.5, 0.0, -2.5]]"


@dataclasses.dataclass(frozen=True)
class LoadLevel:
    server: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput_rps: float
    p50_ms: float | None
    p99_ms: float | None
    model: str = DIGITS


@dataclasses.dataclass(frozen=True)
class ServingResult:
    seconds_per_level: float
    test_accuracy: float
    levels: tuple[LoadLevel, ...]
    ours_batches: str = ""
    error: str | None = None


# --- pure ------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, round(fraction * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize_level(  # noqa: PLR0917  (one level's figures)
    server: str,
    concurrency: int,
    latencies_s: Sequence[float],
    errors: int,
    seconds: float,
    model: str = DIGITS,
) -> LoadLevel:
    ordered = sorted(latencies_s)
    p50, p99 = percentile(ordered, 0.50), percentile(ordered, 0.99)
    return LoadLevel(
        server=server,
        concurrency=concurrency,
        requests=len(ordered),
        errors=errors,
        seconds=seconds,
        throughput_rps=len(ordered) / seconds if seconds > 0 else 0.0,
        p50_ms=None if p50 is None else p50 * 1e3,
        p99_ms=None if p99 is None else p99 * 1e3,
        model=model,
    )


def serving_goal(result: ServingResult | None, model: str = DIGITS) -> Goal:
    name = f"serve throughput at concurrency {GOAL_CONCURRENCY}"
    if model != DIGITS:
        name += f" ({model})"
    target = f"≥ {GOAL_THROUGHPUT_RATIO:g}x the Flask baseline, lower p99"
    levels = {
        (lv.server, lv.concurrency): lv
        for lv in (result.levels if result else ())
        if lv.model == model
    }
    ours, base = levels.get((OURS, GOAL_CONCURRENCY)), levels.get((BASELINE, GOAL_CONCURRENCY))
    if ours is None or base is None or not base.throughput_rps or ours.p99_ms is None:
        return Goal(name, target, "not measured", None)
    ratio = ours.throughput_rps / base.throughput_rps
    measured = (
        f"{ratio:.1f}x ({ours.throughput_rps:.0f} vs {base.throughput_rps:.0f} req/s), "
        f"p99 {ours.p99_ms:.0f} vs {base.p99_ms:.0f} ms"
    )
    met = ratio >= GOAL_THROUGHPUT_RATIO and base.p99_ms is not None and ours.p99_ms < base.p99_ms
    return Goal(name, target, measured, met)


def serving_goals(result: ServingResult | None) -> list[Goal]:
    """One goal per model measured (results from before the MLP have the digits only)."""
    models = [DIGITS, *sorted({lv.model for lv in (result.levels if result else ())} - {DIGITS})]
    return [serving_goal(result, model) for model in models]


def serving_lines(result: ServingResult | None) -> list[str]:
    lines = ["### Serving", ""]
    if result is None:
        return []
    if result.error:
        return [*lines, f"Not measured ({result.error}).", ""]
    lines += [
        "Two models: single 32x32 PNG digits per request (`image/png`), the built-in model "
        f"trained on the digits (test accuracy {result.test_accuracy:.3f}); and a small Keras "
        "MLP SavedModel (8 float features, 32 hidden units, 3 outputs) with one row per request "
        "as the SDK's `predictor.predict(array)` sends it (`application/json`, `[[...]]`). "
        "Both servers in the same image, "
        "one at a time, on every core; the load generator runs on the same machine (one "
        "thread and keep-alive connection per client), "
        f"{result.seconds_per_level:g} s per level. Baseline: AWS's bring-your-own pattern, "
        f"gunicorn with {BASELINE_WORKERS} sync workers (the CPU count) and a Flask app calling "
        "the SavedModel once per request (`bench/programs/flask_baseline.py`). "
        f"{result.ours_batches}",
        "",
    ]
    rows = [
        [
            lv.model,
            lv.server,
            str(lv.concurrency),
            f"{lv.throughput_rps:,.0f}",
            "-" if lv.p50_ms is None else f"{lv.p50_ms:.1f}",
            "-" if lv.p99_ms is None else f"{lv.p99_ms:.1f}",
            f"{lv.requests:,}",
            str(lv.errors),
        ]
        for lv in result.levels
    ]
    header = [
        "Model", "Server", "Concurrency", "Req/s", "p50 (ms)", "p99 (ms)", "Requests", "Errors",
    ]  # fmt: skip
    return [
        *lines,
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def serving_from_json(raw: dict | None) -> ServingResult | None:
    if raw is None:
        return None
    levels = tuple(LoadLevel(**level) for level in raw["levels"])
    return ServingResult(**{**raw, "levels": levels})


# --- shell -----------------------------------------------------------------------------------


def run_load(  # noqa: PLR0917  (one level's parameters)
    server: ServeContainer,
    name: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    model: str = DIGITS,
) -> LoadLevel:
    """`concurrency` clients, each sending the next request as soon as its last one answered,
    until `seconds` passed or MAX_REQUESTS_PER_LEVEL were sent."""
    content_type = "image/png" if model == DIGITS else "application/json"
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + seconds

    def client() -> None:
        connection = server.client(timeout=60)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if len(latencies) + errors[0] >= MAX_REQUESTS_PER_LEVEL:
                        return
                sent = time.monotonic()
                try:
                    connection.request(
                        "POST", "/invocations", body=body, headers={"Content-Type": content_type}
                    )
                    response = connection.getresponse()
                    response.read()
                    ok = response.status == 200
                except (OSError, http.client.HTTPException):
                    ok = False
                    connection.close()
                    connection = server.client(timeout=60)
                took = time.monotonic() - sent
                with lock:
                    if ok:
                        latencies.append(took)
                    else:
                        errors[0] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    level = summarize_level(
        name, concurrency, latencies, errors[0], time.monotonic() - started, model
    )
    log.info(
        "serving %s, %s c=%d: %.0f req/s p50 %s ms p99 %s ms (%d requests, %d errors)",
        model,
        name,
        concurrency,
        level.throughput_rps,
        level.p50_ms and f"{level.p50_ms:.1f}",
        level.p99_ms and f"{level.p99_ms:.1f}",
        level.requests,
        level.errors,
    )
    return level


def _measure_server(
    make: Callable[[], ServeContainer], name: str, body: bytes, seconds: float, model: str
) -> tuple[list[LoadLevel], str]:
    server = make().start()
    try:
        server.wait_ready(timeout=600)
        # Warm every worker (the baseline loads its model lazily in each one).
        run_load(server, name, body, 2 * BASELINE_WORKERS, 2.0, model)
        levels = [run_load(server, name, body, c, seconds, model) for c in CONCURRENCY]
    finally:
        # A graceful stop first: our server logs its batch statistics when it has drained.
        server.stop()
        logs = server.logs()
        server.remove()
    summary = next((line for line in logs.splitlines() if "drained; served" in line), "")
    return levels, summary


def _baseline(docker: str, image: str, model_dir: Path) -> ServeContainer:
    return ServeContainer(
        docker,
        image,
        model_dir,
        command=(
            "gunicorn", "-k", "sync", "-w", str(BASELINE_WORKERS),
            "-b", "0.0.0.0:8080", "--timeout", "60",
            "--chdir", "/opt/bench", "flask_baseline:app",
        ),
        extra_mounts=((REPO / "bench" / "programs", "/opt/bench"),),
    )  # fmt: skip


def _measure_pair(  # noqa: PLR0917  (one pair's parameters)
    docker: str, image: str, model_dir: Path, body: bytes, seconds: float, model: str
) -> tuple[list[LoadLevel], str]:
    """Our server, then the baseline, on the same model folder."""
    ours, batches = _measure_server(
        lambda: ServeContainer(docker, image, model_dir), OURS, body, seconds, model
    )
    baseline, _ = _measure_server(
        lambda: _baseline(docker, image, model_dir), BASELINE, body, seconds, model
    )
    note = batches.split("drained; ", 1)[-1] if batches else ""
    return [*ours, *baseline], (f"For the {model}, our server {note}." if note else "")


def measure_serving(docker: str, image: str, seconds: float) -> ServingResult:
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as scratch:
        root = Path(scratch)
        try:
            digits = make_digits(root / "digits")
            trained = train_digits_model(docker, image, root / "train", digits, SERVE_TEST_EPOCHS)
            body = sorted(digits["test"].glob("*/*.png"))[0].read_bytes()
            digit_levels, digit_note = _measure_pair(
                docker, image, trained.model_dir, body, seconds, DIGITS
            )
            make_models(docker, image, root / "generic", "mlp")
            mlp_levels, mlp_note = _measure_pair(
                docker, image, root / "generic" / "mlp", MLP_BODY, seconds, MLP
            )
        except (OSError, RuntimeError, TimeoutError, subprocess.CalledProcessError) as error:
            log.warning("serving measurement failed: %s", error)
            return ServingResult(seconds, 0.0, (), error=f"{type(error).__name__}: {error}"[:500])
    return ServingResult(
        seconds,
        trained.test_accuracy,
        (*digit_levels, *mlp_levels),
        ours_batches=" ".join(filter(None, (digit_note, mlp_note))),
    )
