"""Each bench section carries its own date, commit, machine and load (bench/provenance.py):
`--only NAME` replaces that section's and keeps the others', results.json keeps them, and
results.md renders them in the sections table, in the goals table and under each heading."""

from __future__ import annotations

import dataclasses

from bench.__main__ import merge_into
from bench.bandwidth import AllreducePoint, BandwidthResult
from bench.machine import Machine
from bench.provenance import Provenance, duration_text, provenance_text, start_measuring
from bench.report import Results, load_results, to_markdown, write_report

MACHINE = Machine(
    date="2026-11-22 01:36 UTC", cpu_model="cpu", cores=2, memory_gib=23.6, kernel="6",
    docker_engine="20.10", commit="e655e354d11f-dirty", image="sm-horovod:cpu",
    image_versions={},
)  # fmt: skip
OLD = Provenance(
    "2026-11-22 01:36 UTC", "e655e354d11f-dirty", 2, 23.6, 0.4, 1.2, 95.0, "medians of 3 runs"
)
NEW = Provenance("2026-11-25 21:00 UTC", "0123456789ab", 16, 125.0, 3.2, 2.8, 432.0, "`--quick`, 1 run each")  # fmt: skip  # noqa: E501
BANDWIDTH = BandwidthResult(
    iperf3_gbit_s=10.0, iperf3_version="iperf 3.12", fusion_threshold="64 MiB",
    points=(AllreducePoint(megabytes=4, seconds=0.01, busbw_gbit_s=4.6, fraction_of_iperf3=0.46),),
    error=None,
)  # fmt: skip


def results(**sections: Provenance) -> Results:
    return Results(MACHINE, False, 3, 900.0, (), (), BANDWIDTH, None, None, sections=sections)


def test_provenance_line_says_when_where_at_which_commit_and_under_what_load():
    assert provenance_text(NEW) == (
        "Measured 2026-11-25 21:00 UTC at commit `0123456789ab` on 16 cores, 125 GiB; load "
        "average 3.2 before, 2.8 after; took 7 min 12 s; `--quick`, 1 run each."
    )
    assert provenance_text(None).startswith("When, at which commit and under what load: not")
    assert [duration_text(s) for s in (4.25, 42, 434, 3800)] == [
        "4.2 s", "42 s", "7 min 14 s", "1 h 3 min",
    ]  # fmt: skip


def test_a_measurement_records_its_own_load_and_duration():
    provenance = start_measuring("medians of 3 runs").finish()
    assert provenance.cores >= 1 and provenance.memory_gib > 0
    assert provenance.seconds >= 0 and provenance.settings == "medians of 3 runs"
    assert provenance.commit  # a sha, maybe -dirty


def test_each_section_renders_its_own_provenance_under_its_heading_and_in_the_goals():
    markdown = to_markdown(results(bandwidth=NEW))
    assert "### Allreduce bandwidth\n\n" + provenance_text(NEW) + "\n" in markdown
    assert (
        "| bandwidth | 2026-11-25 21:00 UTC | `0123456789ab` | 16, 125 GiB | 3.2, 2.8 "
        "| 7 min 12 s |" in markdown
    )
    assert "| overhead | not recorded |" in markdown
    assert "| **no** | bandwidth, 2026-11-25 21:00 UTC |" in markdown
    assert (
        "| start overhead | ≤ 2 s over bare mpirun at 4 hosts | not measured at 4 hosts "
        in markdown
    )
    # The header no longer credits every section to one run.
    assert "the whole run took" not in markdown


def test_only_one_section_replaces_its_provenance_and_keeps_the_others(tmp_path):
    write_report(results(overhead=OLD, bandwidth=OLD), tmp_path)
    assert load_results(tmp_path / "results.json").sections == {"overhead": OLD, "bandwidth": OLD}
    fresh_machine = dataclasses.replace(MACHINE, date="2026-11-25 21:00 UTC", commit="0123")
    fresh = dataclasses.replace(results(bandwidth=NEW), machine=fresh_machine)
    merged = merge_into(tmp_path / "results.json", fresh, "bandwidth")
    assert merged.sections == {"overhead": OLD, "bandwidth": NEW}
    assert merged.machine == fresh_machine


def test_results_without_sections_still_load(tmp_path):
    write_report(results(), tmp_path)
    raw = (tmp_path / "results.json").read_text().replace('"sections": {}', '"unused": {}')
    (tmp_path / "results.json").write_text(raw)
    assert load_results(tmp_path / "results.json").sections == {}
