"""Training on one rank: Keras, distributed the way Horovod's own Keras examples do it (every
Horovod call is in model/collective.py; model/strategy.py provides the same functions under
tf.distribute's MultiWorkerMirroredStrategy, and model/backend.py picks one).

Every rank runs this. Each collective (gradient allreduce, metric averaging, the stop vote)
must be reached by every rank in the same order, so every decision that ends or changes the
loop is taken from values all ranks share: the sorted file listing, and allreduced numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from model.backend import collective
from model.checkpoints import (
    WEIGHTS_PREFIX,
    latest_checkpoint,
    read_state,
    save_checkpoint,
)
from model.export import export_model
from model.hparams import Hyperparameters
from model.images import (
    EXAMPLES_IN_MESSAGE,
    DataError,
    available_memory_bytes,
    cache_fits,
    check_unreadable,
    list_channel,
    missing_channel_message,
    shard,
    steps_per_epoch,
)
from model.logline import format_epoch_line
from model.networks import build_classifier
from model.paths import TrainingPaths
from model.pipeline import (
    FolderReader,
    Reader,
    RecordReader,
    decoded_images,
    evaluation_batches,
    training_batches,
)
from model.records import open_record_channel
from model.schedule import LearningRateSchedule
from model.sources import (
    DecodeTally,
    Distribution,
    Layout,
    classify_distribution,
    detect_layout,
    listing_digest,
    record_share,
    share_group,
)
from model.stopping import STOPPED_EXIT_CODE, StopRequest
from smcommon import heartbeat

log = logging.getLogger(__name__)

# Decoded images per batch when filling the cache before training.
_WARM_BATCH = 256


class CheckpointMismatchError(Exception):
    """The checkpoint dir holds a checkpoint of another model, image size or class list."""


@dataclasses.dataclass(frozen=True)
class Channel:
    """One channel as this rank sees it."""

    name: str
    layout: Layout
    distribution: Distribution
    reader: Reader  # this rank's share
    tally: DecodeTally  # which of the share's items decoded
    decoded: tf.data.Dataset  # (image, label, item), one pass
    cached: bool


@dataclasses.dataclass(frozen=True)
class _Found:
    """A channel as this host lists it, before the ranks agree on who reads what."""

    name: str
    layout: Layout
    class_names: tuple[str, ...]
    digest: str
    make_reader: Any  # (group rank, group size, train classes) -> Reader


def _pin_devices() -> None:
    if not collective.PINS_DEVICES:
        return
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        # One GPU per rank; more ranks than GPUs share them round-robin rather than fail.
        tf.config.set_visible_devices(gpus[collective.local_rank() % len(gpus)], "GPU")
    else:
        # On CPUs, N ranks on a host with N x T threads each would thrash.
        cores = len(os.sched_getaffinity(0))
        threads = max(1, cores // collective.local_size())
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))


def _abbreviate(names: tuple[str, ...], limit: int = 12) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[: limit - 2])}, ..., {names[-1]}"


def _find_channel(
    name: str, root: Path | None, params: Hyperparameters, train_classes: tuple[str, ...] | None
) -> _Found:
    """List a channel on this host: class folders, or record shards' headers."""
    if root is None or not root.is_dir():
        raise DataError(missing_channel_message(name, root))
    layout = detect_layout(root, params.data_format)
    seed = params.seed + collective.rank()
    if layout is Layout.FOLDERS:
        listing = list_channel(name, root, train_classes)
        relative = [os.path.relpath(path, root) for path in listing.files]

        def folders(group_rank: int, group_size: int, classes: tuple[str, ...]) -> Reader:
            # Labels index the classes every host agreed on, not only those seen here.
            agreed = listing
            if classes != listing.class_names:
                agreed = list_channel(name, root, classes)
            return FolderReader(shard(agreed, group_rank, group_size), params.image_size, seed)

        return _Found(name, layout, listing.class_names, listing_digest(relative), folders)
    records = open_record_channel(name, root)

    def shards(group_rank: int, group_size: int, classes: tuple[str, ...]) -> Reader:
        strangers = [label for label in records.class_names if label not in classes]
        if strangers:
            raise DataError(
                f"the {name} channel's records have classes the train channel lacks: "
                f"{', '.join(strangers[:EXAMPLES_IN_MESSAGE])}"
            )
        label_map = [classes.index(label) for label in records.class_names]
        share = record_share(records.shards, group_rank, group_size)
        # Headers every rank of the group reads: counted by the group's first rank only.
        headers = records.unreadable_headers if group_rank == 0 else ()
        return RecordReader(
            share,
            label_map,
            params.image_size,
            seed,
            unreadable_headers=headers,
            decoders=records.decoders,
        )

    digest = listing_digest(os.path.basename(shard.path) for shard in records.shards)
    return _Found(name, layout, records.class_names, digest, shards)


