"""main's program checks: registered by the packages that know the program, run before any
process starts, each failure one line (BadInput)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from entrypoint.contract import ContractError, ContractPaths, read_contract
from entrypoint.main import registered_checks, run_program_checks
from smcommon.names import BUILTIN_PROGRAM_CHECK, MODEL_DIR_CHECK


def _contract(tmp_path: Path, hyperparameters: Mapping[str, str], *, train: bool = True):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]})
    )
    (config / "hyperparameters.json").write_text(json.dumps(dict(hyperparameters)))
    (config / "inputdataconfig.json").write_text(json.dumps({"train": {}} if train else {}))
    if train:
        (tmp_path / "input" / "data" / "train").mkdir(parents=True)
    return read_contract(ContractPaths(tmp_path), {})


def _failing(message: str):
    def check(hyperparameters: Mapping[str, str], env: Mapping[str, str]) -> str | None:
        return message

    return check


def test_the_builtin_programs_check_fails_with_the_hyperparameters_file(tmp_path: Path):
    contract = _contract(tmp_path, {})
    checks = {BUILTIN_PROGRAM_CHECK: _failing("epochs: not a number")}
    with pytest.raises(ContractError) as raised:
        run_program_checks(contract, {}, checks)
    assert str(raised.value) == f"{contract.paths.hyperparameters}: epochs: not a number"


def test_a_user_script_skips_the_builtin_check_but_not_model_dir(tmp_path: Path):
    contract = _contract(tmp_path, {"sagemaker_program": "train.py"}, train=False)
    run_program_checks(contract, {}, {BUILTIN_PROGRAM_CHECK: _failing("never run")})
    with pytest.raises(ContractError, match=r"^bucket gone$"):
        run_program_checks(contract, {}, {MODEL_DIR_CHECK: _failing("bucket gone")})


def test_an_image_without_checks_runs_none(tmp_path: Path):
    run_program_checks(_contract(tmp_path, {"epochs": "x"}), {}, {})


def test_the_builtin_program_needs_its_train_channel(tmp_path: Path):
    with pytest.raises(ContractError, match="required channel 'train' is missing"):
        run_program_checks(_contract(tmp_path, {}, train=False), {}, {})


def test_no_check_is_registered_outside_an_installed_image():
    # The checkout is not installed; in the image pyproject.toml's entry points register both
    # (tests/test_image.py).
    assert registered_checks("sm_horovod.no_such_group") == {}
