"""cfn/: template checks, the whole stack deployed in moto, and the deploy CLI's failure path.

No network: moto stands in for AWS, botocore's Stubber for a stack that rolls back.
moto has two gaps this file bridges (see `_moto_nested_stack_outputs`): it does not resolve
`Fn::GetAtt NestedStack.Outputs.X`, and it evaluates Exports of outputs whose Condition is
false. It has no FSx, so FSx is checked at template level and stays off in moto.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import ANY, Stubber

from cfn import deploy as deploy_mod
from cfn.outputs import OPTIONAL_OUTPUTS, REQUIRED_OUTPUTS, StackOutputsError, stack_outputs

CFN_DIR = Path(deploy_mod.__file__).resolve().parent
TEMPLATES = ("main.yaml", *deploy_mod.NESTED_TEMPLATES)
REGION = "us-east-1"
BUCKET = "sm-horovod-test-bucket"
STACK = "smh"
LAUNCHER_OUTPUTS = (
    "TrainingSubnetIds",
    "TrainingSecurityGroupId",
    "EfsFileSystemId",
    "FsxFileSystemId",
    "FsxMountName",
    "TrainingRoleArn",
    "NotebookRoleArn",
    "BucketName",
)
BANNERS = (
    "## Stack Metadata ##",
    "## Stack Parameters ##",
    "## Conditions for Parameters ##",
    "## Resources ##",
    "## Outputs ##",
)
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")


# --------------------------------------------------------------------------- template loading


class _CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation short tags turned into their long form."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _tag)


def load(name: str) -> dict[str, Any]:
    return yaml.load((CFN_DIR / name).read_text(), Loader=_CfnLoader)  # noqa: S506 (SafeLoader subclass)


def resources_of(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for p in role["Properties"]["Policies"] for s in p["PolicyDocument"]["Statement"]]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# --------------------------------------------------------------------------- template checks


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_layout_and_parameter_style(name: str) -> None:
    text = (CFN_DIR / name).read_text()
    template = load(name)
    wanted = [b for b in BANNERS if "Conditions" not in b or "Conditions" in template]
    positions = [text.find(b) for b in wanted]
    assert -1 not in positions, f"{name}: missing banner {wanted[positions.index(-1)]}"
    assert positions == sorted(positions), f"{name}: banners out of order"

    nested_inputs = [
        value
        for stack in resources_of(template, "AWS::CloudFormation::Stack").values()
        for value in stack["Properties"]["Parameters"].values()
    ]
    interface = template["Metadata"]["AWS::CloudFormation::Interface"]
    grouped = [p for group in interface["ParameterGroups"] for p in group["Parameters"]]
    assert sorted(grouped) == sorted(template["Parameters"]), f"{name}: ParameterGroups"
    assert set(interface["ParameterLabels"]) == set(template["Parameters"]), f"{name}: labels"

    for key, parameter in template["Parameters"].items():
        if key.startswith("Create"):
            assert parameter["AllowedValues"] == ["true", "false"], key
            condition = template.get("Conditions", {}).get(f"{key}Condition")
            if condition is None:  # only handed on to the nested stack that uses it
                assert {"Ref": key} in nested_inputs, f"{name}: {key} has no {key}Condition"
            else:
                assert condition == {"Fn::Equals": [{"Ref": key}, "true"]}, key
        if key.endswith("AvailabilityZone"):
            assert parameter["Type"] == "AWS::EC2::AvailabilityZone::Name", key


def test_nested_stack_wiring_matches_the_children() -> None:
    main = load("main.yaml")
    stacks = resources_of(main, "AWS::CloudFormation::Stack")
    children = {}
    for logical, stack in stacks.items():
        url = stack["Properties"]["TemplateURL"]["Fn::Sub"]
        child_name = url.rsplit("/", 1)[1]
        assert child_name in deploy_mod.NESTED_TEMPLATES
        child = children[logical] = load(child_name)
        passed = set(stack["Properties"]["Parameters"])
        assert passed <= set(child["Parameters"]), f"{logical}: unknown parameters"
        required = {k for k, p in child["Parameters"].items() if "Default" not in p}
        assert required <= passed, f"{logical}: required parameters not passed"

    # Every !GetAtt Stack.Outputs.X names an output the child declares.
    refs = re.findall(r"!GetAtt (\w+)\.Outputs\.(\w+)", (CFN_DIR / "main.yaml").read_text())
    assert refs
    for logical, output in refs:
        assert output in children[logical]["Outputs"], f"{logical}.Outputs.{output}"

    outputs = main["Outputs"]
    assert set(LAUNCHER_OUTPUTS) <= set(outputs)
    assert set(REQUIRED_OUTPUTS) | set(OPTIONAL_OUTPUTS) <= set(outputs)
    for key, output in outputs.items():
        assert output["Export"]["Name"] == {"Fn::Sub": f"${{AWS::StackName}}-{key}"}
    # Outputs that exist only with their resource are conditional, the rest are not.
    assert outputs["EfsFileSystemId"]["Condition"] == "CreateEfsCondition"
    assert outputs["FsxFileSystemId"]["Condition"] == "CreateFsxCondition"
    assert outputs["FsxMountName"]["Condition"] == "CreateFsxCondition"
    assert all("Condition" not in outputs[k] for k in REQUIRED_OUTPUTS)


def test_security_groups() -> None:
    network = load("network.yaml")
    groups = resources_of(network, "AWS::EC2::SecurityGroup")
    rules = {
        **resources_of(network, "AWS::EC2::SecurityGroupIngress"),
        **resources_of(network, "AWS::EC2::SecurityGroupEgress"),
    }
    # Every rule has a description, inline or not.
    for logical, group in groups.items():
        # An inline egress list is what removes the default allow-all egress rule.
        assert group["Properties"].get("SecurityGroupEgress"), f"{logical}: default egress"
        for rule in (
            group["Properties"].get("SecurityGroupIngress", [])
            + group["Properties"]["SecurityGroupEgress"]
        ):
            assert rule.get("Description"), logical
    for logical, rule in rules.items():
        assert rule["Properties"].get("Description"), logical

    ingress = rules["TrainingSelfIngress"]["Properties"]
    egress = rules["TrainingSelfEgress"]["Properties"]
    assert ingress["IpProtocol"] == egress["IpProtocol"] == "-1"
    assert (
        ingress["GroupId"] == ingress["SourceSecurityGroupId"] == {"Ref": "TrainingSecurityGroup"}
    )
    assert egress["DestinationSecurityGroupId"] == {"Ref": "TrainingSecurityGroup"}

    def ports(group: str) -> set[tuple[int, int]]:
        return {
            (r["Properties"]["FromPort"], r["Properties"]["ToPort"])
            for r in rules.values()
            if r["Type"] == "AWS::EC2::SecurityGroupIngress"
            and r["Properties"]["GroupId"] == {"Ref": group}
        }

    assert ports("FsxSecurityGroup") == {(988, 988), (1018, 1023)}
    assert ports("EfsSecurityGroup") == {(2049, 2049)}
    # Nothing is open to the world inbound.
    assert not [
        r
        for r in rules.values()
        if r["Type"] == "AWS::EC2::SecurityGroupIngress" and "CidrIp" in r["Properties"]
    ]


def test_network_is_private_with_endpoints_and_optional_nat() -> None:
    network = load("network.yaml")
    resources = network["Resources"]
    endpoints = resources_of(network, "AWS::EC2::VPCEndpoint")
    services = {
        e["Properties"]["ServiceName"]["Fn::Sub"].rsplit("}.", 1)[1]: e["Properties"]
        for e in endpoints.values()
    }
    assert set(services) == {"s3", "sagemaker.api", "sts", "logs", "ecr.api", "ecr.dkr"}
    assert services["s3"]["VpcEndpointType"] == "Gateway"
    for name in ("sagemaker.api", "sts", "logs", "ecr.api", "ecr.dkr"):
        assert services[name]["PrivateDnsEnabled"] is True, name
    for logical in ("InternetGateway", "NatGateway", "PublicSubnet", "PrivateDefaultRoute"):
        assert resources[logical]["Condition"] == "CreateNatCondition", logical
    assert network["Parameters"]["CreateNat"]["Default"] == "false"
    for subnet in resources_of(network, "AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    training = resources["TrainingSubnet"]["Properties"]
    assert training["AvailabilityZone"] == {"Ref": "TrainingAvailabilityZone"}
    assert resources["SecondarySubnet"]["Properties"]["AvailabilityZone"] == {
        "Ref": "SecondaryAvailabilityZone"
    }


def test_storage_efs_and_fsx() -> None:
    storage = load("storage.yaml")
    resources = storage["Resources"]
    efs = resources["EfsFileSystem"]
    assert efs["Properties"]["Encrypted"] is True
    assert efs["DeletionPolicy"] == efs["UpdateReplacePolicy"] == "Retain"
    assert efs["Condition"] == "CreateEfsCondition"
    targets = resources_of(storage, "AWS::EFS::MountTarget")
    assert {t["Properties"]["SubnetId"]["Ref"] for t in targets.values()} == {
        "TrainingSubnetId",
        "SecondarySubnetId",
    }

    fsx = resources["FsxFileSystem"]
    props = fsx["Properties"]
    assert fsx["Condition"] == "CreateFsxCondition"
    assert props["FileSystemType"] == "LUSTRE"
    assert props["SubnetIds"] == [{"Ref": "TrainingSubnetId"}]
    assert props["SecurityGroupIds"] == [{"Ref": "FsxSecurityGroupId"}]
    assert set(storage["Parameters"]["FsxDeploymentType"]["AllowedValues"]) == {
        "SCRATCH_2",
        "PERSISTENT_2",
    }
    lustre = props["LustreConfiguration"]
    assert lustre["DeploymentType"] == {"Ref": "FsxDeploymentType"}
    # SCRATCH_2 links S3 with ImportPath, PERSISTENT_2 with a data repository association.
    assert lustre["ImportPath"]["Fn::If"][0] == "FsxScratchCondition"
    assert lustre["ImportPath"]["Fn::If"][1] == {"Fn::Sub": "s3://${BucketName}/${FsxS3Prefix}"}
    dra = resources["FsxDataRepositoryAssociation"]
    assert dra["Condition"] == "CreateFsxPersistentCondition"
    assert dra["Properties"]["DataRepositoryPath"] == {
        "Fn::Sub": "s3://${BucketName}/${FsxS3Prefix}/"
    }
    assert storage["Outputs"]["FsxMountName"]["Value"] == {
        "Fn::GetAtt": ["FsxFileSystem", "LustreMountName"]
    }


def test_notebook_is_locked_down() -> None:
    notebook = load("notebook.yaml")
    props = notebook["Resources"]["NotebookInstance"]["Properties"]
    assert props["RootAccess"] == "Disabled"
    assert props["DirectInternetAccess"] == "Disabled"
    assert props["InstanceMetadataServiceConfiguration"] == {
        "MinimumInstanceMetadataServiceVersion": "2"
    }
    assert props["KmsKeyId"] == {"Ref": "NotebookKey"}
    assert props["SubnetId"] == {"Ref": "SubnetId"}
    assert notebook["Parameters"]["NotebookPlatform"]["AllowedValues"] == ["notebook-al2-v3"]
    assert notebook["Resources"]["NotebookKey"]["Properties"]["EnableKeyRotation"] is True


def test_lifecycle_script_is_valid_bash_that_never_fails_start(tmp_path: Path) -> None:
    config = load("notebook.yaml")["Resources"]["MountLifecycleConfig"]["Properties"]
    script = config["OnStart"][0]["Content"]["Fn::Base64"]["Fn::Sub"]
    assert script.startswith("#!/bin/bash\n")
    assert "set -e" not in script
    assert "-o tls" in script
    assert script.rstrip().endswith("exit 0")
    # Only the three parameters are substituted; shell variables never use ${...}.
    assert set(re.findall(r"\$\{([^}]*)\}", script)) == {
        "EfsFileSystemId",
        "FsxDnsName",
        "FsxMountName",
    }
    path = tmp_path / "on-start.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_iam_roles_are_least_privilege() -> None:
    iam = load("iam.yaml")
    roles = resources_of(iam, "AWS::IAM::Role")
    # Actions that have no resource-level permissions, the only ones allowed on "*".
    star_ok = {
        "ecr:GetAuthorizationToken",
        "cloudwatch:PutMetricData",
        "sagemaker:ListTrainingJobs",
    }
    for logical, role in roles.items():
        assert "ManagedPolicyArns" not in role["Properties"], logical
        for statement in statements(role):
            actions = as_list(statement["Action"])
            assert not [a for a in actions if a == "*" or a.endswith(":*")], (logical, actions)
            if "*" in as_list(statement["Resource"]):
                assert all(
                    a in star_ok or a.split(":")[1].startswith(("Describe", "List"))
                    for a in actions
                ), (logical, actions)

    training = {s["Sid"]: s for s in statements(roles["TrainingRole"])}
    assert training["EcrPullThisRepository"]["Resource"]["Fn::Sub"].endswith(
        ":repository/${EcrRepositoryName}"
    )
    assert training["BucketObjects"]["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/*"
    }
    assert "ec2:Vpc" in training["VpcModeNetworkInterfaces"]["Condition"]["ArnEquals"]
    assert "cloudwatch:namespace" in training["TrainingJobMetrics"]["Condition"]["StringLike"]

    notebook = statements(roles["NotebookRole"])
    pass_role = [s for s in notebook if "iam:PassRole" in as_list(s["Action"])]
    assert len(pass_role) == 1
    assert pass_role[0]["Resource"] == {"Fn::GetAtt": ["TrainingRole", "Arn"]}
    assert pass_role[0]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}
    }


def test_cfn_lint_with_custom_rules_is_clean_and_rules_bite() -> None:
    cfnlint_api = pytest.importorskip("cfnlint.api")
    from cfnlint.config import ManualArgs  # noqa: PLC0415 (optional dev tool)

    config = ManualArgs(
        regions=[REGION],
        include_checks=["I"],
        custom_rules=str(CFN_DIR / "custom-rules.txt"),
    )
    for name in TEMPLATES:
        matches = cfnlint_api.lint((CFN_DIR / name).read_text(), config=config)
        assert not matches, f"{name}: {[str(m) for m in matches]}"

    # The custom rules catch a notebook with root access, or with the setting left out.
    loose = (CFN_DIR / "notebook.yaml").read_text()
    enabled = loose.replace("RootAccess: Disabled", "RootAccess: Enabled")
    omitted = loose.replace("      DirectInternetAccess: Disabled\n", "")
    assert any("RootAccess" in m.message for m in cfnlint_api.lint(enabled, config=config)), (
        "RootAccess: Enabled not caught"
    )
    assert any(
        "DirectInternetAccess" in m.message for m in cfnlint_api.lint(omitted, config=config)
    ), "missing DirectInternetAccess not caught"


# --------------------------------------------------------------------------- moto


def _moto_nested_stack_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Teach moto `Fn::GetAtt Child.Outputs.X`, as CloudFormation resolves it.

    moto splits `!GetAtt A.Outputs.X` into three parts and has no Outputs attribute on a
    nested stack; it also evaluates the Export of an output whose Condition is false, so
    an output of a child (or a child) that was not created resolves to "" here. An output
    the child does not declare still fails, as it would in CloudFormation.
    """
    from moto.cloudformation import models, parsing  # noqa: PLC0415 (test-only dependency)

    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        target = resource_json.get("Fn::GetAtt") if isinstance(resource_json, dict) else None
        if target:
            parts = target.split(".") if isinstance(target, str) else list(target)
            if len(parts) == 3 and parts[1] == "Outputs":
                child = resources_map.get(parts[0])
                if child is None:
                    return ""
                if isinstance(child, models.Stack):
                    if parts[2] not in child.template_dict.get("Outputs", {}):
                        raise KeyError(f"{parts[0]} declares no output {parts[2]}")
                    output = child.output_map[parts[2]]
                    return "" if output is None else output.value
        return original(resource_json, resources_map)

    monkeypatch.setattr(parsing, "clean_json", clean_json)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    moto = pytest.importorskip("moto")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _moto_nested_stack_outputs(monkeypatch)
    with moto.mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield


