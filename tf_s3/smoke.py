"""The image build's check that s3:// works in TensorFlow without a network: run with
S3_ENDPOINT at a closed local port and credentials in the environment."""

from __future__ import annotations

import sys
import time


def main() -> int:
    import tensorflow as tf  # noqa: PLC0415

    import smdistributed.dataparallel.tensorflow as sdp  # noqa: PLC0415
    import smdistributed.dataparallel.tensorflow.keras as sdp_keras  # noqa: PLC0415

    if "tensorflow_io" not in sys.modules:
        print("tf_s3: the import hook did not load tensorflow_io", file=sys.stderr)
        return 1
    started = time.monotonic()
    # Raises UnimplementedError if the scheme were not registered; a refused connection is
    # "not found" to gfile.exists.
    found = tf.io.gfile.exists("s3://sm-horovod-smoke/object")
    print(
        f"tf_s3: s3 scheme registered (exists={found}, {time.monotonic() - started:.1f} s); "
        f"smdistributed API: {len(sdp.__all__)} names, keras {len(sdp_keras.__all__)}"
    )
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
