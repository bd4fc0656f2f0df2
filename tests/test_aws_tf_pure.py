"""Scripts written for AWS's TensorFlow containers, the pure parts: the SDK's data-parallel
distribution as the entry point reads it, and the data-parallel API's mapping onto Horovod
(no TensorFlow on the host; tests/test_aws_tf_scripts.py runs the real thing in containers)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import smdistributed
from entrypoint.contract import Backend, ContractError, parse_contract
from entrypoint.launches.mpi.plan import build_mpirun_argv
from entrypoint.plan import make_plan
from smdistributed.dataparallel import mapping
from smdistributed.dataparallel.mapping import ReduceOp
from tf_s3.model_dir import missing_bucket_message

RESOURCE = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]}
HYPERPARAMETERS_FILE = Path("/opt/ml/input/config/hyperparameters.json")


def parse(hyperparameters: dict[str, str]):
    return parse_contract(
        resource_config_text=json.dumps(RESOURCE),
        hyperparameters_text=json.dumps(hyperparameters),
        input_data_config_text=None,
        env={},
    )


# What the SDK (v2) sends for distribution={"smdistributed": {"dataparallel": {"enabled": True,
# "custom_mpi_options": ...}}} (sagemaker/estimator.py Framework._distribution_configuration),
# JSON-encoded as it encodes every value.
SDK_SMDDP = {
    "sagemaker_distributed_dataparallel_enabled": "true",
    "sagemaker_instance_type": '"ml.p4d.24xlarge"',
    "sagemaker_distributed_dataparallel_custom_mpi_options": (
        '"-x HOROVOD_CYCLE_TIME=1 --NCCL_DEBUG WARN"'
    ),
    "sagemaker_program": '"train.py"',
    "sagemaker_submit_directory": '"s3://bucket/job/source/sourcedir.tar.gz"',
    "model_dir": '"s3://bucket/job/model"',
}


def test_the_sdks_data_parallel_distribution_runs_under_mpirun():
    contract = parse(SDK_SMDDP)
    assert contract.settings.backend is Backend.MPI
    assert contract.settings.custom_mpi_options == (
        "-x", "HOROVOD_CYCLE_TIME=1", "-x", "NCCL_DEBUG=WARN",
    )  # fmt: skip
    # The script gets model_dir, as in AWS's containers; the toolkit's own keys stay out.
    assert contract.program_hyperparameters == {"model_dir": "s3://bucket/job/model"}
    plan = make_plan(contract, gpu_count=8)
    assert plan.ranks_per_host == 8
    argv = build_mpirun_argv(plan, {"SM_MODEL_DIR": "/opt/ml/model"})
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    # The options come last before the program, where the toolkit puts them.
    assert argv[-11:] == [
        "-x", "HOROVOD_CYCLE_TIME=1", "-x", "NCCL_DEBUG=WARN",
        "sm-horovod-rank", "python", "-m", "mpi4py", "train.py", "--model_dir",
        "s3://bucket/job/model",
    ]  # fmt: skip
    assert "-np" in argv and argv[argv.index("-np") + 1] == "16"


def test_without_gpus_ranks_per_host_decides():
    plan = make_plan(parse({**SDK_SMDDP, "ranks_per_host": "2"}), gpu_count=0)
    assert (plan.ranks_per_host, plan.total_ranks) == (2, 4)
    assert make_plan(parse(SDK_SMDDP), gpu_count=0).ranks_per_host == 1


def test_empty_custom_options_and_both_distributions_options():
    contract = parse({**SDK_SMDDP, "sagemaker_distributed_dataparallel_custom_mpi_options": '""'})
    assert contract.settings.custom_mpi_options == ()
    both = parse(
        {
            **SDK_SMDDP,
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_custom_mpi_options": '"-x A=1"',
            "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x B=2"',
        }
    )
    assert both.settings.backend is Backend.MPI
    assert both.settings.custom_mpi_options == ("-x", "A=1", "-x", "B=2")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sagemaker_multi_worker_mirrored_strategy_enabled": "true"},
         "hyperparameters sagemaker_distributed_dataparallel_enabled=true and "
         "sagemaker_multi_worker_mirrored_strategy_enabled=true: the data-parallel library over "
         "MPI and a tf.distribute strategy cannot both run the job; choose one distribution"),
        ({"sagemaker_mpi_enabled": "false"},
         "hyperparameters sagemaker_mpi_enabled=false and "
         "sagemaker_distributed_dataparallel_enabled=true: the data-parallel library runs under "
         "mpirun; choose one distribution"),
        ({"sagemaker_distributed_dataparallel_custom_mpi_options": '"--NCCL_DEBUG"'},
         "hyperparameter sagemaker_distributed_dataparallel_custom_mpi_options='--NCCL_DEBUG': "
         "--NCCL_DEBUG needs a level"),
        ({"sagemaker_distributed_dataparallel_custom_mpi_options": '"-x \\"A"'},
         "hyperparameter sagemaker_distributed_dataparallel_custom_mpi_options='-x \"A' cannot "
         "be split (No closing quotation)"),
    ],
)  # fmt: skip
def test_data_parallel_conflicts_and_bad_options_are_one_line(extra, message):
    with pytest.raises(ContractError) as raised:
        parse({**SDK_SMDDP, **extra})
    assert str(raised.value) == f"{HYPERPARAMETERS_FILE}: {message}"


def test_model_parallel_is_refused_in_one_line():
    # distribution={"smdistributed": {"modelparallel": {"enabled": True, "parameters": {...}}},
    # "mpi": {"enabled": True}}: the SDK sends the parameters as mp_parameters.
    with pytest.raises(ContractError) as raised:
        parse(
            {
                "sagemaker_mpi_enabled": "true",
                "sagemaker_distributed_dataparallel_enabled": "false",
                "mp_parameters": json.dumps({"partitions": 2, "microbatches": 4}),
            }
        )
    assert str(raised.value) == (
        f"{HYPERPARAMETERS_FILE}: hyperparameter mp_parameters: SageMaker's model parallel "
        "library (smdistributed.modelparallel) exists only in AWS's own images: use "
        "distribution={'mpi': {'enabled': True}} with a Horovod script, or "
        "distribution={'smdistributed': {'dataparallel': {'enabled': True}}"
    )
    assert parse({"mp_parameters": "{}"}).settings.backend is Backend.MPI


# --- the API mapping


@pytest.mark.parametrize(
    ("op", "horovod"),
    [(ReduceOp.AVERAGE, "Average"), (ReduceOp.SUM, "Sum"), (ReduceOp.MIN, "Min"),
     (ReduceOp.MAX, "Max")],
)  # fmt: skip
def test_reduce_ops_map_to_horovods(op, horovod):
    assert mapping.horovod_op_name(op, api="allreduce") == horovod


def test_an_op_that_is_not_a_reduce_op_is_one_line():
    with pytest.raises(ValueError, match=r"^oob_allreduce: op='sum' is not one of ") as raised:
        mapping.horovod_op_name("sum", api="oob_allreduce")
    assert str(raised.value).endswith("ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX")


def test_a_name_this_image_lacks_is_one_line_and_still_an_attribute_error():
    error = mapping.unsupported(
        "smdistributed.dataparallel.tensorflow", "get_worker_comm", mapping.TENSORFLOW_NAMES
    )
    assert isinstance(error, AttributeError)
    text = str(error)
    assert "\n" not in text
    assert text.startswith(
        "smdistributed.dataparallel.tensorflow.get_worker_comm is not provided by this image "
        "(sm-horovod maps the SageMaker data-parallel API onto Horovod; available: init, "
    )


def test_bucket_cap_mb_is_accepted_and_said_to_be_ignored():
    assert mapping.bucket_cap_note(25) is None
    assert mapping.bucket_cap_note(64) == (
        "DistributedOptimizer: bucket_cap_mb=64 is ignored; Horovod's fusion buffer is "
        "HOROVOD_FUSION_THRESHOLD (bytes), e.g. HOROVOD_FUSION_THRESHOLD=67108864 in the job's "
        "environment"
    )


# The library's documented names (the SageMaker Python SDK's doc/api/training/sdp_versions/
# latest/smd_data_parallel_tensorflow.rst), written out here independently of mapping.py.
DOCUMENTED_TENSORFLOW_NAMES = {
    "init", "shutdown", "size", "local_size", "rank", "local_rank", "allreduce",
    "oob_allreduce", "broadcast", "broadcast_variables", "broadcast_global_variables",
    "overlap", "DistributedOptimizer", "DistributedGradientTape",
    "BroadcastGlobalVariablesHook", "Compression", "ReduceOp",
}  # fmt: skip
SMDDP_TF = Path(smdistributed.__file__).parent / "dataparallel" / "tensorflow"


def _module_defines(path: Path) -> set[str]:
    """The names a module binds at its top level (def, class, assignment, import), read from
    its source: the TensorFlow modules need Horovod, which the host does not have."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


