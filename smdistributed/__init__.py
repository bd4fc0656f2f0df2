"""sm-horovod's stand-in for AWS's `smdistributed` namespace: only the data-parallel library's
TensorFlow API (`smdistributed.dataparallel.tensorflow`), mapped onto Horovod. See
docs/aws-tf-scripts.md."""