def _agree(found: _Found, host: str) -> tuple[Distribution, tuple[str, ...]]:
    """How the hosts' copies of a channel relate, and the class names of all of them."""
    seen = collective.gather((found.digest, host, found.class_names), name=f"listing_{found.name}")
    try:
        distribution = classify_distribution([d for d, _, _ in seen], [h for _, h, _ in seen])
    except ValueError as error:
        raise DataError(f"the {found.name} channel: {error}") from None
    classes = tuple(sorted({label for _, _, names in seen for label in names}))
    if found.layout is Layout.RECORDS:
        # Every shard header carries the whole class list, in the packer's order.
        orders = {names for _, _, names in seen}
        if len(orders) > 1:
            raise DataError(f"the {found.name} channel's hosts see shards of different packings")
        classes = found.class_names
    return distribution, classes


def _open_channels(
    params: Hyperparameters, paths: TrainingPaths, rank: int, ranks: int, host: str
) -> tuple[dict[str, Channel], tuple[str, ...]]:
    """Every channel's reader for this rank, and the class names (the train channel's)."""
    train_found = _find_channel("train", paths.train, params, None)
    distribution, class_names = _agree(train_found, host)
    found = {"train": (train_found, distribution)}
    for name in ("validation", "test"):
        root = paths.channel(name)
        if root is not None:
            other = _find_channel(name, root, params, class_names)
            found[name] = (other, _agree(other, host)[0])
    readers: dict[str, Reader] = {}
    for name, (item, spread) in found.items():
        group_rank, group_size = share_group(
            spread, rank, ranks, collective.local_rank(), collective.local_size()
        )
        readers[name] = item.make_reader(group_rank, group_size, class_names)
    if collective.min_across_ranks(readers["train"].expected, name="train_share_min") == 0:
        raise DataError(
            "a training process has nothing to read in the train channel: give it at least "
            "as many images (or, with ShardedByS3Key, record shards) as training processes"
        )
    local_images = sum(reader.expected for reader in readers.values())
    fits = cache_fits(
        local_images, params.image_size, available_memory_bytes(), collective.local_size()
    )
    # Hosts may differ in free memory; caching changes which collectives run when, so either
    # every rank caches or none does.
    cached = not collective.any_rank(not fits, name="cache_vote")
    totals = collective.sum_across_ranks(
        [float(reader.expected) for reader in readers.values()], name="channel_sizes"
    )
    if rank == 0:
        counted = zip(readers, totals, strict=True)
        sizes = ", ".join(f"{name}={int(total)}" for name, total in counted)
        log.info(
            "images: %s; %d classes: %s; train channel: %s, %s; decoded images %s",
            sizes,
            len(class_names),
            _abbreviate(class_names),
            train_found.layout.value,
            distribution.value,
            "cached in memory" if cached else "decoded every epoch (too big to cache)",
        )
    channels: dict[str, Channel] = {}
    for name, reader in readers.items():
        item, spread = found[name]
        channels[name] = Channel(
            name=name,
            layout=item.layout,
            distribution=spread,
            reader=reader,
            tally=reader.tally(),
            decoded=decoded_images(reader, cache=cached),
            cached=cached,
        )
    return channels, class_names


def _check_channel(name: str, channel: Channel, max_fraction: float) -> None:
    """Fail on every rank alike if too many of the channel's images are unreadable."""
    bad, total = collective.sum_across_ranks(
        [len(channel.tally), channel.tally.total], name=f"unreadable_{name}"
    )
    if total and bad / total > max_fraction:
        # Only now, when every rank knows the job fails, gather examples from all of them.
        examples = collective.gather(
            channel.tally.examples(EXAMPLES_IN_MESSAGE), name=f"unreadable_examples_{name}"
        )
        flat = [example for rank_examples in examples for example in rank_examples]
        check_unreadable(name, int(bad), int(total), max_fraction, flat)


