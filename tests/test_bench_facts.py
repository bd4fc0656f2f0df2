"""bench/facts.py: the figures README.md and docs/ quote outside the benchmark (image sizes,
`make smoke`, `make test` and image build wall times) come from a command, with their
provenance."""

from __future__ import annotations

import json
import time

import pytest

from bench.facts import (
    CommandTime,
    Facts,
    ImageSize,
    built_from,
    command_from_json,
    facts_from_json,
    facts_markdown,
    facts_to_json,
    horovod_compile,
    main,
)
from bench.provenance import Provenance

WHEN = Provenance("2026-11-25 21:00 UTC", "0123456789ab", 2, 23.6, 0.5, 3.5, 1843.0)
SIZE = ImageSize("sm-horovod:cpu", 2_116_861_346, "24dd605fb0e4", "2026-11-25 20:08 UTC",
                 "d197b577337b", WHEN)  # fmt: skip
TEST = CommandTime("test", "make test", 0, WHEN)


def test_facts_render_sizes_and_times_with_their_provenance():
    markdown = facts_markdown(Facts({"sm-horovod:cpu": SIZE}, {"test": TEST}))
    assert (
        "| `sm-horovod:cpu` | 2.12 GB | `24dd605fb0e4`, 2026-11-25 20:08 UTC, `d197b577337b` "
        "| 2026-11-25 21:00 UTC, `0123456789ab`, 2 cores, 23.6 GiB |"
    ) in markdown
    assert "| `make test` | 30 min 43 s | passed | 2026-11-25 21:00 UTC," in markdown
    assert "| 0.5, 3.5 |" in markdown
    failed = facts_markdown(Facts({}, {"test": CommandTime("test", "make test", 2, WHEN)}))
    assert "| **failed** (exit 2) |" in failed
    assert "None measured yet" in failed


def test_a_fact_not_measured_again_keeps_its_figure_and_provenance():
    later = ImageSize("sm-horovod:torch-cpu", 6_667_715_306, "da01e91fe8fd", "", "?", WHEN)
    merged = Facts({"sm-horovod:cpu": SIZE}, {"test": TEST}).merged(
        Facts({"sm-horovod:torch-cpu": later}, {})
    )
    assert merged == Facts({"sm-horovod:cpu": SIZE, "sm-horovod:torch-cpu": later}, {"test": TEST})
    assert facts_from_json(facts_to_json(merged)) == merged


def test_the_build_commit_comes_from_make_builds_sha_tag():
    tags = ["sm-horovod:cpu", "sm-horovod:cpu-d197b577337b", "sm-horovod:torch-cpu-0123456789ab"]
    assert built_from(tags, "sm-horovod:cpu") == "d197b577337b"
    assert built_from(["sm-horovod:cpu"], "sm-horovod:cpu") == "?"


def test_start_and_finish_record_a_passing_runs_wall_time(tmp_path):
    assert main(["start", "test", "--records", str(tmp_path)]) == 0
    time.sleep(0.2)
    assert main(["finish", "test", "--records", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "test.json").read_text())
    assert record["command"] == "make test" and record["exit_code"] == 0
    assert 0.2 <= record["provenance"]["seconds"] < 30
    assert not (tmp_path / "test.started").exists()
    # A finish without its start (make stopped before, or a stale record) records nothing.
    assert main(["finish", "smoke", "--records", str(tmp_path)]) == 1
    assert not (tmp_path / "smoke.json").exists()


BUILD_LOG = """\
#16 [build-tf2.21-common 2/2] RUN set -eux; pip download horovod
#16 DONE 21.8s
#17 [build 1/1] RUN set -eux; pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /w
#17 4.868   Building wheel for horovod (setup.py): started
#17 DONE 754.3s
"""


def test_a_builds_time_says_how_long_horovods_compile_took_or_that_it_was_cached(tmp_path):
    assert horovod_compile(BUILD_LOG) == "Horovod's compile 12 min 34 s"
    cached = BUILD_LOG.replace("#17 DONE 754.3s", "#17 CACHED")
    assert horovod_compile(cached) == "Horovod's compile cached"
    assert horovod_compile("#3 [os 1/7] RUN apt-get\n#3 DONE 1.0s\n") == (
        "Horovod's compile not in the log"
    )
    log = tmp_path / "build.log"
    log.write_text(BUILD_LOG)
    assert main(["start", "build-tf2.21", "--records", str(tmp_path)]) == 0
    assert (
        main(["finish", "build-tf2.21", "--records", str(tmp_path), "--build-log", str(log)]) == 0
    )
    record = command_from_json((tmp_path / "build-tf2.21.json").read_text())
    assert record.command == "make build FLAVOR=tf2.21"
    markdown = facts_markdown(Facts({}, {"build-tf2.21": record}))
    assert "| `make build FLAVOR=tf2.21` (Horovod's compile 12 min 34 s) |" in markdown


def test_only_smoke_test_and_builds_are_timed(capsys):
    with pytest.raises(SystemExit):
        main(["start", "deploy"])
    assert "not smoke, test or build-<flavor>: 'deploy'" in capsys.readouterr().err
