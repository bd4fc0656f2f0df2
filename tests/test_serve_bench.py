"""bench/serving.py's pure parts: wrk's report, medians, the requests per protocol, the goals,
the table, the JSON round trip and the peers' build."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bench.serving import (
    BASELINE,
    DIGITS,
    FLOOR,
    KSERVE,
    MLP,
    MLSERVER,
    MODELS,
    OURS,
    PEERS_CONTEXT,
    TEXT,
    LoadLevel,
    ServingResult,
    WrkRun,
    build_argv,
    ca_bundle,
    parse_cpu_usage,
    parse_wrk,
    requests_for,
    server_plans,
    servers_for,
    serving_from_json,
    serving_goals,
    serving_lines,
    summarize_runs,
    wrk_argv,
)

# wrk 4.1.0 (Debian bookworm), `wrk --latency -t 2 -c 32 -d 3s -s post.lua URL`.
WRK_32 = """\
Running 3s test @ http://172.17.0.3:8080/invocations
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    23.45ms    4.12ms  61.02ms   80.12%
    Req/Sec   683.10     55.21   787.00     71.67%
  Latency Distribution
     50%   22.91ms
     75%   25.10ms
     90%   28.33ms
     99%   39.87ms
  4086 requests in 3.00s, 810.43KB read
  Non-2xx or 3xx responses: 12
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:   1361.05
Transfer/sec:    269.95KB
"""
WRK_1 = """\
Running 3s test @ http://172.17.0.3:8080/invocations
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   850.11us  120.00us   1.20s    91.00%
    Req/Sec     1.17k    40.00     1.25k    70.00%
  Latency Distribution
     50%  812.00us
     75%  900.00us
     90%    1.00ms
     99%    1.02s
  3510 requests in 3.01s, 700.00KB read
