"""CI's guards on the test run itself (tests/conftest.py): in CI (CI=true) a skipped docker test
fails the run, whatever skipped it; outside CI it stays a skip; unit tests may skip anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SKIPPING_TESTS = """
import pytest

@pytest.mark.docker(needs_image=False)
def test_docker_skipped_inside():
    pytest.skip("a prerequisite is missing")

@pytest.mark.skipif(True, reason="skipped at collection")
@pytest.mark.docker(needs_image=False)
def test_docker_skipped_by_a_marker():
    pass

def test_unit_skipped():
    pytest.skip("a unit test may skip")
"""


def run_pytest(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "__init__.py").write_text("")
    (tests / "test_skips.py").write_text(SKIPPING_TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "true" if ci else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", "-q",
         "-o", "markers=docker: test marker", str(tests)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_skipped_docker_test_fails_the_run_in_ci(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, ci=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 skipped, 1 error" in result.stdout, result.stdout
    assert (
        "test_docker_skipped_inside - docker test skipped in CI (CI=true): "
        "Skipped: a prerequisite is missing"
    ) in result.stdout
    assert "test_docker_skipped_by_a_marker - docker test skipped in CI" in result.stdout


def test_outside_ci_a_docker_test_may_skip(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, ci=False)
    assert result.returncode == 0, result.stdout
    assert "3 skipped" in result.stdout, result.stdout


def test_the_files_that_use_the_sdks_local_mode_run_in_one_process() -> None:
    from tests.conftest import xdist_group  # noqa: PLC0415 - the hook's rule, not a fixture

    tests = REPO / "tests"
    for name in ("test_sdk_local.py", "test_sdk_v3.py", "test_serve_docker.py"):
        assert xdist_group(tests / name) == "sdk-local-mode"
    assert xdist_group(tests / "test_stall.py") == "test_stall"
    # Every file named there exists (a renamed file would run beside the others).
    from tests.conftest import _SHARED_GROUPS  # noqa: PLC0415

    assert all((tests / name).is_file() for name in _SHARED_GROUPS)