def _fill_caches(channels: Mapping[str, Channel], max_fraction: float, stop: StopRequest) -> None:
    """Decode every cached channel once before training, so unreadable images are counted
    (and too many of them fail the job) before the first step, not after the last."""
    for name, channel in channels.items():
        if not channel.cached:
            continue
        started = time.monotonic()
        for _, _, items in channel.decoded.batch(_WARM_BATCH):
            channel.tally.record(items.numpy())
            if stop.requested:
                # Stop soon; the partly filled cache is dropped and nothing is counted.
                break
        else:
            channel.tally.finish_pass()
        log.debug("decoded %s in %.1fs", name, time.monotonic() - started)
        _check_channel(name, channel, max_fraction)


class _Evaluator:
    """Loss and accuracy over a whole channel: each rank sums over its shard, then the sums
    are added up across ranks, so the result is exact whatever the shard sizes (averaging
    per-rank means would not be)."""

    def __init__(self, model: tf.keras.Model, batch_size: int) -> None:
        self._model = model
        self._batch_size = batch_size

    @tf.function(reduce_retracing=True)
    def _batch_sums(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        # On this rank alone: under a strategy, reading BatchNormalization's statistics outside
        # a replica would be an all-reduce, and shards differ in their number of batches.
        return collective.run_locally(self._local_sums, images, labels)

    def _local_sums(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        probabilities = self._model(images, training=False)
        losses = tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        predicted = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predicted, tf.cast(labels, tf.int32)), tf.float64)
        return tf.stack(
            [
                tf.reduce_sum(tf.cast(losses, tf.float64)),
                tf.reduce_sum(correct),
                tf.cast(tf.size(labels), tf.float64),
            ]
        )

    def __call__(self, channel: Channel, name: str) -> dict[str, float]:
        sums = np.zeros(3)
        for images, labels, items in evaluation_batches(channel.decoded, self._batch_size):
            sums += self._batch_sums(images, labels).numpy()
            channel.tally.record(items.numpy())
        channel.tally.finish_pass()
        loss_sum, correct, count = collective.sum_across_ranks(list(sums), name=f"evaluate_{name}")
        if count == 0:
            return {"loss": math.nan, "accuracy": math.nan, "images": 0}
        return {"loss": loss_sum / count, "accuracy": correct / count, "images": int(count)}


class _LearningRateCallback(tf.keras.callbacks.Callback):
    """Sets the rate before every batch from the (pure) schedule, at a fractional epoch."""

    def __init__(
        self, schedule: LearningRateSchedule, steps: int, optimizer: tf.keras.optimizers.Optimizer
    ) -> None:
        super().__init__()
        self._schedule = schedule
        self._steps = steps
        self._optimizer = optimizer
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        rate = self._schedule.rate_at(self._epoch + batch / self._steps)
        self._optimizer.learning_rate.assign(rate)


class _HeartbeatCallback(tf.keras.callbacks.Callback):
    """A heartbeat per batch (smcommon/heartbeat.py): the entry point's stall rule then counts a
    rank in a long silent epoch as progressing even while its main thread waits on TensorFlow's
    threads."""

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        heartbeat.beat()


class _AgreedStopCallback(tf.keras.callbacks.Callback):
    """After every batch, all ranks vote (allreduce max of a flag) on stopping, so that they
    all stop after the same step even if SIGTERM reached only some hosts. A scalar allreduce
    per step is small next to the gradients'."""

    def __init__(self, stop: StopRequest) -> None:
        super().__init__()
        self._stop = stop
        self.stopped = False

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if collective.any_rank(self._stop.requested, name="stop_vote"):
            self.stopped = True
            self.model.stop_training = True


class _TensorBoard:
    """Epoch scalars, in the layout Keras' TensorBoard callback uses (train/ and validation/
    runs, `epoch_` tags), written to every directory given."""

    def __init__(self, directories: tuple[Path, ...]) -> None:
        self._writers = {
            run: [tf.summary.create_file_writer(str(directory / run)) for directory in directories]
            for run in ("train", "validation")
        }

    def write(self, epoch: int, metrics: Mapping[str, float], learning_rate: float) -> None:
        scalars = {
            "train": {
                "epoch_loss": metrics.get("loss"),
                "epoch_accuracy": metrics.get("accuracy"),
                "epoch_images_per_sec": metrics.get("images_per_sec"),
                "epoch_learning_rate": learning_rate,
            },
            "validation": {
                "epoch_loss": metrics.get("val_loss"),
                "epoch_accuracy": metrics.get("val_accuracy"),
            },
        }
        for run, values in scalars.items():
            for writer in self._writers[run]:
                with writer.as_default(step=epoch):
                    for tag, value in values.items():
                        if value is not None and math.isfinite(value):
                            tf.summary.scalar(tag, value)
                writer.flush()


