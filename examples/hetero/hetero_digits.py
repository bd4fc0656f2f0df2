"""A heterogeneous cluster: a CPU data group serves preprocessed batches to a Horovod group.

One script for every host, as SageMaker runs one entry point everywhere; it branches on the
toolkit's variables:
- a host of the distribution group (SM_CURRENT_INSTANCE_GROUP in
  SM_DISTRIBUTION_INSTANCE_GROUPS) is a Horovod rank: it pulls batches from a data host over
  TCP and trains a small classifier; rank 0 evaluates it and saves it to SM_MODEL_DIR;
- a host of any other group is a data server: it reads the `train` channel (digits.npz, written
  by `python examples/hetero/hetero_digits.py --write-data DIR`), scales and augments the
  images (the CPU work a data group takes off the GPU hosts) and serves batches until SIGTERM.

The entry point stops the data servers when training ends (SIGTERM, with the job's grace), so
the script needs none of the hand-made shutdown AWS's tf.data-service sample wires over a port
of its own; a data server failing fails the job.

Protocol (one TCP connection per rank, requests in turn): the client sends `NEXT <size>\\n` or
`TEST\\n`; the server answers with an 8-byte big-endian length and a NumPy .npz archive holding
`x` (float32, N x 64) and `y` (int64, N); no pickles cross the wire.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger("hetero_digits")

DATA_FILE = "digits.npz"
DEFAULT_PORT = 16000
# The held-out share of the digits, served undistorted for rank 0's evaluation.
TEST_SHARE = 0.2
# load_digits' pixel values run from 0 to 16.
MAX_LEVEL = 16.0
_LENGTH = struct.Struct(">Q")


# --------------------------------------------------------------------------------------------
# Roles, from the toolkit's variables


def is_training_host(env: Mapping[str, str]) -> bool:
    """A host of the distribution group trains; every other host serves data."""
    group = env.get("SM_CURRENT_INSTANCE_GROUP", "")
    return group in json.loads(env.get("SM_DISTRIBUTION_INSTANCE_GROUPS", "[]"))


def data_hosts(env: Mapping[str, str]) -> list[str]:
    """The hosts of every group that is not distributed, in file order."""
    distributed = json.loads(env.get("SM_DISTRIBUTION_INSTANCE_GROUPS", "[]"))
    groups = json.loads(env.get("SM_INSTANCE_GROUPS_DICT", "{}"))
    return [
        host for name, group in groups.items() if name not in distributed for host in group["hosts"]
    ]


# --------------------------------------------------------------------------------------------
# The wire


def encode_batch(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x.astype(np.float32), y=y.astype(np.int64))
    payload = buffer.getvalue()
    return _LENGTH.pack(len(payload)) + payload


def _read_exactly(stream: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = stream.recv(count - len(chunks))
        if not chunk:
            raise ConnectionError("the data server closed the connection")
        chunks += chunk
    return bytes(chunks)


def decode_batch(stream: socket.socket) -> tuple[np.ndarray, np.ndarray]:
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    with np.load(io.BytesIO(_read_exactly(stream, length)), allow_pickle=False) as archive:
        return archive["x"], archive["y"]


# --------------------------------------------------------------------------------------------
# Data host


class Digits:
    """The channel's digits, split once (seeded) into a training and a held-out part."""

    def __init__(self, path: Path, seed: int = 0) -> None:
        with np.load(path, allow_pickle=False) as archive:
            images = archive["x"].reshape(len(archive["x"]), -1).astype(np.float32) / MAX_LEVEL
            labels = archive["y"].astype(np.int64)
        order = np.random.default_rng(seed).permutation(len(labels))
        cut = int(len(labels) * (1 - TEST_SHARE))
        self.train_x, self.train_y = images[order[:cut]], labels[order[:cut]]
        self.test_x, self.test_y = images[order[cut:]], labels[order[cut:]]

    def batch(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """A random batch with the preprocessing done here: pixel noise as augmentation."""
        index = rng.integers(0, len(self.train_y), size)
        noise = rng.normal(0.0, 0.05, (size, self.train_x.shape[1])).astype(np.float32)
        return np.clip(self.train_x[index] + noise, 0.0, 1.0), self.train_y[index]


class _Handler(socketserver.StreamRequestHandler):
    server: BatchServer

    def handle(self) -> None:
        rng = np.random.default_rng()
        for line in self.rfile:
            words = line.decode("ascii", "replace").split()
            if words[:1] == ["NEXT"] and len(words) == 2 and words[1].isdigit():
                x, y = self.server.digits.batch(rng, min(int(words[1]), 4096))
                self.server.count_batch()
            elif words == ["TEST"]:
                x, y = self.server.digits.test_x, self.server.digits.test_y
            else:
                log.warning("bad request %r from %s", line[:40], self.client_address[0])
                return
            self.wfile.write(encode_batch(x, y))


class BatchServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], digits: Digits) -> None:
        super().__init__(address, _Handler)
        self.digits = digits
        self.batches = 0
        self._lock = threading.Lock()

    def count_batch(self) -> None:
        with self._lock:
            self.batches += 1