def test_every_documented_name_is_defined_by_the_module():
    assert set(mapping.TENSORFLOW_NAMES) == DOCUMENTED_TENSORFLOW_NAMES
    assert _module_defines(SMDDP_TF / "__init__.py") >= DOCUMENTED_TENSORFLOW_NAMES
    keras = _module_defines(SMDDP_TF / "keras" / "__init__.py")
    # What AWS's Keras examples use; callbacks is a subpackage imported by name.
    assert {"DistributedOptimizer", "callbacks", "rank", "size", "init", "local_rank"} <= keras
    assert set(mapping.KERAS_NAMES) <= keras
    callbacks = _module_defines(SMDDP_TF / "keras" / "callbacks.py")
    assert {"BroadcastGlobalVariablesCallback", "MetricAverageCallback"} <= callbacks
    assert set(mapping.KERAS_CALLBACK_NAMES) <= callbacks


# --- model_dir on S3


def test_a_model_dir_on_a_missing_bucket_is_one_line():
    looked_up: list[str] = []

    def no_such_bucket(bucket: str) -> str | None:
        looked_up.append(bucket)
        return "404"

    assert missing_bucket_message("model_dir", "s3://wrong/job/model", no_such_bucket) == (
        "hyperparameter model_dir=s3://wrong/job/model: S3 bucket 'wrong' does not exist "
        "(NoSuchBucket)"
    )
    assert looked_up == ["wrong"]


