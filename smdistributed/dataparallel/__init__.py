"""SageMaker's distributed data parallel library, as far as this image provides it: the
TensorFlow API (`smdistributed.dataparallel.tensorflow` and its `.keras`), on Horovod."""