def _deploy(*flags: str) -> int:
    argv = ["deploy", "--stack", STACK, "--region", REGION, "--bucket", BUCKET]
    return deploy_mod.main([*argv, "--poll-seconds", "0", *flags])


@pytest.mark.usefixtures("aws")
def test_stack_deploys_in_moto_with_the_outputs_the_launcher_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _deploy("--create-efs", "true", "--create-fsx", "false") == 0
    printed = capsys.readouterr().out
    assert f"BucketName={BUCKET}" in printed

    outputs = stack_outputs(boto3.client("cloudformation", region_name=REGION), STACK)
    assert set(LAUNCHER_OUTPUTS) <= set(outputs)
    assert outputs["BucketName"] == BUCKET
    assert outputs["FsxFileSystemId"] == outputs["FsxMountName"] == ""

    ec2 = boto3.client("ec2", region_name=REGION)
    subnets = outputs["TrainingSubnetIds"].split(",")
    described = ec2.describe_subnets(SubnetIds=subnets)["Subnets"]
    assert {s["AvailabilityZone"] for s in described} == {f"{REGION}a"}
    assert all(not s["MapPublicIpOnLaunch"] for s in described)
    vpc_id = described[0]["VpcId"]

    sg_id = outputs["TrainingSecurityGroupId"]
    (group,) = ec2.describe_security_groups(GroupIds=[sg_id])["SecurityGroups"]
    assert group["VpcId"] == vpc_id
    self_rules = [
        p
        for p in group["IpPermissions"]
        if p["IpProtocol"] == "-1" and any(g["GroupId"] == sg_id for g in p["UserIdGroupPairs"])
    ]
    assert self_rules, group["IpPermissions"]

    endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])
    services = {e["ServiceName"] for e in endpoints["VpcEndpoints"]}
    wanted = {"s3", "sagemaker.api", "sts", "logs", "ecr.api", "ecr.dkr"}
    assert services == {f"com.amazonaws.{REGION}.{name}" for name in wanted}
    assert not ec2.describe_nat_gateways()["NatGateways"]

    efs = boto3.client("efs", region_name=REGION)
    (file_system,) = efs.describe_file_systems(FileSystemId=outputs["EfsFileSystemId"])[
        "FileSystems"
    ]
    assert file_system["Encrypted"] is True
    targets = efs.describe_mount_targets(FileSystemId=outputs["EfsFileSystemId"])["MountTargets"]
    assert len(targets) == 2

    iam = boto3.client("iam", region_name=REGION)
    training_role = outputs["TrainingRoleArn"].rsplit("/", 1)[1]
    notebook_role = outputs["NotebookRoleArn"].rsplit("/", 1)[1]
    assert iam.get_role(RoleName=training_role)["Role"]["Arn"] == outputs["TrainingRoleArn"]
    policy = iam.get_role_policy(RoleName=notebook_role, PolicyName="notebook")["PolicyDocument"]
    if isinstance(policy, str):  # moto keeps a CloudFormation-made policy as a Python repr
        policy = ast.literal_eval(policy)
    (pass_role,) = [s for s in policy["Statement"] if s.get("Action") == "iam:PassRole"]
    assert pass_role["Resource"] == outputs["TrainingRoleArn"]

    notebook = boto3.client("sagemaker", region_name=REGION).describe_notebook_instance(
        NotebookInstanceName=outputs["NotebookInstanceName"]
    )
    assert notebook["RoleArn"] == outputs["NotebookRoleArn"]


