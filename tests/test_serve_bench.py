"""bench/serving.py's pure parts: percentiles, the goal, the table, the JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.serving import (
    BASELINE,
    DIGITS,
    MLP,
    OURS,
    LoadLevel,
    ServingResult,
    percentile,
    serving_from_json,
    serving_goal,
    serving_goals,
    serving_lines,
    summarize_level,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_summarize_level() -> None:
    level = summarize_level(OURS, 8, [0.003, 0.001, 0.002, 0.004], errors=1, seconds=2.0)
    assert level == LoadLevel(OURS, 8, 4, 1, 2.0, 2.0, 2.0, 4.0)


def _result(ours_rps: float, ours_p99: float) -> ServingResult:
    return ServingResult(
        seconds_per_level=10.0,
        test_accuracy=0.97,
        levels=(
            LoadLevel(OURS, 32, 100, 0, 10.0, ours_rps, 5.0, ours_p99),
            LoadLevel(BASELINE, 32, 100, 0, 10.0, 100.0, 50.0, 400.0),
        ),
    )


@pytest.mark.parametrize(
    ("ours_rps", "ours_p99", "met"),
    [(350.0, 90.0, True), (250.0, 90.0, False), (400.0, 500.0, False)],
)
def test_goal_needs_3x_throughput_and_a_lower_p99(
    ours_rps: float, ours_p99: float, met: bool
) -> None:
    goal = serving_goal(_result(ours_rps, ours_p99))
    assert goal.met is met
    assert goal.measured.startswith(f"{ours_rps / 100:.1f}x")
    assert serving_goal(None).met is None


def test_table_and_json_round_trip() -> None:
    result = _result(350.0, 90.0)
    lines = serving_lines(result)
    assert lines[0] == "### Serving"
    assert f"| {DIGITS} | {OURS} | 32 | 350 | 5.0 | 90.0 | 100 | 0 |" in lines
    assert serving_from_json(json.loads(json.dumps(dataclasses.asdict(result)))) == result
    assert serving_lines(None) == []
    failed = ServingResult(10.0, 0.0, (), error="TimeoutError: x")
    assert serving_lines(failed)[-2] == "Not measured (TimeoutError: x)."


def test_one_goal_per_model_and_old_results_still_load() -> None:
    digits = _result(350.0, 90.0)
    mlp_levels = tuple(dataclasses.replace(lv, model=MLP) for lv in digits.levels)
    both = dataclasses.replace(digits, levels=digits.levels + mlp_levels)
    assert [goal.name for goal in serving_goals(both)] == [
        "serve throughput at concurrency 32",
        f"serve throughput at concurrency 32 ({MLP})",
    ]
    assert all(goal.met for goal in serving_goals(both))
    old = json.loads(json.dumps(dataclasses.asdict(digits)))
    for level in old["levels"]:
        del level["model"]
    assert serving_from_json(old) == digits