Requests/sec:   1166.11
Transfer/sec:    232.56KB
"""


def test_parse_wrk_reads_counts_errors_and_percentiles() -> None:
    run = parse_wrk(WRK_32 + "p99.9 latency: 61234us\n")
    assert run == WrkRun(
        requests=4086, seconds=3.0, non_2xx=12, socket_errors=3, p50_ms=22.91, p99_ms=39.87,
        p999_ms=61.234,
    )  # fmt: skip
    assert run.ok_rps == pytest.approx((4086 - 12) / 3.0)


def test_parse_wrk_converts_units_and_defaults_missing_errors_to_zero() -> None:
    run = parse_wrk(WRK_1)
    assert run.requests == 3510
    assert run.seconds == pytest.approx(3.01)
    assert run.p50_ms == pytest.approx(0.812)
    assert run.p99_ms == pytest.approx(1020.0)
    assert (run.non_2xx, run.socket_errors) == (0, 0)


def test_parse_wrk_refuses_what_is_not_a_report() -> None:
    with pytest.raises(ValueError, match="not a wrk report: 'unable to connect"):
        parse_wrk("unable to connect to 172.17.0.3:8080 Connection refused\n")


def _run(rps: float, p50: float, p99: float, non_2xx: int = 0) -> WrkRun:
    return WrkRun(int(rps * 3) + non_2xx, 3.0, non_2xx, 0, p50, p99)


def test_summarize_runs_takes_each_figures_median() -> None:
    runs = [_run(100, 5.0, 30.0), _run(300, 2.0, 10.0, non_2xx=3), _run(200, 9.0, 20.0)]
    level = summarize_runs(OURS, MLP, 32, runs, loads=[1.5, None, 2.5])
    assert level == LoadLevel(
        server=OURS,
        concurrency=32,
        requests=1800,
        errors=3,
        seconds=3.0,
        throughput_rps=200.0,
        p50_ms=5.0,
        p99_ms=20.0,
        model=MLP,
        load1=2.0,
        runs=3,
        runs_rps=(100.0, 300.0, 200.0),
    )
    assert summarize_runs(OURS, MLP, 1, []).p50_ms is None


def test_cpu_per_request_is_each_runs_cpu_over_its_requests_then_the_median() -> None:
    runs = [_run(100, 5.0, 30.0), _run(200, 2.0, 10.0), _run(300, 9.0, 20.0)]
    # 300, 600 and 900 responses; a run whose reading failed is left out.
    level = summarize_runs(OURS, MLP, 32, runs, cpu_us=[90_000, None, 270_000])
    assert level.cpu_us_per_request == 300.0
    assert summarize_runs(OURS, MLP, 32, runs).cpu_us_per_request is None


def test_cpu_usage_reads_cgroup_v2_and_v1() -> None:
    v2 = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n"
    assert parse_cpu_usage(v2) == 123456
    assert parse_cpu_usage("987654321\n") == 987654
    assert parse_cpu_usage("cat: no such file\n") is None


def test_wrk_argv_uses_at_most_two_threads_and_never_more_than_connections() -> None:
    assert wrk_argv("http://a:8080/x", 1, 3.0)[:7] == [
        "wrk",
        "--latency",
        "-t",
        "1",
        "-c",
        "1",
        "-d",
    ]
    argv = wrk_argv("http://a:8080/x", 32, 2.4)
    assert argv[argv.index("-t") + 1] == "2"
    assert argv[argv.index("-d") + 1] == "2s"
    assert argv[-1] == "http://a:8080/x"


def test_every_server_gets_the_same_instance_in_its_own_protocol() -> None:
    png = b"\x89PNG..."
    assert requests_for(OURS, MLP, png).body == b"[[0.5, -1.0, 0.25, 2.0, -0.75, 1.5, 0.0, -2.5]]"
    assert requests_for(BASELINE, DIGITS, png) == requests_for(OURS, DIGITS, png)
    assert requests_for(OURS, DIGITS, png).content_type == "image/png"
    kserve = requests_for(KSERVE, DIGITS, png)
    assert kserve.path == "/v1/models/model:predict"
    assert json.loads(kserve.body) == {"instances": [{"b64": "iVBORy4uLg=="}]}
    v2 = requests_for(MLSERVER, MLP, png)
    assert v2.path == "/v2/models/model/infer"
    assert json.loads(v2.body)["inputs"][0]["shape"] == [1, 8]
    text = json.loads(requests_for(MLSERVER, TEXT, png).body)["inputs"][0]
    assert text["datatype"] == "BYTES"
    assert json.loads(requests_for(OURS, TEXT, png).body)["instances"] == text["data"]
    with pytest.raises(ValueError, match="unknown model"):
        requests_for(OURS, "resnet", png)


def test_the_floor_runs_on_the_mlp_only_and_every_server_has_a_plan() -> None:
    assert FLOOR in servers_for(MLP)
    assert FLOOR not in servers_for(DIGITS)
    assert set(server_plans()) == set(servers_for(MLP))


def test_peer_names_carry_the_pinned_versions() -> None:
    for server, package, venv in (
        (KSERVE, "kserve", "kserve"),
        (MLSERVER, "mlserver", "mlserver"),
        (FLOOR, "granian", "kserve"),
    ):
        pins = dict(
            line.split("==")
            for line in (PEERS_CONTEXT / f"requirements-{venv}.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")
        )
        assert re.search(rf"\b{re.escape(pins[package])}\b", server), server


def _level(  # noqa: PLR0917  (one row of figures)
    server: str, model: str, concurrency: int, rps: float, p50: float, p99: float
) -> LoadLevel:
    return LoadLevel(server, concurrency, 100, 0, 3.0, rps, p50, p99, model, load1=1.25, runs=3)


def _result(
    ours_rps: float = 1000.0, ours_p99: float = 20.0, ours_p50: float = 2.0
) -> ServingResult:
    levels = []
    for model in MODELS:
        levels += [
            _level(OURS, model, 32, ours_rps, 15.0, ours_p99),
            _level(BASELINE, model, 32, 300.0, 90.0, 120.0),
            _level(KSERVE, model, 32, 600.0, 40.0, 60.0),
            _level(MLSERVER, model, 32, 500.0, 50.0, 70.0),
            _level(OURS, model, 1, 400.0, ours_p50, 4.0),
            _level(BASELINE, model, 1, 380.0, 2.5, 4.5),
        ]
    levels.append(_level(FLOOR, MLP, 32, 1800.0, 10.0, 25.0))
    return ServingResult(3.0, 0.97, tuple(levels), runs=3, load_generator="wrk 4.1.0")


def test_goal_rows_all_met() -> None:
    goals = serving_goals(_result())
    assert len(goals) == 3 * 4 + 1
    assert all(goal.met is True for goal in goals), [g for g in goals if not g.met]
    flask = goals[0]
    assert flask.name == f"serve vs Flask at 32 clients ({MLP})"
    assert flask.measured == "3.33x (1,000 vs 300 req/s), p99 20.0 vs 120.0 ms, load 1.2"
    floor = next(goal for goal in goals if "floor" in goal.name)
    assert floor.measured.startswith("0.56x (1,000 vs 1,800 req/s)")


@pytest.mark.parametrize(
    ("ours_rps", "ours_p99", "ours_p50", "missed"),
    [
        # 2.9x Flask, and under half the floor.
        (870.0, 20.0, 2.0, {"Flask", "floor"}),
        # Fast enough, but a p99 above KServe's and MLServer's (and Flask's) on every model.
        (1000.0, 130.0, 2.0, {"Flask", "KServe", "MLServer"}),
        # Slower than KServe at 32 clients.
        (590.0, 20.0, 2.0, {"Flask", "KServe", "floor"}),
        # A lone client waits longer than on Flask.
        (1000.0, 20.0, 2.6, {"p50"}),
    ],
)
def test_goal_rows_print_misses(
    ours_rps: float, ours_p99: float, ours_p50: float, missed: set[str]
) -> None:
    goals = serving_goals(_result(ours_rps, ours_p99, ours_p50))
    failed = {goal.name for goal in goals if goal.met is False}
    kinds = {
        kind
        for kind in ("Flask", "KServe", "MLServer", "floor", "p50")
        for name in failed
        if kind in name
    }
    assert kinds == missed
    assert all(goal.met is not None for goal in goals)


def test_goals_without_figures_are_not_measured() -> None:
    assert {goal.met for goal in serving_goals(None)} == {None}
    assert {goal.measured for goal in serving_goals(None)} == {"not measured"}
    partial = dataclasses.replace(
        _result(), levels=tuple(lv for lv in _result().levels if lv.server not in (KSERVE, FLOOR))
    )
    by_name = {goal.name: goal for goal in serving_goals(partial)}
    assert by_name[f"serve vs KServe at 32 clients ({TEXT})"].met is None
    assert by_name[f"serve vs the floor at 32 clients ({MLP})"].measured == "not measured"
    assert by_name[f"serve vs MLServer at 32 clients ({TEXT})"].met is True


def test_table_groups_by_model_then_clients_and_round_trips_json() -> None:
    result = _result()
    lines = serving_lines(result)
    assert lines[0] == "### Serving"
    assert "wrk 4.1.0" in lines[2] and "medians of 3 run(s)" in lines[2]
    assert (
        lines[4]
        == "| Model | Clients | Server | Req/s | p50 (ms) | p99 (ms) | p99.9 (ms) | CPU (µs/req) "
        "| Load 1m | Errors |"
    )
    rows = [line for line in lines[6:] if line.startswith("| ")]
    assert rows[0] == f"| {MLP} | 1 | {OURS} | 400 | 2.00 | 4.0 | - | - | 1.2 | 0 |"
    assert [row.split(" | ")[2] for row in rows[2:7]] == [OURS, BASELINE, KSERVE, MLSERVER, FLOOR]
    assert rows[-1].startswith(f"| {TEXT} | 32 | {MLSERVER} | 500 |")
    assert serving_from_json(json.loads(json.dumps(dataclasses.asdict(result)))) == result
    assert serving_lines(None) == []
    failed = ServingResult(3.0, 0.0, (), error="RuntimeError: cannot build x")
    assert serving_lines(failed)[-2] == "Not measured (RuntimeError: cannot build x)."


def test_results_from_before_the_peers_still_load() -> None:
    old = {
        "seconds_per_level": 10.0,
        "test_accuracy": 0.97,
        "levels": [
            {"server": OURS, "concurrency": 32, "requests": 100, "errors": 0, "seconds": 10.0,
             "throughput_rps": 1341.0, "p50_ms": 23.1, "p99_ms": 35.1, "model": DIGITS},
            {"server": BASELINE, "concurrency": 32, "requests": 100, "errors": 0, "seconds": 10.0,
             "throughput_rps": 419.0, "p50_ms": 75.2, "p99_ms": 110.9},
        ],
        "ours_batches": "",
        "error": None,
    }  # fmt: skip
    result = serving_from_json(old)
    assert result is not None and result.runs == 1
    by_name = {goal.name: goal for goal in serving_goals(result)}
    assert by_name[f"serve vs Flask at 32 clients ({DIGITS})"].met is True
    assert by_name[f"serve vs KServe at 32 clients ({DIGITS})"].met is None


def test_ca_bundle_follows_the_makefile() -> None:
    present = frozenset({"/etc/ssl/cert.pem", "/etc/pki/tls/certs/ca-bundle.crt"})
    assert ca_bundle({}, present) == "/etc/pki/tls/certs/ca-bundle.crt"
    assert ca_bundle({"CA_BUNDLE": ""}, present) is None
    assert ca_bundle({"CA_BUNDLE": "/x.pem"}, frozenset()) == "/x.pem"
    assert ca_bundle({}, frozenset()) is None


def test_build_argv_passes_the_bundle_as_a_secret() -> None:
    context = Path("/repo/bench/peers")
    assert build_argv("docker", True, "sm:cpu", "sm:cpu-peers", context, "/ca.crt") == [
        "docker", "buildx", "build", "--load", "--build-arg", "IMAGE=sm:cpu",
        "--secret", "id=ca,src=/ca.crt", "--tag", "sm:cpu-peers", "/repo/bench/peers",
    ]  # fmt: skip
    assert build_argv("docker", False, "sm:cpu", "t", context, None)[:4] == [
        "docker", "build", "--build-arg", "IMAGE=sm:cpu",
    ]  # fmt: skip