@pytest.mark.parametrize("code", [None, "403", "AccessDenied", "301"])
def test_an_answer_that_says_nothing_about_the_bucket_lets_the_job_run(code):
    # A role may write objects without the right to list the bucket; a network may have no
    # route to S3 (None): neither proves the bucket missing.
    assert missing_bucket_message("model_dir", "s3://b/m", lambda _bucket: code) is None


@pytest.mark.parametrize("url", ["/opt/ml/model", "gs://b/m", "s3:///no-bucket", ""])
def test_only_s3_model_dirs_are_looked_up(url):
    def never(bucket: str) -> str | None:
        raise AssertionError(bucket)

    assert missing_bucket_message("model_dir", url, never) is None


@pytest.mark.parametrize(
    ("env", "installed", "expected"),
    [
        # The 2.21 line: tf_keras is installed, the job said nothing: Keras 2, as the scripts
        # were written for.
        ({}, True, "1"),
        # The job's own choice stands, Keras 3 included.
        ({"TF_USE_LEGACY_KERAS": "0"}, True, None),
        ({"TF_USE_LEGACY_KERAS": "1"}, True, None),
        ({"TF_USE_LEGACY_KERAS": ""}, True, None),
        # The 2.14 line: no tf_keras (its tf.keras is Keras 2): the environment stays as it is.
        ({}, False, None),
    ],
)
def test_the_tensorflow_api_asks_for_keras_2_where_tf_keras_is_installed(env, installed, expected):
    assert mapping.legacy_keras_setting(env, tf_keras_installed=installed) == expected