@pytest.mark.usefixtures("aws")
def test_update_keeps_unset_parameters_and_delete_removes_the_stack() -> None:
    cfn = boto3.client("cloudformation", region_name=REGION)
    assert _deploy("--create-nat", "true") == 0
    assert boto3.client("ec2", region_name=REGION).describe_nat_gateways()["NatGateways"]

    assert _deploy("--create-notebook", "false") == 0
    (stack,) = cfn.describe_stacks(StackName=STACK)["Stacks"]
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert parameters["CreateNat"] == "true"  # kept from the first deploy
    assert parameters["CreateNotebook"] == "false"
    assert stack_outputs(cfn, STACK)["NotebookInstanceName"] == ""

    assert (
        deploy_mod.main(["delete", "--stack", STACK, "--region", REGION, "--poll-seconds", "0"])
        == 0
    )
    with pytest.raises(ValueError, match="does not exist"):
        stack_outputs(cfn, STACK)
    # Deleting what is gone is not an error.
    assert deploy_mod.main(["delete", "--stack", STACK, "--region", REGION]) == 0


@pytest.mark.usefixtures("aws")
def test_stack_outputs_reports_a_foreign_stack_in_one_line() -> None:
    cfn = boto3.client("cloudformation", region_name=REGION)
    body = "Resources:\n  Topic:\n    Type: AWS::SNS::Topic\n"
    cfn.create_stack(StackName="other", TemplateBody=body)
    with pytest.raises(StackOutputsError, match=r"has no output TrainingSubnetIds") as info:
        stack_outputs(cfn, "other")
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- rollback (Stubber)

