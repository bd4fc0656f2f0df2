"""Helpers for serve's docker tests and its benchmark: a trained digits model, a serving
container started as SageMaker starts it, and a plain HTTP client.

SageMaker runs `docker run IMAGE serve` with the model unpacked at /opt/ml/model; so do we
(read-only), and talk to the container's own address on the Docker bridge, never a host port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import secrets
import subprocess
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cluster import docker_command
from harness.digits import one_host_digits_cluster

if TYPE_CHECKING:
    import websocket

SERVE_PORT = 8080
# Enough for the digits at 32x32 (test accuracy ~0.97 on one host, ~40 s on 2 cores).
SERVE_TEST_EPOCHS = "4"
TRAIN_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    model_dir: Path
    test_accuracy: float
    classes: tuple[str, ...]


def train_digits_model(
    docker: str, image: str, root: Path, channels: Mapping[str, Path], epochs: str
) -> TrainedModel:
    """Train the built-in model on the digits in one container, as SageMaker would."""
    cluster = one_host_digits_cluster(
        docker=docker, image=image, root=root, channels=channels, epochs=epochs
    )
    try:
        cluster.start()
        code = cluster.wait(TRAIN_TIMEOUT_S)["algo-1"]
        if code != 0:
            raise RuntimeError(f"training failed ({code}): {cluster.describe()}")
    finally:
        cluster.remove()
    return trained_model(cluster.ml_root("algo-1") / "model")


def trained_model(model_dir: Path) -> TrainedModel:
    """A built-in model a job wrote to `model_dir` (its /opt/ml/model)."""
    metrics = json.loads((model_dir / "metrics.json").read_text())
    classes = tuple(json.loads((model_dir / "classes.json").read_text()))
    return TrainedModel(model_dir, float(metrics["test"]["accuracy"]), classes)


def model_tarball(model_dir: Path, path: Path) -> Path:
    """model.tar.gz as SageMaker's training writes it: the model folder's content at its root."""
    with tarfile.open(path, "w:gz") as tar:
        for entry in sorted(model_dir.iterdir()):
            tar.add(entry, arcname=entry.name)
    return path


@dataclasses.dataclass
class ServeContainer:
    """`docker run IMAGE serve` (or another command) with the model mounted read-only."""

    docker: str
    image: str
    model_dir: Path
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ("serve",)
    port: int = SERVE_PORT
    extra_mounts: tuple[tuple[Path, str], ...] = ()
    cpus: str | None = None
    name: str = dataclasses.field(default_factory=lambda: f"smserve-{secrets.token_hex(3)}")
    address: str = ""
    started_at: float = 0.0

    def start(self) -> ServeContainer:
        args = ["run", "--detach", "--name", self.name,
                "--volume", f"{self.model_dir}:/opt/ml/model:ro"]  # fmt: skip
        for source, target in self.extra_mounts:
            args += ["--volume", f"{source}:{target}:ro"]
        for key, value in self.env.items():
            args += ["--env", f"{key}={value}"]
        if self.cpus is not None:
            args += ["--cpus", self.cpus]
        self.started_at = time.monotonic()
        docker_command(self.docker, *args, self.image, *self.command)
        self.address = docker_command(
            self.docker, "inspect", "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", self.name,
        ).stdout.strip()  # fmt: skip
        return self

    def client(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.address, self.port, timeout=timeout)

    def ping(self) -> int | None:
        """/ping's status, or None while nothing listens."""
        connection = self.client(timeout=2)
        try:
            connection.request("GET", "/ping")
            return connection.getresponse().status
        except OSError:
            return None
        finally:
            connection.close()

    def wait_ready(self, timeout: float = 120.0) -> list[int | None]:
        """Poll /ping every 50 ms until 200; returns every answer seen (None: refused)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.ping()
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            if not self.running():
                raise RuntimeError(f"{self.name} exited: {self.logs()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout} s: {self.logs()[-3000:]}")

    def running(self) -> bool:
        result = docker_command(
            self.docker, "inspect", "--format", "{{.State.Running}}", self.name, check=False
        )
        return result.stdout.strip() == "true"

    def exit_code(self) -> int:
        result = docker_command(
            self.docker, "inspect", "--format", "{{.State.ExitCode}}", self.name
        )
        return int(result.stdout.strip())

    def logs(self) -> str:
        result = docker_command(self.docker, "logs", self.name, check=False)
        return result.stdout + result.stderr

    def failed_start(self, timeout: float) -> tuple[int, list[str]]:
        """For a server that must refuse to start: its exit code and its ERROR log lines."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        errors = [line for line in self.logs().splitlines() if " ERROR " in line]
        return self.exit_code(), errors

    def stop(self, timeout_s: int = 30) -> None:
        """`docker stop`: SIGTERM, then SIGKILL after timeout_s (SageMaker waits 30 s)."""
        subprocess.run(
            [self.docker, "stop", "--time", str(timeout_s), self.name],
            capture_output=True,
            check=False,
            timeout=timeout_s + 30,
        )

    def remove(self) -> None:
        subprocess.run([self.docker, "rm", "-f", self.name], capture_output=True, check=False)


