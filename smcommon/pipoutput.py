"""What pip's output says went wrong, for a one-line failure: the entry point's script mode and
serve's `code/requirements.txt` both install with pip and report its failures the same way."""

from __future__ import annotations

import re

# pip's own lines naming the requirement it could not install.
_PIP_FAILED_REQUIREMENT = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"Could not find a version that satisfies the requirement (\S+)"),
    re.compile(r"Failed to build (\S+)"),
    re.compile(r"Failed building wheel for (\S+)"),
)


def failed_requirement(pip_output: str) -> str | None:
    """The requirement pip names as the one it could not install, if it names one."""
    for pattern in _PIP_FAILED_REQUIREMENT:
        match = pattern.search(pip_output)
        if match:
            return match.group(1).rstrip(".,:")
    return None


def last_error_line(output: str) -> str:
    """pip's last ERROR line (else its last line): the one that says what went wrong."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1]
