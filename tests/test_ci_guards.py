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


# Each test sleeps so that both processes are busy, then names the process it ran in.
WHERE_I_RAN = """
import os, pathlib, time

def test_{index}(tmp_path_factory):
    time.sleep(0.3)
    out = pathlib.Path(os.environ["WHERE"]) / "{name}-{index}"
    out.write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_the_files_that_use_the_sdks_local_mode_run_in_one_process(tmp_path: Path) -> None:
    """Under `make test`'s --dist loadgroup: the SDK files in one process, whatever their
    number of tests (xdist had split them, before the marks came first)."""
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "__init__.py").write_text("")
    names = ("test_sdk_local", "test_sdk_v3", "test_serve_docker", "test_a", "test_b")
    for name in names:
        body = "".join(WHERE_I_RAN.format(index=index, name=name) for index in range(3))
        (tests / f"{name}.py").write_text(body)
    where = tmp_path / "where"
    where.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WHERE": str(where)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
         "--dist", "loadgroup", "-o", "markers=docker: test marker", str(tests)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ran = {path.name: path.read_text() for path in where.iterdir()}
    assert len(ran) == 15, ran
    sdk = {ran[f"{name}-{index}"] for name in names[:3] for index in range(3)}
    assert len(sdk) == 1, ran
    for name in names[3:]:
        assert len({ran[f"{name}-{index}"] for index in range(3)}) == 1, ran
    # The other files did run beside them: two processes were used.
    assert len(set(ran.values())) == 2, ran

    from tests.conftest import _SHARED_GROUPS, xdist_group  # noqa: PLC0415

    assert xdist_group(REPO / "tests" / "test_stall.py") == "test_stall"
    # Every file named there exists (a renamed file would run beside the others).
    assert all((REPO / "tests" / name).is_file() for name in _SHARED_GROUPS)
