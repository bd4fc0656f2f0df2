"""The image build's check that s3:// works in TensorFlow, offline: the scheme is registered,
an S3 request reaches a local HTTP server (which answers 404, so gfile says "not found" at once
instead of retrying), and the process still exits 0 after creating an S3 client (the exit
crash tf_s3 works around). Credentials come from the environment."""

from __future__ import annotations

import http.server
import importlib.util
import os
import sys
import tempfile
import threading
import time


def main() -> int:
    with tempfile.TemporaryDirectory() as empty:
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *args: http.server.SimpleHTTPRequestHandler(*args, directory=empty),
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        # Read by the plugin when it creates its client, at the first S3 call.
        os.environ["S3_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
        return _check()


def _check() -> int:
    import tensorflow as tf  # noqa: PLC0415

    import smdistributed.dataparallel.tensorflow as sdp  # noqa: PLC0415
    import smdistributed.dataparallel.tensorflow.keras as sdp_keras  # noqa: PLC0415

    # The hook must leave tf.keras unsettled: the data-parallel API above asked for tf_keras
    # where it is installed (the 2.21 line), and a Keras 2 script gets it only so.
    if importlib.util.find_spec("tf_keras") is not None and not tf.keras.__name__.startswith(
        "tf_keras"
    ):
        print(f"tf_s3: tf.keras is {tf.keras.__name__}, not tf_keras", file=sys.stderr)
        return 1
    schemes = tf.io.gfile.get_registered_schemes()
    if "s3" not in schemes:
        print(f"tf_s3: s3 is not registered (schemes: {schemes})", file=sys.stderr)
        return 1
    started = time.monotonic()
    found = tf.io.gfile.exists("s3://sm-horovod-smoke/object")
    print(
        f"tf_s3: s3 scheme registered, a request answered in {time.monotonic() - started:.1f} s "
        f"(exists={found}); smdistributed API: {len(sdp.__all__)} names, "
        f"keras {len(sdp_keras.__all__)}"
    )
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
