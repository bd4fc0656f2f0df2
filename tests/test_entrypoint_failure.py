"""Unit tests of the failure value and the failure file."""

from __future__ import annotations

from smcommon.failure import MESSAGE_LIMIT, Failure, Reason, format_failure, record_failure


def test_failure_line_is_one_capped_line(tmp_path):
    line = format_failure(Reason.BAD_INPUT, "a\nb " + "x" * 5000)
    assert line.startswith("BadInput: a b x")
    assert len(line) == MESSAGE_LIMIT
    assert "\n" not in line
    first = Failure(Reason.HOST_LOST, "first", "algo-1")
    assert record_failure(tmp_path, first) == first
    # The second learns which failure won, as the file holds it.
    won = record_failure(tmp_path, Failure(Reason.TRAINING_FAILED, "second", "algo-2"))
    assert won == Failure(Reason.HOST_LOST, "first (on algo-1)")
    assert won.line == first.line
    assert (tmp_path / "failure").read_text() == "HostLost: first (on algo-1)\n"
    assert [p.name for p in tmp_path.iterdir()] == ["failure"]


def test_a_failure_is_formatted_once_with_its_host():
    assert Failure(Reason.HOST_LOST, "host algo-2 lost", "algo-1").line == (
        "HostLost: host algo-2 lost (on algo-1)"
    )
    assert Failure(Reason.STOPPED, "stopped by SIGTERM").line == "Stopped: stopped by SIGTERM"
    # Folded and capped in the value already: what travels is what the line can hold.
    long = Failure(Reason.TRAINING_FAILED, "a\n  b " + "x" * 5000, "algo-3")
    assert long.message.startswith("a b x")
    assert len(long.message) == MESSAGE_LIMIT
    assert len(long.line) == MESSAGE_LIMIT
    assert long.line.endswith("...")
