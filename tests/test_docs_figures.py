"""Every figure a user reads is rendered by a command: bench/results/*.md are exactly what their
JSON renders to, README.md and docs/ quote them only through include blocks that equal their
source (bench/docs.py), and neither states a measured figure of its own outside them: every other
figure there is a constant of the code, a test or SageMaker, listed in CONSTANTS with what sets
it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
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


# ---------------------------------------------------------------------------------------------
# No hand-typed measurement: a figure outside the blocks is a constant, each one listed below.

# A measured figure: a number with a unit of time, size, rate or ratio ("0.4 s", "1.3-4.6 s",
# "6.67 GB", "2,816 req/s", "85 %", "3.2x", "0.15 of a core"). Not the tail of a name, a version
# or a fraction ("py311", "2.14.1", "1/100 s"), nor a dimension ("32x32", "24xlarge").
FIGURE = re.compile(
    r"(?<![\w.,/])\d+(?:[.,]\d+)*"
    r"(?:\ ?(?:ms|s|seconds?|min|minutes?|h|hours?|[KMGT]i?B(?:/s)?|kB|[GM]bit/s"
    r"|(?:req|requests|images|rows)/s|%|of\ a\ core)|x)"
    r"(?![\w/])"
)
# What a reader does not take for the document's own claim: the rendered blocks, code (fenced,
# indented, inline: commands, settings, quoted log lines such as `... for 61 s`) and comments.
_NOT_PROSE = re.compile(
    r"<!-- include .*?<!-- end include -->"
    r"|^(?P<fence>```|~~~).*?^(?P=fence)"
    r"|(?:(?<=\n\n)|(?<=\A))(?: {4}|\t).*?(?=\n(?! {4}|\t|\n)|\Z)"
    r"|`(?:[^`\n]|\n(?!\n))+`"  # inline code may wrap, within a paragraph
    r"|<!--.*?-->",
    re.DOTALL | re.MULTILINE,
)


@dataclasses.dataclass(frozen=True)
class Constant:
    """A figure that is not a measurement: `text` (whitespace as in the document, any line
    breaks) holds it wherever it appears in `file`; `why` says what sets it."""

    file: str
    text: str
    why: str

    def pattern(self) -> re.Pattern[str]:
        words = r"\s+".join(map(re.escape, self.text.split()))
        return re.compile(rf"(?<![\w.]){words}(?!\w)")  # "20 s", not inside "120 s"


CONSTANTS = (
    Constant("README.md", "20 s of silence", "the channel's silence bound (lost_after_s)"),
    Constant("docs/aws-tf-scripts.md", "5 s bounds", "tf_s3/model_dir.py's _TIMEOUT_S"),
    Constant("docs/backends.md", "within 10 s", "tests/test_hetero_cluster.py's bound"),
    Constant("docs/benchmarks.md", "30 s polls", "the sagemaker-training toolkit's workers"),
    Constant("docs/benchmarks.md", "every 0.25 s", "bench/scale.py's SAMPLE_INTERVAL_S"),
    Constant(
        "docs/benchmarks.md",
        "a 2 s warm-up at 8 clients, then each level 3 times for 3 s",
        "bench/serving.py's WARMUP_SECONDS, RUNS, SECONDS_PER_RUN",
    ),
    Constant("docs/benchmarks.md", "at least 3x Flask's", "issue 30's goal (bench/serving.py)"),
    Constant("docs/benchmarks.md", "NCCL's is 10 minutes", "torch's NCCL collective timeout"),
    Constant("docs/benchmarks.md", "20 s", "the channel's silence bound (lost_after_s)"),
    Constant("docs/benchmarks.md", "about 20 ms", "bench/programs/steps_mpi.py's --step-ms"),
    Constant("docs/benchmarks.md", "never within 120 s", "bench/torch_backend.py: FAULT_TIMEOUT_S"),
    Constant("docs/serve.md", "512 MiB", "serve/workers.py's RUNTIME_BYTES"),
    Constant("docs/serve.md", "under 1 ms", "serve/batching.py's INLINE_CALL_MAX_S"),
    Constant("docs/serve.md", "none took 20 ms", "serve/batching.py's INLINE_CALL_LIMIT_S"),
    Constant("docs/serve.md", "at most 64 KiB", "serve/batching.py's INLINE_MAX_BYTES"),
    Constant(
        "docs/serve.md", "deadline is 20 ms", "serve/tensorflow/model.py's INLINE_DEADLINE_MS"
    ),
    Constant("docs/serve.md", "cut after 20 ms", "serve/tensorflow/model.py's INLINE_DEADLINE_MS"),
    Constant(
        "docs/serve.md",
        "under 100 ms while a call runs 2 s",
        "test_ping_answers_in_100_ms_while_a_call_runs_2_s's bound and its model's call",
    ),
    Constant(
        "docs/serve.md",
        "under 100 ms beside a 2 s call",
        "test_ping_answers_in_100_ms_while_a_call_runs_2_s's bound and its model's call",
    ),
    Constant(
        "docs/serve.md",
        "about 22 MB installed",
        "the two wheels installed with pip --target, du -sh (the Dockerfile's comment)",
    ),
    Constant("docs/serve.md", "(about 3 minutes)", "pytest --durations on the test file"),
    Constant(
        "docs/serve.md",
        "at most 600 s a file",
        "serve/tensorflow/keras_export.py's EXPORT_TIMEOUT_S",
    ),
    Constant("docs/design.md", "up to 1 s after", "entrypoint/supervise.py's LOSS_SETTLE_S"),
    Constant("docs/design.md", "1 s and 20 s", "heartbeat_interval_s and lost_after_s"),
    Constant("docs/design.md", "20 s", "the channel's silence bound (lost_after_s)"),
    Constant("docs/design.md", "20 s + 10 s", "tests/test_cluster.py's bound"),
    Constant("docs/design.md", "3 s or more", "entrypoint/supervise.py's SUSPECT_SILENCE_S"),
    Constant("docs/design.md", "within 10 s (a master", "session.py's HELLO_TIMEOUT_S"),
    Constant("docs/design.md", "30 s after its own SIGTERM", "torchrun's own kill delay"),
    Constant("docs/design.md", "every 50 ms", "remote_shell.py's CALLBACK_POLL_S"),
    Constant("docs/design.md", "60 s plus 1 s per host", "orted_callback_timeout's default"),
    Constant(
        "docs/design.md", "2% of a core over a 1 s", "entrypoint/host/progress.py's MAIN_BUSY_SHARE"
    ),
    Constant("docs/design.md", "the suspicion holds for 6 s", "stall_monitor.py's CONFIRM_S"),
    Constant("docs/design.md", "read (up to 3 s)", "activity.py's FAULTHANDLER_WAIT_S"),
    Constant("docs/design.md", "is at least 30 s", "contract's MIN_STALL_TIMEOUT_S"),
    Constant("docs/design.md", "report every 5 s", "protocol.py's REPORT_INTERVAL_S"),
    Constant("docs/design.md", "confirmed for 6 s", "stall_monitor.py's CONFIRM_S"),
    Constant("docs/design.md", "ranks working 150 s", "tests/test_stall.py's silent work"),
    Constant(
        "README.md", "less than 2% of a core", "entrypoint/host/progress.py's MAIN_BUSY_SHARE"
    ),
    Constant("README.md", "3x as long", "entrypoint/stall.py's FIRST_TIMEOUT_FACTOR"),
    Constant("docs/design.md", "600 s", "stall_timeout_seconds' default"),
    Constant("docs/design.md", "120 s at start and 300 s", "HyperPod's log-cadence rules"),
    Constant("docs/design.md", "about 5x the", "NVIDIA's resiliency extension's rule"),
    Constant("docs/design.md", "10 min", "torch's collective timeout"),
    Constant("docs/design.md", "for 150 s", "tests/test_stall.py's silent job"),
    Constant("docs/design.md", "after 1 s", "entrypoint/host/rank_output.py's FLUSH_DELAY_S"),
    Constant("docs/design.md", "reaped within 1 s", "mpi/parts.py's MPIRUN_REAP_S"),
    Constant("docs/design.md", "16 KiB", "channel/protocol.py's MAX_FRAME_BYTES"),
    Constant("docs/design.md", "(4 KiB)", "PIPE_BUF on Linux (rank_output.py's PIPE_BUF)"),
    Constant("docs/design.md", "queue (1 MiB)", "rank_output.py's PENDING_LIMIT"),
    Constant("docs/design.md", "beyond 8 MiB", "rank_output.py's OWN_PENDING_LIMIT"),
    Constant("docs/design.md", "each within 5 s", "rank_output.py's DRAIN_S"),
    Constant("docs/design.md", "100 MB printed", "tests/test_pump.py's flood"),
    Constant("docs/design.md", "held for 6 s", "tests/test_pump.py's HOLD_S"),
    Constant("docs/design.md", "lines of 5 KB", "tests/test_pump.py's entry point lines"),
    Constant("docs/model.md", "100-150 MB", "SageMaker's guidance for shard sizes"),
    Constant("docs/sdk.md", "up to 300 s", "sagemaker-train's mpi_driver.py"),
    Constant("docs/sdk.md", "every 30 s", "sagemaker-train's mpi_driver.py"),
    Constant("docs/sdk.md", "30 min timeout", "torch's default process-group timeout"),
    Constant("docs/sdk.md", "gave up at 120 s", "tests/test_sdk_v3.py's wait"),
    Constant("docs/sdk.md", "within 30 s", "tests/test_sdk_v3.py's FAIL_FAST_S"),
    Constant("docs/serve.md", "30 s before SIGKILL", "SageMaker's stop of an endpoint's container"),
    Constant("docs/serve.md", "6 MB", "SAGEMAKER_MAX_PAYLOAD_IN_MB's default"),
    Constant("docs/serve.md", "about 1 MiB of input", "serve/batching.py's CALL_INPUT_BYTES"),
    Constant("docs/serve.md", "3 MB request", "the size of AWS's test_large_input body"),
    Constant("docs/serve.md", "100 MB rule", "SageMaker's batch transform payload limit"),
    Constant("docs/serve.md", "at most 20 ms", "tests/test_serve_gc.py's MOST_FULL_CPU_MS"),
    Constant("docs/serve.md", "400 MB model", "the test's model (test_serve_generic_docker)"),
    Constant("docs/serve.md", "median under 100 ms", "test_ping_answers_within_100_ms_...'s bound"),
    Constant("docs/torch.md", "**30 s**", "torch 2.10's torchrun kill delay"),
    Constant("docs/torch.md", "30 min gloo, 10 min NCCL", "torch's collective timeouts"),
    Constant("docs/torch.md", "10 minutes for NCCL", "torch's NCCL timeout"),
    Constant("docs/torch.md", "30 minutes everywhere", "torch's generic default timeout"),
    Constant("docs/torch.md", "within 10 s", "the torch tests' fail-fast bound"),
    Constant("docs/recovery.md", "up to 2 s", "entrypoint/supervise.py's RESTART_SETTLE_S"),
)


def prose(markdown: str) -> str:
    """`markdown` with what is not prose blanked out, each line where it was."""
    return _NOT_PROSE.sub(lambda found: re.sub(r"[^\n]", " ", found[0]), markdown)


def hand_typed_figures(markdown: str, constants: Sequence[Constant] = ()) -> list[tuple[int, str]]:
    """(line, figure) for every measured figure in `markdown`'s prose that none of `constants`
    holds."""
    text = prose(markdown)
    for constant in sorted(constants, key=lambda c: -len(c.text)):  # "20 s + 10 s" before "20 s"
        text = constant.pattern().sub(lambda found: re.sub(r"[^\n]", " ", found[0]), text)
    return [(text.count("\n", 0, found.start()) + 1, found[0]) for found in FIGURE.finditer(text)]


def test_no_document_states_a_measured_figure_of_its_own():
    """README.md and docs/*.md quote measurements only through include blocks: a figure typed
    by hand goes stale. Render it (bench/report.py, bench/facts.py and a block), name the test
    or command that prints it, or drop it; a constant goes in CONSTANTS, with what sets it."""
    found = []
    for path in documents():
        name = str(path.relative_to(REPO))
        ours = [c for c in CONSTANTS if c.file == name]
        figures = hand_typed_figures(path.read_text(), ours)
        found += [f"{name}:{line}: {figure}" for line, figure in figures]
    assert found == [], (
        "a measured figure typed by hand: render it (an include block), name the test or "
        "command that prints it, or, if a constant, add it to CONSTANTS with what sets it"
    )


def test_every_constant_still_holds_a_figure():
    """An entry whose text is gone, or holds no figure, would let the next one through."""
    unused = []
    for constant in CONSTANTS:
        text = prose((REPO / constant.file).read_text())
        held = [FIGURE.search(found[0]) for found in constant.pattern().finditer(text)]
        if not any(held):
            unused.append(constant)
    assert unused == []


@pytest.mark.parametrize(
    ("line", "figures"),
    [
        ("the last host exited 0.4 s and 4.1 s after the first", ["0.4 s", "4.1 s"]),
        ("walked them every 1.3-4.6 s, 160-450 ms each", ["4.6 s", "450 ms"]),
        (
            "the image 6.67 GB -> 7.11 GB, a 447 MB layer, 6 MiB",
            ["6.67 GB", "7.11 GB", "447 MB", "6 MiB"],
        ),
        (
            "2,816 req/s; 79 images/s; 1.2 GB/s; 9.4 Gbit/s",
            ["2,816 req/s", "79 images/s", "1.2 GB/s", "9.4 Gbit/s"],
        ),
        (
            "85 % of it, 1% of requests, 3.2x faster, 0.15 of a core",
            ["85 %", "1%", "3.2x", "0.15 of a core"],
        ),
        ("took 31 min, 411 s, 2 hours, 90 seconds", ["31 min", "411 s", "2 hours", "90 seconds"]),
        ("py311, TensorFlow 2.14.1, a 32x32 PNG, ml.p4d.24xlarge, 1/100 s, 2 hosts x 2", []),
        ("algo-2 rank 3, port 22000, N x 3 x H x W, 4 hosts, 64 to 70 hosts", []),
    ],
)
def test_a_figure_is_a_number_with_a_unit(line: str, figures: list[str]):
    assert [figure for _, figure in hand_typed_figures(line)] == figures


def test_blocks_code_and_constants_are_not_prose():
    document = (
        "Took 3 s.\n"
        "<!-- include r.md#goals -->\n| start | +0.29 s |\n<!-- end include -->\n"
        "```sh\nsleep 5 s\n```\n"
        "\n    Stalled: no rank wrote output for 61 s\n    (indented code)\n\n"
        "Set `-t 4 s` and wait 20 s of\nsilence; then 7 ms.\n"
    )
    assert hand_typed_figures(document) == [(1, "3 s"), (12, "20 s"), (13, "7 ms")]
    silence = Constant("x.md", "20 s of silence", "a bound")
    assert hand_typed_figures(document, [silence]) == [(1, "3 s"), (13, "7 ms")]
    # A constant is a whole figure: "20 s" leaves "120 s" alone.
    assert hand_typed_figures("120 s", [Constant("x.md", "20 s", "a bound")]) == [(1, "120 s")]


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
