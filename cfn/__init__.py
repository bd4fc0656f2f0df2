"""CloudFormation for sm-horovod: templates, `python -m cfn.deploy`, and `cfn.outputs`.

`main.yaml` is the parent stack over four nested stacks (network, IAM, storage, notebook);
`cfn.deploy` uploads the nested templates and creates, updates or deletes the stack;
`cfn.outputs.stack_outputs` gives the launcher the stack's outputs as a plain dict.
"""