def _checkpoint_identity(params: Hyperparameters, class_names: tuple[str, ...]) -> dict:
    """What must match for a checkpoint's weights to fit this job's model."""
    return {"model": params.model, "image_size": params.image_size, "classes": list(class_names)}


def _identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    def show(name: str, value: Any) -> str:
        # Class lists can be long; their size and ends tell them apart well enough.
        if name == "classes" and isinstance(value, list) and len(value) > 4:
            return f"{len(value)} classes {value[0]}..{value[-1]}"
        return str(value)

    return ", ".join(
        f"{name}={show(name, saved.get(name))} in the checkpoint, {show(name, current[name])} now"
        for name in current
        if saved.get(name) != current[name]
    )


def _resume(
    checkpoint: tf.train.Checkpoint,
    directory: Path,
    identity: Mapping[str, Any],
    rank: int,
) -> tuple[int, dict[str, Any]]:
    """Restore the newest checkpoint; returns (completed epochs, its saved state).

    Rank 0 writes the checkpoints, so rank 0 decides which one to resume from. Every rank
    that can see it (shared file system, or SageMaker's copy from S3 after a restart) reads
    it; the others get the weights from the broadcast that follows.
    """
    found = latest_checkpoint(directory) if rank == 0 else None
    # -1: no checkpoint (0 is one: stopped within the first epoch).
    epoch = int(collective.broadcast(found[0] if found else -1, name="resume"))
    if epoch < 0:
        return 0, {}
    if found is None:
        found = latest_checkpoint(directory)
    if found is None or found[0] != epoch:
        log.info("resuming from checkpoint epoch=%d (weights from rank 0)", epoch)
        return epoch, {}
    state = read_state(found[1])
    saved_identity = state.get("identity", {})
    if saved_identity != dict(identity):
        raise CheckpointMismatchError(
            f"the checkpoint {found[1]} does not fit this job "
            f"({_identity_differences(saved_identity, identity)}): "
            "give a job that trains another model its own checkpoint location"
        )
    checkpoint.read(str(found[1] / WEIGHTS_PREFIX)).assert_existing_objects_matched()
    log.info("resuming from checkpoint epoch=%d (%s)", epoch, found[1])
    return epoch, state


def _optimizer_variables(optimizer: tf.keras.optimizers.Optimizer) -> list[tf.Variable]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


# What Keras' save_weights writes (HDF5): what a `pretrained` channel must hold.
_WEIGHT_SUFFIXES = (".h5", ".hdf5")


def pretrained_weights(params: Hyperparameters, root: Path | None) -> Path | None:
    """The one weights file of the `pretrained` channel, if there is the channel."""
    if root is None:
        return None
    if params.model == "small_cnn":
        raise DataError(
            "the pretrained channel holds weights for a keras.applications backbone: "
            "set model=mobilenet_v2 or model=resnet50"
        )
    found = sorted(
        path
        for path in root.rglob("*")
        if path.is_file() and path.name.endswith(_WEIGHT_SUFFIXES) and not path.name.startswith(".")
    )
    if len(found) != 1:
        raise DataError(
            f"the pretrained channel ({root}) must hold exactly one Keras weights file "
            f"({', '.join(_WEIGHT_SUFFIXES)}); it holds {len(found)}"
        )
    return found[0]


def _build_model(
    params: Hyperparameters,
    num_classes: int,
    schedule: LearningRateSchedule,
    weights: Path | None,
) -> tuple[tf.keras.Model, tf.keras.optimizers.Optimizer]:
    try:
        model = build_classifier(params.model, params.image_size, num_classes, weights)
    except (ValueError, OSError) as error:
        if weights is None:
            raise
        # Keras' message names layers and shapes; the first line says what did not fit.
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"cannot load {weights} into {params.model}: {first}") from None
    if weights is not None:
        log.info("started %s from the weights in %s", params.model, weights)
    optimizer = collective.distributed_optimizer(tf.keras.optimizers.Adam(schedule.rate_at(0.0)))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # Create the optimizer's slots now, so a checkpoint restores them at once and the initial
    # broadcast covers them (Keras would otherwise create them in the first step).
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _scratch_dir(rank: int, what: str) -> Path:
    """Where a rank that is not rank 0 writes what every rank must write under a strategy (its
    copy is thrown away; TensorFlow's multi-worker guide: "to a temporary directory")."""
    return Path(tempfile.gettempdir()) / f"sm-hvd-rank-{rank}" / what