PARENT_ID = f"arn:aws:cloudformation:{REGION}:123456789012:stack/{STACK}/11111111"
CHILD_ID = f"arn:aws:cloudformation:{REGION}:123456789012:stack/{STACK}-NotebookStack-X/2222"
NOTEBOOK_REASON = (
    "Resource handler returned message: \"The subnet's Availability Zone does not "
    'support ml.t3.medium" (HandlerErrorCode: InvalidRequest)'
)


def _event(n: int, stack_id: str, logical: str, kind: str, status: str, **extra: str) -> dict:
    """A stack event `n` seconds into the operation; `extra`: ResourceStatusReason etc."""
    return {
        "StackId": stack_id,
        "EventId": f"{logical}-{n}",
        "StackName": stack_id.split("/")[1],
        "LogicalResourceId": logical,
        "ResourceType": kind,
        "Timestamp": dt.datetime(2025, 1, 1, 12, 0, n, tzinfo=dt.UTC),
        "ResourceStatus": status,
        **extra,
    }


def _parent_events() -> list[dict[str, Any]]:
    nested = "AWS::CloudFormation::Stack"
    parent = {"PhysicalResourceId": PARENT_ID}
    child = {"PhysicalResourceId": CHILD_ID}
    embedded = (
        f"Embedded stack {CHILD_ID} was not successfully created: "
        "The following resource(s) failed to create: [NotebookInstance]."
    )
    events = [
        _event(1, PARENT_ID, STACK, nested, "CREATE_IN_PROGRESS", **parent),
        _event(2, PARENT_ID, "NotebookStack", nested, "CREATE_IN_PROGRESS", **child),
        _event(
            5, PARENT_ID, "NotebookStack", nested, "CREATE_FAILED",
            ResourceStatusReason=embedded, **child,
        ),
        _event(6, PARENT_ID, STACK, nested, "ROLLBACK_IN_PROGRESS", **parent),
        _event(9, PARENT_ID, STACK, nested, "ROLLBACK_COMPLETE", **parent),
    ]  # fmt: skip
    return events[::-1]  # newest first, as CloudFormation returns them