def serve(data_dir: Path, port: int, host: str, group: str) -> int:
    """Serve batches until SIGTERM (the entry point's stop when training ends): exit 0."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Every interface: the training group reaches this host over the cluster network.
    server = BatchServer(("0.0.0.0", port), Digits(data_dir / DATA_FILE))  # noqa: S104
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    log.info("data host %s (group %s) serving batches on port %d", host, group, port)
    stop.wait()
    server.shutdown()
    server.server_close()
    log.info("data host %s stopped by SIGTERM after serving %d batches", host, server.batches)
    return 0


# --------------------------------------------------------------------------------------------
# Training host


def connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """The data server may start after us: retry until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=30)
        except OSError as error:
            if time.monotonic() > deadline:
                raise ConnectionError(f"no data server on {host}:{port}: {error}") from None
            time.sleep(0.5)


def fetch(stream: socket.socket, request: str) -> tuple[np.ndarray, np.ndarray]:
    stream.sendall(request.encode("ascii") + b"\n")
    return decode_batch(stream)


def batches(stream: socket.socket, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    while True:
        yield fetch(stream, f"NEXT {size}")


def train(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import horovod.tensorflow.keras as hvd  # noqa: PLC0415  (only the training hosts need TF)
    import tensorflow as tf  # noqa: PLC0415

    hvd.init()
    host, group = env.get("SM_CURRENT_HOST", socket.gethostname()), env["SM_CURRENT_INSTANCE_GROUP"]
    servers = data_hosts(env)
    if not servers:
        raise SystemExit("no data group: this example needs a group that is not distributed")
    server = servers[hvd.rank() % len(servers)]
    log.info(
        "rank %d of %d on %s (group %s) takes batches from %s",
        hvd.rank(), hvd.size(), host, group, server,
    )  # fmt: skip
    stream = connect(server, args.data_port, args.connect_timeout)
    tf.keras.utils.set_random_seed(args.seed)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.learning_rate * hvd.size()))
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    data = tf.data.Dataset.from_generator(
        lambda: batches(stream, args.batch_size),
        output_signature=(
            tf.TensorSpec((None, 64), tf.float32),
            tf.TensorSpec((None,), tf.int64),
        ),
    )
    model.fit(
        data,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
        verbose=2 if hvd.rank() == 0 else 0,
    )
    if hvd.rank() == 0:
        test_x, test_y = fetch(stream, "TEST")
        _, accuracy = model.evaluate(test_x, test_y, verbose=0)
        log.info("test accuracy %.3f on %d held-out digits", accuracy, len(test_y))
        model_dir = Path(env.get("SM_MODEL_DIR", "/opt/ml/model"))
        model.save(model_dir / "model.keras")
    stream.close()
    return 0


# --------------------------------------------------------------------------------------------


def write_data(out_dir: Path) -> Path:
    """The `train` channel's file, from scikit-learn's digits (installed where you run this)."""
    from sklearn.datasets import load_digits  # noqa: PLC0415

    digits = load_digits()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / DATA_FILE
    np.savez(path, x=digits.images.astype(np.float32), y=digits.target.astype(np.int64))
    return path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", "--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch_size", "--batch-size", type=int, default=32)
    parser.add_argument("--learning_rate", "--learning-rate", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data_port", "--data-port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--connect_timeout", "--connect-timeout", type=float, default=120.0,
        help="seconds a rank waits for its data server",
    )  # fmt: skip
    parser.add_argument("--write-data", type=Path, metavar="DIR", help="write digits.npz, exit")
    # SageMaker's TensorFlow estimator adds --model_dir: the model goes to SM_MODEL_DIR.
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    host = env.get("SM_CURRENT_HOST", socket.gethostname())
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s host={host} hetero_digits: %(message)s",
        stream=sys.stdout,
    )
    if args.write_data is not None:
        print(write_data(args.write_data))
        return 0
    if is_training_host(env):
        return train(args, env)
    data_dir = Path(env.get("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    return serve(data_dir, args.data_port, host, env.get("SM_CURRENT_INSTANCE_GROUP", "?"))


if __name__ == "__main__":
    sys.exit(main())
