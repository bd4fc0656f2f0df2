"""Unit tests of the strategies benchmark's pure parts: the step time from the metrics lines,
the JSON round trip and the table."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.strategies import (
    StrategiesResult,
    StrategyFault,
    StrategyRun,
    step_seconds,
    strategies_from_json,
    strategies_lines,
)

LOG = """
2026 host=algo-1 rank=0 INFO epoch=1 loss=1.0 accuracy=0.5 images_per_sec=10.0000
[1,0]<stdout>:2026 host=algo-1 rank=0 INFO epoch=2 loss=0.5 accuracy=0.8 images_per_sec=640.0000
2026 host=algo-1 rank=0 INFO epoch=3 loss=0.4 accuracy=0.9 val_loss=nan images_per_sec=320.0000
2026 host=algo-1 rank=0 INFO epoch=4 loss=0.3 accuracy=0.9 images_per_sec=160.0000
"""


def test_step_time_is_the_median_after_the_first_epoch():
    # batch 32 x 2 hosts: 64 images per step; 640, 320, 160 images/s -> 0.1, 0.2, 0.4 s.
    assert step_seconds(LOG, batch_size=32, hosts=2) == pytest.approx(0.2)
    assert step_seconds("no metrics", batch_size=32, hosts=2) is None


RESULT = StrategiesResult(
    epochs=15,
    batch_size=32,
    runs=(
        StrategyRun("horovod", 2, 0.99, 0.05, 150.0),
        StrategyRun("multi_worker_mirrored", 2, None, None, 3.0, error="BadInput: a|b"),
    ),
    faults=(StrategyFault(3, 0, 1.2, {"algo-2": 137, "algo-1": 1}, "HostLost: host algo-2"),),
)


def test_json_round_trip():
    assert strategies_from_json(json.loads(json.dumps(dataclasses.asdict(RESULT)))) == RESULT
    assert strategies_from_json(None) is None


def test_table():
    lines = strategies_lines(RESULT)
    assert "| Horovod (mpirun) | 2 | 0.9900 | 50 | 150 |  |" in lines
    assert "| MWMS (TF_CONFIG) | 2 | - | - | 3 | BadInput: a/b |" in lines
    assert "| 1 | 1.2 | algo-1: 1, algo-2: 137 | HostLost: host algo-2 |" in lines
    assert strategies_lines(None) == []