def _child_events() -> list[dict[str, Any]]:
    notebook = "AWS::SageMaker::NotebookInstance"
    events = [
        _event(3, CHILD_ID, "NotebookInstance", notebook, "CREATE_IN_PROGRESS"),
        _event(
            4, CHILD_ID, "NotebookInstance", notebook, "CREATE_FAILED",
            ResourceStatusReason=NOTEBOOK_REASON,
        ),
        _event(
            4, CHILD_ID, "NotebookKeyAlias", "AWS::KMS::Alias", "CREATE_FAILED",
            ResourceStatusReason=deploy_mod.CANCELLED_REASON,
        ),
    ]  # fmt: skip
    return events[::-1]


class _StubbedSession:
    def __init__(self, clients: dict[str, Any]) -> None:
        self._clients = clients

    region_name = REGION

    def __call__(self, region_name: str) -> _StubbedSession:
        assert region_name == REGION
        return self

    def client(self, service: str) -> Any:
        return self._clients[service]


def test_deploy_cli_fails_loudly_on_rollback_with_the_failing_events(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    cfn = boto3.client("cloudformation", region_name=REGION)
    s3 = boto3.client("s3", region_name=REGION)
    ec2 = boto3.client("ec2", region_name=REGION)
    with Stubber(cfn) as cfn_stub, Stubber(s3) as s3_stub, Stubber(ec2) as ec2_stub:
        cfn_stub.add_client_error(
            "describe_stacks",
            service_error_code="ValidationError",
            service_message=f"Stack with id {STACK} does not exist",
            expected_params={"StackName": STACK},
        )
        for _name in TEMPLATES:
            s3_stub.add_response(
                "put_object",
                {},
                {"Bucket": BUCKET, "Key": ANY, "Body": ANY, "ContentType": "application/x-yaml"},
            )
        cfn_stub.add_response("create_stack", {"StackId": PARENT_ID})
        rolled_back = {
            "StackId": PARENT_ID,
            "StackName": STACK,
            "CreationTime": dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
            "StackStatus": "ROLLBACK_COMPLETE",
        }
        cfn_stub.add_response(
            "describe_stacks", {"Stacks": [rolled_back]}, {"StackName": PARENT_ID}
        )
        cfn_stub.add_response(
            "describe_stack_events", {"StackEvents": _parent_events()}, {"StackName": PARENT_ID}
        )
        cfn_stub.add_response(
            "describe_stack_events", {"StackEvents": _child_events()}, {"StackName": CHILD_ID}
        )

        session = _StubbedSession({"cloudformation": cfn, "s3": s3, "ec2": ec2})
        argv = ["deploy", "--stack", STACK, "--region", REGION, "--bucket", BUCKET]
        argv += ["--training-az", f"{REGION}a", "--secondary-az", f"{REGION}b"]
        code = deploy_mod.main([*argv, "--poll-seconds", "0"], session_factory=session)

        cfn_stub.assert_no_pending_responses()
        s3_stub.assert_no_pending_responses()
        ec2_stub.assert_no_pending_responses()

    err = capsys.readouterr().err
    assert code == deploy_mod.EXIT_FAILED
    assert "ROLLBACK_COMPLETE" in err
    lines = err.splitlines()
    root = next(i for i, line in enumerate(lines) if NOTEBOOK_REASON in line)
    nested = next(i for i, line in enumerate(lines) if "Embedded stack" in line)
    assert "CREATE_FAILED" in lines[root] and "NotebookInstance" in lines[root]
    assert root < nested, "the root cause (oldest failure) comes first"
    assert "1 resource(s) cancelled" in err


def test_deploy_refuses_a_stack_left_by_a_failed_create(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    cfn = boto3.client("cloudformation", region_name=REGION)
    with Stubber(cfn) as stub:
        stub.add_response(
            "describe_stacks",
            {
                "Stacks": [
                    {
                        "StackId": PARENT_ID,
                        "StackName": STACK,
                        "CreationTime": dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
                        "StackStatus": "ROLLBACK_COMPLETE",
                    }
                ]
            },
        )
        config = deploy_mod.DeployConfig(stack=STACK, region=REGION, bucket=BUCKET)
        with pytest.raises(deploy_mod.DeployError, match="can only be deleted"):
            deploy_mod.deploy(config, cfn_client=cfn, s3_client=None)


def test_wait_gives_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    cfn = boto3.client("cloudformation", region_name=REGION)
    now = iter([0.0, 30.0, 61.0])
    naps: list[float] = []
    wait = deploy_mod.WaitConfig(
        poll_seconds=5, timeout_seconds=60, sleep=naps.append, clock=lambda: next(now)
    )
    busy = {
        "StackId": PARENT_ID,
        "StackName": STACK,
        "CreationTime": dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
        "StackStatus": "CREATE_IN_PROGRESS",
    }
    with Stubber(cfn) as stub:
        for _poll in range(2):
            stub.add_response("describe_stacks", {"Stacks": [busy]}, {"StackName": PARENT_ID})
            stub.add_response("describe_stack_events", {"StackEvents": _parent_events()[-2:]})
        with pytest.raises(deploy_mod.DeployError, match="still CREATE_IN_PROGRESS after 60 s"):
            deploy_mod.wait_for_stack(cfn, PARENT_ID, None, wait)
    assert naps == [5]


def test_parameters_from_flags() -> None:
    args = deploy_mod._parser().parse_args(
        [
            "deploy",
            "--stack",
            STACK,
            "--region",
            REGION,
            "--bucket",
            BUCKET,
            "--create-fsx",
            "true",
            "--fsx-deployment-type",
            "PERSISTENT_2",
            "--parameter",
            "NotebookVolumeSize=50",
        ]
    )
    assert deploy_mod.parameters_from_args(args) == {
        "CreateFsx": "true",
        "FsxDeploymentType": "PERSISTENT_2",
        "NotebookVolumeSize": "50",
    }
    with pytest.raises(SystemExit):
        deploy_mod._parser().parse_args(
            ["deploy", "--stack", "s", "--region", "r", "--bucket", "b", "--create-nat", "yes"]
        )


def test_cli_without_a_region_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    assert deploy_mod.main(["delete", "--stack", STACK]) == deploy_mod.EXIT_FAILED
    assert "no AWS Region" in capsys.readouterr().err