class _Run:
    """One rank's training run, from the first epoch to train to the export."""

    def __init__(
        self, params: Hyperparameters, paths: TrainingPaths, stop: StopRequest, host: str
    ) -> None:
        self.params = params
        self.paths = paths
        self.stop = stop
        self.rank, self.ranks = collective.rank(), collective.size()
        self.channels, self.class_names = _open_channels(params, paths, self.rank, self.ranks, host)
        self.train = self.channels["train"]
        # Models trained in step: one per Horovod rank; under a strategy, one per device of
        # every worker (each takes its own batch of the worker's share every step).
        per_rank = collective.replicas_per_rank()
        self.replicas = self.ranks * per_rank
        # Every step is a collective: as many per epoch on every rank, enough for the
        # smallest share to be read once.
        smallest = collective.min_across_ranks(self.train.reader.expected, name="train_share_steps")
        self.steps = steps_per_epoch(smallest, params.batch_size * per_rank)
        self.schedule = LearningRateSchedule(
            params.learning_rate, self.replicas, params.warmup_epochs, params.epochs
        )
        with collective.scope():
            self.model, self.optimizer = _build_model(
                params,
                len(self.class_names),
                self.schedule,
                pretrained_weights(params, paths.pretrained),
            )
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.identity = _checkpoint_identity(params, self.class_names)
        self.evaluate = _Evaluator(self.model, params.batch_size)
        self.tensorboard = _TensorBoard(paths.tensorboard_dirs) if self.rank == 0 else None
        self.last_metrics: dict[str, float] = {}

    def save(self, epochs_done: int, interrupted: bool) -> None:
        if self.rank != 0 and not collective.EVERY_RANK_WRITES:
            return
        target = save_checkpoint(
            self.paths.checkpoint_dir if self.rank == 0 else _scratch_dir(self.rank, "checkpoints"),
            epochs_done,
            self.checkpoint.write,
            {"identity": self.identity, "metrics": self.last_metrics, "interrupted": interrupted},
        )
        if self.rank == 0:
            log.info("wrote checkpoint %s", target)

    def stop_now(self, epochs_done: int, save_first: bool) -> int:
        # Rank 0 writes, then the barrier keeps every rank alive until the checkpoint is on
        # disk: mpirun kills all ranks as soon as one of them exits non-zero.
        if save_first:
            self.save(epochs_done, interrupted=True)
        # Logged before the barrier: once the first rank exits, mpirun may drop the output
        # the others have not had forwarded yet.
        log.info(
            "stopped by %s at step %d after %d complete epoch(s); exiting with %d",
            self.stop.signal_name or "another rank's signal",
            int(self.optimizer.iterations.numpy()),
            epochs_done,
            STOPPED_EXIT_CODE,
        )
        collective.barrier("stop_barrier")
        return STOPPED_EXIT_CODE

    def start(self) -> int:
        """Resume, check the data, then train; returns the exit code."""
        completed, state = _resume(
            self.checkpoint, self.paths.checkpoint_dir, self.identity, self.rank
        )
        self.last_metrics = dict(state.get("metrics", {}))
        # Same starting point everywhere: fresh weights, or rank 0's restored ones.
        collective.broadcast_variables(
            [*self.model.variables, *_optimizer_variables(self.optimizer)]
        )
        _fill_caches(self.channels, self.params.max_bad_fraction, self.stop)
        if self.rank == 0:
            log.info(
                "training %s on %d rank(s): epochs=%d (done %d) steps_per_epoch=%d "
                "batch_size=%d per rank, peak_learning_rate=%g",
                self.params.model,
                self.replicas,
                self.params.epochs,
                completed,
                self.steps,
                self.params.batch_size,
                self.schedule.peak_rate,
            )
        if collective.any_rank(self.stop.requested, name="stop_vote_start"):
            # Nothing trained yet: the newest checkpoint, if any, is still the truth.
            return self.stop_now(completed, save_first=False)
        code = self.train_epochs(completed)
        if code == 0:
            self.finish()
        return code

    def train_epochs(self, completed: int) -> int:
        params = self.params
        batches = training_batches(
            self.train.reader,
            self.train.decoded,
            tally=self.train.tally,
            cached=self.train.cached,
            batch_size=params.batch_size,
            seed=params.seed + self.rank,
        )
        inputs = collective.distribute(batches)
        agreed_stop = _AgreedStopCallback(self.stop)
        callbacks = [
            *collective.training_callbacks(),
            _LearningRateCallback(self.schedule, self.steps, self.optimizer),
            agreed_stop,
            _HeartbeatCallback(),
        ]
        for epoch in range(completed, params.epochs):
            started = time.monotonic()
            # One fit() per epoch: a stop vote can end it mid-epoch without Keras then
            # running the validation it runs at the end of every epoch.
            history = self.model.fit(
                inputs,
                steps_per_epoch=self.steps,
                initial_epoch=epoch,
                epochs=epoch + 1,
                callbacks=callbacks,
                verbose=0,
            )
            seconds = time.monotonic() - started
            if agreed_stop.stopped:
                # Mid-epoch: the checkpoint counts `epoch` complete epochs but holds the
                # weights of the steps since, so a restart repeats part of an epoch and
                # loses nothing.
                return self.stop_now(epoch, save_first=True)
            self.end_epoch(epoch + 1, history.history, seconds)
            # A signal that came during validation or checkpointing (after the last vote).
            if collective.any_rank(self.stop.requested, name="stop_vote_epoch") and epoch + 1 < (
                params.epochs
            ):
                return self.stop_now(epoch + 1, save_first=False)
        return 0

    def end_epoch(self, epochs_done: int, history: Mapping[str, list], seconds: float) -> None:
        metrics = {name: float(values[-1]) for name, values in history.items()}
        metrics["images_per_sec"] = self.steps * self.params.batch_size * self.replicas / seconds
        if "validation" in self.channels:
            validation = self.evaluate(self.channels["validation"], "validation")
            metrics["val_loss"] = validation["loss"]
            metrics["val_accuracy"] = validation["accuracy"]
        self.last_metrics = metrics
        if self.tensorboard is not None:
            log.info(format_epoch_line(epochs_done, metrics))
            self.tensorboard.write(epochs_done, metrics, self.schedule.rate_at(epochs_done))
        self.save(epochs_done, interrupted=False)
        if not self.train.cached:
            _check_channel("train", self.train, self.params.max_bad_fraction)

    def finish(self) -> None:
        """Evaluate on the whole validation and test sets, count what was skipped, export."""
        results: dict[str, Any] = {
            "epochs": self.params.epochs,
            "train": {
                "loss": self.last_metrics.get("loss", math.nan),
                "accuracy": self.last_metrics.get("accuracy", math.nan),
            },
        }
        for name in ("validation", "test"):
            if name in self.channels:
                channel = self.channels[name]
                if not channel.cached:
                    _check_channel(name, channel, self.params.max_bad_fraction)
                results[name] = self.evaluate(channel, name)
        unreadable = {}
        for name, channel in self.channels.items():
            bad, total = collective.sum_across_ranks(
                [len(channel.tally), channel.tally.total], name=f"unreadable_total_{name}"
            )
            unreadable[name] = int(bad)
            if self.rank == 0:
                log.info("skipped %d unreadable image(s) of %d in the %s channel", bad, total, name)
        results["unreadable_images"] = unreadable
        if self.rank != 0:
            if collective.EVERY_RANK_WRITES:
                export_model(
                    self.model,
                    self.params.image_size,
                    self.class_names,
                    results,
                    _scratch_dir(self.rank, "model"),
                )
            return
        for name in ("validation", "test"):
            if name in results:
                log.info(
                    "%s: loss=%.4f accuracy=%.4f images=%d",
                    name,
                    results[name]["loss"],
                    results[name]["accuracy"],
                    results[name]["images"],
                )
        target = export_model(
            self.model, self.params.image_size, self.class_names, results, self.paths.model_dir
        )
        log.info("exported the model to %s", target)


def run(params: Hyperparameters, paths: TrainingPaths, stop: StopRequest, host: str) -> int:
    """Train, evaluate and export; returns the process exit code (0, or 143 when stopped).

    Raises DataError for unusable channels, CheckpointMismatchError for a foreign checkpoint.
    """
    _pin_devices()
    if collective.rank() == 0:
        log.info("hyperparameters: %s", params)
    # Per rank, for distinct dropout masks; the initial weights come from rank 0 anyway.
    tf.keras.utils.set_random_seed(params.seed + collective.rank())
    return _Run(params, paths, stop, host).start()