def post(
    server: ServeContainer,
    body: bytes,
    content_type: str | None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    *,
    path: str = "/invocations",
) -> tuple[int, dict[str, str], bytes]:
    """One POST (to /invocations by default) on a fresh connection: (status, headers, body)."""
    sent = dict(headers or {})
    if content_type is not None:
        sent["Content-Type"] = content_type
    return call(server, "POST", path, body, sent, timeout=timeout)


def call(
    server: ServeContainer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 60.0,
) -> tuple[int, dict[str, str], bytes]:
    """Any request on a fresh connection: (status, headers, body)."""
    connection = server.client(timeout)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


# --- SavedModels that are not the built-in model (for serve's generic tests and the bench) ---

# Run with the image's Python: `python - OUT` writes OUT/<name>/<version>/ SavedModels and
# OUT/expected.json, what each model returns when called directly (no server in between).
MAKE_MODELS = r"""
import json, sys
import numpy as np
import tensorflow as tf

out = sys.argv[1]
wanted = sys.argv[2].split(",")
tf.keras.utils.set_random_seed(0)
expected = {}
probe = np.linspace(-1, 1, 16, dtype="float32").reshape(2, 8)

if "mlp" in wanted:
    # A small Keras MLP on 8 float features, two versions with different weights.
    for version in (1, 2):
        inputs = tf.keras.Input((8,), name="features")
        hidden = tf.keras.layers.Dense(32, activation="relu")(inputs)
        outputs = tf.keras.layers.Dense(3, activation="softmax")(hidden)
        mlp = tf.keras.Model(inputs, outputs)
        mlp.save(f"{out}/mlp/{version}")
        expected[f"mlp/{version}"] = mlp(probe).numpy().tolist()

if "multi" in wanted:
    class Multi(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32),
                                      tf.TensorSpec([None], tf.int64)])
        def serve(self, a, b):
            return {"sum": tf.reduce_sum(a, 1) + tf.cast(b, tf.float32), "double": a * 2}
    multi = Multi()
    tf.saved_model.save(multi, f"{out}/multi/1", signatures={"serving_default": multi.serve})

if "text" in wanted:
    class Text(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            return {"length": tf.strings.length(text), "upper_bytes": tf.strings.upper(text)}
    text = Text()
    tf.saved_model.save(text, f"{out}/text/1", signatures={"serving_default": text.serve})

if "classifier" in wanted:
    # The built-in model's contract (uint8 images in, probabilities out, classes.json).
    class Bright(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
        def serve(self, images):
            light = tf.reduce_mean(tf.cast(images, tf.float32), axis=[1, 2, 3]) / 255.0
            return {"probabilities": tf.stack([1 - light, light], axis=1)}
    bright = Bright()
    tf.saved_model.save(bright, f"{out}/classifier/1", signatures={"serving_default": bright.serve})
    with open(f"{out}/classifier/classes.json", "w") as f:
        json.dump(["dark", "light"], f)

if "half" in wanted:
    # TF Serving's own test model, half_plus_three, as a TF1 SavedModel whose signatures
    # predict, regress and classify (tf.Example in).
    with tf.compat.v1.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        y = x * 0.5 + 3.0
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="tf_example")
        parsed = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})
        ex_y = parsed["x"] * 0.5 + 3.0
        score = tf.sigmoid(parsed["x"])
        scores = tf.concat([1 - score, score], axis=1)
        classes = tf.tile(tf.constant([["lo", "hi"]]), [tf.shape(serialized)[0], 1])
        sig = tf.compat.v1.saved_model
        with tf.compat.v1.Session() as session:
            builder = sig.Builder(f"{out}/half/1")
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sig.predict_signature_def({"x": x}, {"y": y}),
                "regress_x_to_y": sig.regression_signature_def(serialized, ex_y),
                "classify_x": sig.classification_signature_def(serialized, classes, scores),
            })
            builder.save()

def save(module, name, **signatures):
    tf.saved_model.save(module, f"{out}/{name}/1", signatures=signatures)

def two_inputs(keras, path):
    # Two named inputs saved as one .keras file (what model.save("/opt/ml/model/x.keras")
    # writes), and what model.predict answers for 64 rows of them.
    alpha = keras.Input((3,), name="alpha")
    beta = keras.Input((2,), name="beta")
    hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([alpha, beta]))
    model = keras.Model([alpha, beta], keras.layers.Dense(2, name="scores")(hidden))
    model.save(path)
    rng = np.random.default_rng(1)
    rows = {"alpha": rng.normal(size=(64, 3)).astype("float32"),
            "beta": rng.normal(size=(64, 2)).astype("float32")}
    predicted = model.predict([rows["alpha"], rows["beta"]], verbose=0)
    return {"inputs": {k: v.tolist() for k, v in rows.items()}, "outputs": predicted.tolist()}

if "keras" in wanted:
    # tf.keras's .keras file: Keras 2 on the TF 2.14 line, Keras 3 on the 2.21 line.
    expected["pair"] = two_inputs(tf.keras, f"{out}/pair.keras")

if "tf_keras" in wanted:
    # Keras 2 on TF 2.16+ (TF_USE_LEGACY_KERAS's Keras), in a version folder: "legacy" v2.
    import os, tf_keras
    os.makedirs(f"{out}/legacy/2")
    expected["legacy"] = two_inputs(tf_keras, f"{out}/legacy/2/model.keras")

if "keras_custom" in wanted:
    # A layer of the user's own, registered where it was saved and nowhere in serve.
    @tf.keras.utils.register_keras_serializable(package="user")
    class Scale(tf.keras.layers.Layer):
        def call(self, x):
            return x * 2
    features = tf.keras.Input((2,), name="x")
    tf.keras.Model(features, Scale()(features)).save(f"{out}/custom.keras")

if "fixed" in wanted:
    # A fixed batch dimension, as many exports have (Input(batch_size=1), converted models).
    class Fixed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 3}
    fixed = Fixed()
    save(fixed, "fixed", serving_default=fixed.serve)

if "center" in wanted:
    # An output that depends on the whole batch: what merging requests would change.
    class Center(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x - tf.reduce_mean(x, axis=0, keepdims=True)}
    center = Center()
    save(center, "center", serving_default=center.serve)

if "table" in wanted:
    # A lookup table initialized from a vocabulary asset (the init op, assets/).
    import os, tempfile
    vocab = os.path.join(tempfile.mkdtemp(), "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(f"w{i}" for i in range(100)) + "\n")
    class Table(tf.Module):
        def __init__(self):
            initializer = tf.lookup.TextFileInitializer(
                vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
            self.table = tf.lookup.StaticHashTable(initializer, -1)
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="word")])
        def serve(self, word):
            return {"id": self.table.lookup(word)}
    table = Table()
    save(table, "table", serving_default=table.serve)
    os.remove(vocab)  # served from the SavedModel's own assets/

if "signatures" in wanted:
    # A tf.Module with a variable and two signatures (signature_name picks one).
    class Two(tf.Module):
        def __init__(self):
            self.scale = tf.Variable(2.0)
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def double(self, x):
            return {"y": x * self.scale}
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def plus(self, x):
            return {"y": x + self.scale}
    two = Two()
    save(two, "signatures", serving_default=two.double, plus=two.plus)

if "ints" in wanted:
    class Ints(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="n")])
        def serve(self, n):
            return {"square": n * n + 1}
    ints = Ints()
    save(ints, "ints", serving_default=ints.serve)

if "slow" in wanted:
    # A call that takes max(x) seconds (a busy loop on tf.timestamp): x = 2.0 takes 2 s.
    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            seconds = tf.cast(tf.reduce_max(x), tf.float64)
            start = tf.timestamp()
            [waited] = tf.while_loop(
                lambda t: t - start < seconds, lambda t: [tf.timestamp()], [start])
            return {"y": x + tf.cast(0.0 * waited, tf.float32)}
    slow = Slow()
    save(slow, "slow", serving_default=slow.serve)

if "hang" in wanted:
    # A TF1 graph that waits forever on an empty queue when max(x) > 100 (a model blocked on
    # a resource); any other x: 2x. Only the session's deadline ends that wait.
    with tf.compat.v1.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        queue = tf.queue.FIFOQueue(1, tf.float32, shapes=[[]])
        extra = tf.cond(tf.reduce_max(x) > 100, queue.dequeue, lambda: tf.constant(0.0))
        y = x * 2 + extra
        sig = tf.compat.v1.saved_model
        with tf.compat.v1.Session() as session:
            builder = sig.Builder(f"{out}/hang/1")
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sig.predict_signature_def({"x": x}, {"y": y})})
            builder.save()

if "uninit" in wanted:
    # A TF1 graph whose lookup table nothing initializes (no init op saved): every call fails
    # with FailedPrecondition, a model that cannot answer at all.
    with tf.compat.v1.Graph().as_default():
        word = tf.compat.v1.placeholder(tf.string, [None], name="word")
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], [1, 2], tf.string, tf.int64), -1)
        ids = table.lookup(word)
        sig = tf.compat.v1.saved_model
        with tf.compat.v1.Session() as session:
            builder = sig.Builder(f"{out}/uninit/1")
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sig.predict_signature_def({"word": word}, {"id": ids})},
                main_op=tf.no_op())
            builder.save()

if "tftext" in wanted:
    # TF Text's CaseFoldUTF8 op: loads only where tensorflow_text registered it.
    import tensorflow_text
    class Fold(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            return {"folded": tensorflow_text.case_fold_utf8(text)}
    fold = Fold()
    save(fold, "tftext", serving_default=fold.serve)

with open(f"{out}/expected.json", "w") as f:
    json.dump({"probe": probe.tolist(), **expected}, f)
"""


