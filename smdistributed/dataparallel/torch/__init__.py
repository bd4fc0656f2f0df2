"""SageMaker's data-parallel library for PyTorch, as far as this image provides it: the `smddp`
torch.distributed backend (`import smdistributed.dataparallel.torch.torch_smddp`), an alias of
NCCL on GPUs and Gloo on CPUs, and the pre-1.4 API (`.distributed`, `.parallel`) mapped onto
torch's own. Importing this package imports no torch: `.launch_env` is its pure part.
docs/torch.md says what differs from AWS's library."""
