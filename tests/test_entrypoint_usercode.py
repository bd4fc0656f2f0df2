"""Unit tests of script mode's pure parts: what pip's output says went wrong."""

from __future__ import annotations

import pytest

from smcommon.pipoutput import failed_requirement, last_error_line


@pytest.mark.parametrize(
    ("output", "package"),
    [
        ("ERROR: Could not find a version that satisfies the requirement nosuchpkg==1.0 "
         "(from versions: none)\nERROR: No matching distribution found for nosuchpkg==1.0\n",
         "nosuchpkg==1.0"),
        ("  error: subprocess-exited-with-error\nERROR: Failed to build badwheel\n", "badwheel"),
        ("ERROR: Invalid requirement: '!!'\n", None),
    ],
)  # fmt: skip
def test_failed_requirement_names_the_package(output, package):
    assert failed_requirement(output) == package


def test_last_error_line():
    assert last_error_line("a\nERROR: first\nb\nERROR: second\nc\n") == "ERROR: second"
    assert last_error_line("just\nlines\n") == "lines"
    assert last_error_line("") == "(no output)"