def make_models(docker: str, image: str, out: Path, names: str) -> dict:
    """Write the named SavedModels (mlp, multi, text, classifier, half, fixed, center, table,
    signatures, ints, slow, hang, tftext) and .keras files (keras, tf_keras, keras_custom) into
    `out` with the image's TensorFlow; returns expected.json."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [docker, "run", "--rm", "-i", "--volume", f"{out}:/out", "--entrypoint", "python",
         image, "-", "/out", names],
        input=MAKE_MODELS, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return json.loads((out / "expected.json").read_text())


# Calls a SavedModel's serving_default directly: `python - MODEL_DIR JSON_INPUT` prints its
# outputs as JSON (what serve must answer, without serve).
CALL_DIRECTLY = r"""
import json, sys
import tensorflow as tf
function = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
[(name, spec)] = function.structured_input_signature[1].items()
outputs = function(**{name: tf.constant(json.loads(sys.argv[2]), spec.dtype)})
print(json.dumps({k: v.numpy().tolist() for k, v in outputs.items()}))
"""


def call_directly(docker: str, image: str, model_dir: Path, inputs: object) -> dict:
    result = subprocess.run(
        [docker, "run", "--rm", "-i", "--volume", f"{model_dir}:/model:ro", "--entrypoint",
         "python", image, "-", "/model", json.dumps(inputs)],
        input=CALL_DIRECTLY, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- a real browser on the page at GET / (Debian's chromium, driven over DevTools) -----------


class Browser:
    """Headless chromium with its DevTools protocol on the loopback: navigate, pick a file in
    an <input type=file> (what a user's click does, change event included), read the DOM."""

    def __init__(self, chromium: str, profile: Path, timeout: float = 60.0) -> None:
        import socket  # noqa: PLC0415

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.timeout = timeout
        self.process = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={profile}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._next_id = 0
        self.socket = self._connect()

    def _connect(self) -> websocket.WebSocket:
        import websocket  # noqa: PLC0415  (a test dependency: requirements-dev.txt)

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/json/list")
                targets = json.loads(connection.getresponse().read())
                page = next(t for t in targets if t.get("type") == "page")
                return websocket.create_connection(
                    page["webSocketDebuggerUrl"], timeout=self.timeout, suppress_origin=True
                )
            except (OSError, StopIteration, ValueError, http.client.HTTPException):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.2)

    def send(self, method: str, **params: object) -> dict:
        self._next_id += 1
        self.socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> object:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str) -> object:
        """Poll a JavaScript expression until it is truthy."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"never true in the page: {expression}")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def pick_file(self, selector: str, path: Path) -> None:
        root = self.send("DOM.getDocument")["root"]["nodeId"]
        node = self.send("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.send("DOM.setFileInputFiles", files=[str(path)], nodeId=node)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
