"""The stack's outputs as a plain dict, for the launcher: `from cfn.outputs import stack_outputs`.

The parent stack (the one `--stack NAME` names) carries every output the launcher reads;
`stack_outputs` checks they are there and fills the optional ones with "" when the stack
did not create that file system (or notebook), so callers never meet a missing key.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

# Every stack has these; a stack without one of them is not usable by the launcher.
REQUIRED_OUTPUTS: tuple[str, ...] = (
    "TrainingSubnetIds",
    "TrainingSecurityGroupId",
    "TrainingRoleArn",
    "NotebookRoleArn",
    "BucketName",
)
# Present only when the stack created the resource (CreateEfs, CreateFsx, CreateNotebook).
OPTIONAL_OUTPUTS: tuple[str, ...] = (
    "EfsFileSystemId",
    "FsxFileSystemId",
    "FsxMountName",
    "NotebookInstanceName",
)

# Statuses in which a stack's outputs describe resources that exist.
_USABLE_STATUSES = frozenset(
    {
        "CREATE_COMPLETE",
        "UPDATE_COMPLETE",
        "UPDATE_ROLLBACK_COMPLETE",
        "IMPORT_COMPLETE",
        "IMPORT_ROLLBACK_COMPLETE",
        # An update under way keeps the previous outputs until it completes.
        "UPDATE_IN_PROGRESS",
        "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
        "UPDATE_ROLLBACK_IN_PROGRESS",
        "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
    }
)


class StackOutputsError(ValueError):
    """The stack or one of the outputs the launcher needs is missing. One-line message."""


def stack_outputs(cfn_client: Any, stack_name: str) -> dict[str, str]:
    """Return the outputs of `stack_name` as {OutputKey: OutputValue}.

    `cfn_client` is a boto3 CloudFormation client. The required outputs are checked, the
    optional ones default to "". Raises StackOutputsError (a ValueError) with a one-line
    message when the stack does not exist, is not in a usable state, or lacks an output.
    Other API errors (credentials, throttling) propagate as botocore exceptions.
    """
    try:
        stacks = cfn_client.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationError" and "does not exist" in error.get("Message", ""):
            region = cfn_client.meta.region_name
            raise StackOutputsError(
                f"stack {stack_name!r} does not exist in {region} (deploy it with `make stack`)"
            ) from exc
        raise
    if not stacks:
        raise StackOutputsError(f"stack {stack_name!r} not found")
    stack = stacks[0]
    status = stack.get("StackStatus", "")
    if status not in _USABLE_STATUSES:
        raise StackOutputsError(
            f"stack {stack_name!r} is {status}; its outputs are not usable "
            "(see `python -m cfn.deploy` output or the CloudFormation console)"
        )
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    missing = [key for key in REQUIRED_OUTPUTS if not outputs.get(key)]
    if missing:
        raise StackOutputsError(
            f"stack {stack_name!r} has no output {', '.join(missing)}; "
            "is it an sm-horovod stack (cfn/main.yaml)?"
        )
    for key in OPTIONAL_OUTPUTS:
        outputs.setdefault(key, "")
    return outputs
