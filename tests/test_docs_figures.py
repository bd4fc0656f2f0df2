"""Every figure a user reads is rendered by a command: bench/results/*.md are exactly what their
JSON renders to, README.md and docs/ quote them only through include blocks that equal their
source (bench/docs.py), and README.md states no measured figure of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.docs import IncludeError, anchor, documents, fill, section, stale
from bench.facts import facts_from_json, facts_markdown
from bench.report import load_results, scale_from_json, scale_markdown, to_markdown

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def test_the_rendered_reports_are_what_their_json_renders_to():
    """No hand edit: `python -m bench --render`, `python -m bench.scale --render` and `make
    facts` write these files from their JSON."""
    assert (
        to_markdown(load_results(RESULTS / "results.json")) == (RESULTS / "results.md").read_text()
    )
    scale = scale_from_json((RESULTS / "scale.json").read_text())
    assert scale_markdown(scale) == (RESULTS / "scale.md").read_text()
    facts = facts_from_json((RESULTS / "facts.json").read_text())
    assert facts_markdown(facts) == (RESULTS / "facts.md").read_text()


def test_every_include_block_equals_its_source():
    assert [path.relative_to(REPO) for path in stale()] == [], "run `python -m bench.docs`"
    blocks = sum(path.read_text().count("<!-- include ") for path in documents())
    assert blocks >= 2


# Figures README.md may state: design constants, not measurements.
README_CONSTANTS = ("20 s of silence",)
MEASURED = re.compile(r"\b\d+(?:[.,]\d+)? ?(?:GB|MB|GiB|MiB|min|ms|s)\b")


def test_the_readme_states_no_measured_figure_of_its_own():
    text = (REPO / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for constant in README_CONSTANTS:
        text = text.replace(constant, "")
    assert MEASURED.findall(text) == [], "link bench/results/*.md, or render the figure"


REPORT = """## Report

### Goals

| Goal | Met |
|---|---|
| start | yes |

### Orchestration overhead

rows
#### A sub-heading stays in its section

more
## Next
"""


def test_a_block_holds_the_section_under_its_heading():
    assert anchor("Backends: Horovod vs MultiWorkerMirroredStrategy") == (
        "backends-horovod-vs-multiworkermirroredstrategy"
    )
    assert section(REPORT, "goals") == "| Goal | Met |\n|---|---|\n| start | yes |"
    assert section(REPORT, "orchestration-overhead") == (
        "rows\n#### A sub-heading stays in its section\n\nmore"
    )
    document = "text\n<!-- include r.md#goals -->\nold\n<!-- end include -->\nafter\n"
    assert fill(document, {"r.md": REPORT}.__getitem__) == (
        "text\n<!-- include r.md#goals -->\n| Goal | Met |\n|---|---|\n| start | yes |\n"
        "<!-- end include -->\nafter\n"
    )


def test_a_block_naming_a_missing_heading_or_file_is_one_line():
    with pytest.raises(IncludeError, match=r"^include r.md#nothing: no heading with the anchor"):
        fill("<!-- include r.md#nothing -->\n<!-- end include -->", {"r.md": REPORT}.__getitem__)
    with pytest.raises(IncludeError, match=r"^include gone.md#goals: "):
        fill("<!-- include gone.md#goals -->\n<!-- end include -->", (REPO / "gone").read_text)
