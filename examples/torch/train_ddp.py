"""Train a small VGG-style classifier on an ImageFolder data set with DistributedDataParallel.

The usual shape of a PyTorch DDP program, written to run unchanged:
- under `torchrun` (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or with
  those variables set by hand on each process (env:// rendezvous);
- under `mpirun` (what the image's `train` runs by default): rank and size from OpenMPI's
  OMPI_COMM_WORLD_* variables, the rendezvous on the first host of SM_HOSTS;
- alone, as one process.
gloo on CPU, NCCL on GPU (one process per GPU, LOCAL_RANK picks it).

SageMaker's contract: data from the `training` and `test` channels (SM_CHANNEL_TRAINING,
SM_CHANNEL_TEST), class folders inside (ImageFolder); rank 0 writes the weights to
SM_MODEL_DIR (model.pth, a state_dict, plus classes.json, and the same network as TorchScript,
model.pt); a checkpoint in /opt/ml/checkpoints
after every epoch and on SIGTERM (then exit 143, as SageMaker expects of a stopped job), and a
run that finds one there resumes from it (Spot training). Hyperparameters arrive as
`--name value` arguments.

Serving: `model_fn` below is SageMaker's PyTorch inference hook. `estimator.deploy()` serves the
model with this script as its code (the torch image's `serve`, as AWS's PyTorch containers), so
a float32 array of normalized images, N x 3 x H x W, gets the N x classes logits back; without
any script, `serve` loads model.pt (TorchScript) instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

log = logging.getLogger("train_ddp")

CHECKPOINT_FILE = "checkpoint.pt"
MODEL_FILE = "model.pth"
# The same network as TorchScript: what `serve` loads when the model comes with no model_fn.
TORCHSCRIPT_FILE = "model.pt"
CLASSES_FILE = "classes.json"
# What a process stopped by SIGTERM exits with (128 + 15), as SageMaker's own containers do.
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
DEFAULT_MASTER_PORT = "29500"


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def placement_from_env(env: Mapping[str, str]) -> tuple[Placement, dict[str, str]]:
    """This process's rank and size, and the rendezvous variables env:// still lacks (to set).

    torchrun (or a caller) sets RANK and the rest; mpirun sets OMPI_COMM_WORLD_*; neither
    means one process on its own."""
    rendezvous: dict[str, str] = {}
    if "RANK" in env:
        world_size = int(env["WORLD_SIZE"])
        placement = Placement(
            rank=int(env["RANK"]),
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world_size))),
        )
    elif "OMPI_COMM_WORLD_RANK" in env:
        placement = Placement(
            rank=int(env["OMPI_COMM_WORLD_RANK"]),
            world_size=int(env["OMPI_COMM_WORLD_SIZE"]),
            local_rank=int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")),
            local_world_size=int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")),
        )
        # mpirun puts rank 0 on the first host of its host list, which the image's entry point
        # builds from SM_HOSTS in order.
        hosts = json.loads(env.get("SM_HOSTS", "[]"))
        one_host = placement.world_size == placement.local_world_size
        rendezvous["MASTER_ADDR"] = "127.0.0.1" if one_host or not hosts else hosts[0]
    else:
        placement = Placement(rank=0, world_size=1, local_rank=0, local_world_size=1)
        rendezvous["MASTER_ADDR"] = "127.0.0.1"
    rendezvous["MASTER_PORT"] = DEFAULT_MASTER_PORT
    missing = {name: value for name, value in rendezvous.items() if name not in env}
    return placement, missing


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # SageMaker passes hyperparameters as written (`--batch_size`); both spellings work.
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", "--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--learning-rate", "--learning_rate", "--lr", type=float, default=1e-3)
    parser.add_argument("--image-size", "--image_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers (default: 4 on GPU, 0 on CPU)"
    )
    parser.add_argument(
        "--train-dir", "--train_dir", type=Path,
        default=Path(env.get("SM_CHANNEL_TRAINING", "/opt/ml/input/data/training")),
    )  # fmt: skip
    parser.add_argument(
        "--test-dir", "--test_dir", type=Path,
        default=Path(env.get("SM_CHANNEL_TEST", "/opt/ml/input/data/test")),
    )  # fmt: skip
    parser.add_argument(
        "--model-dir", "--model_dir", type=Path,
        default=Path(env.get("SM_MODEL_DIR", "/opt/ml/model")),
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint-dir", "--checkpoint_dir", type=Path, default=Path("/opt/ml/checkpoints")
    )
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "image_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def vgg_small(num_classes: int) -> nn.Module:
    """VGG's pattern at toy scale: two blocks of two 3x3 convolutions and a max-pool, then a
    small classifier; the adaptive pool makes it take any image size."""

    def block(channels_in: int, channels_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(channels_in, channels_out, 3, padding=1),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels_out, channels_out, 3, padding=1),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(3, 16),
        *block(16, 32),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(inplace=True),
        nn.Dropout(0.3),
        nn.Linear(64, num_classes),
    )


def image_folder(root: Path, image_size: int, *, train: bool) -> datasets.ImageFolder:
    if not root.is_dir():
        raise SystemExit(f"error: data folder {root} does not exist (channel missing?)")
    steps: list[Callable] = [transforms.Resize((image_size, image_size))]
    if train:
        steps.append(transforms.RandomAffine(degrees=8, translate=(0.05, 0.05)))
    steps += [transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)]
    return datasets.ImageFolder(str(root), transform=transforms.Compose(steps))


def write_atomically(path: Path, save: Callable[[Path], object]) -> None:
    """Write through a temporary file in the same folder, then rename: readers (and S3 sync of
    the checkpoint folder) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save(temporary)
    os.replace(temporary, path)


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epochs_done: int
) -> None:
    state = {
        "epochs_done": epochs_done,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    write_atomically(path, lambda target: torch.save(state, target))
    log.info("checkpoint written to %s (%d epochs done)", path, epochs_done)


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Epochs already done: 0 without a checkpoint."""
    if not path.is_file():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log.info("resumed from %s after %d epochs", path, state["epochs_done"])
    return int(state["epochs_done"])


class StopRequestedError(Exception):
    """SIGTERM arrived: checkpoint (rank 0) and exit 143."""


def train_epoch(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    stop: threading.Event,
) -> tuple[float, int]:
    """Mean loss on this process's shard and images seen; StopRequestedError between steps."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    total_loss, seen = 0.0, 0
    for batch_images, batch_labels in loader:
        if stop.is_set():
            raise StopRequestedError
        images, labels = batch_images.to(device), batch_labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        total_loss += loss.item() * len(labels)
        seen += len(labels)
    return total_loss / max(seen, 1), seen


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Accuracy over the whole held-out set: each process scores its share, then the counts
    are summed across processes."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for images, labels in loader:
        predictions = model(images.to(device)).argmax(dim=1)
        counts[0] += (predictions == labels.to(device)).sum()
        counts[1] += len(labels)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def configure_logging(rank: int) -> None:
    host = os.environ.get("SM_CURRENT_HOST") or socket.gethostname()
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s host={host} rank={rank} train_ddp: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)
    placement, rendezvous = placement_from_env(env)
    os.environ.update(rendezvous)
    configure_logging(placement.rank)
    args = parse_args(argv, env)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    if torch.cuda.is_available():
        device = torch.device("cuda", placement.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        # Share the cores between this host's processes instead of each taking all of them
        # (OMP_NUM_THREADS, where set, wins: torchrun sets 1 for several processes).
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // placement.local_world_size))
    dist.init_process_group(
        backend, init_method="env://", rank=placement.rank, world_size=placement.world_size
    )
    log.info(
        "rank %d of %d (local %d), %s on %s",
        placement.rank, placement.world_size, placement.local_rank, backend, device,
    )  # fmt: skip
    try:
        return run(args, placement, device, stop)
    finally:
        dist.destroy_process_group()


def run(
    args: argparse.Namespace, placement: Placement, device: torch.device, stop: threading.Event
) -> int:
    torch.manual_seed(args.seed)
    train_set = image_folder(args.train_dir, args.image_size, train=True)
    test_set = image_folder(args.test_dir, args.image_size, train=False)
    workers = args.workers if args.workers is not None else (4 if device.type == "cuda" else 0)
    sampler = DistributedSampler(
        train_set, num_replicas=placement.world_size, rank=placement.rank, seed=args.seed
    )
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, sampler=sampler, num_workers=workers,
        pin_memory=device.type == "cuda", drop_last=True,
    )  # fmt: skip
    # Every held-out image exactly once across the processes (DistributedSampler would pad).
    test_share = Subset(test_set, range(placement.rank, len(test_set), placement.world_size))
    test_loader = DataLoader(test_share, batch_size=256, num_workers=workers)

    model = vgg_small(len(train_set.classes)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    checkpoint = args.checkpoint_dir / CHECKPOINT_FILE
    epochs_done = load_checkpoint(checkpoint, model, optimizer)
    ddp_model = DistributedDataParallel(
        model, device_ids=[placement.local_rank] if device.type == "cuda" else None
    )
    is_chief = placement.rank == 0

    for epoch in range(epochs_done, args.epochs):
        sampler.set_epoch(epoch)
        started = time.monotonic()
        try:
            loss, seen = train_epoch(ddp_model, train_loader, optimizer, device, stop)
            accuracy = evaluate(ddp_model, test_loader, device)
        except (StopRequestedError, RuntimeError) as error:
            # A peer stopped by the same SIGTERM may break a collective before this process
            # reaches its own check: that is a stop too, not a failure.
            if not stop.is_set():
                raise
            log.info("SIGTERM: stopping in epoch %d (%s)", epoch + 1, type(error).__name__)
            if is_chief:
                save_checkpoint(checkpoint, model, optimizer, epoch)
            return SIGTERM_EXIT_CODE
        images_per_sec = seen * placement.world_size / (time.monotonic() - started)
        log.info(
            "epoch=%d loss=%.4f test_accuracy=%.4f images_per_sec=%.1f",
            epoch + 1, loss, accuracy, images_per_sec,
        )  # fmt: skip
        if is_chief:
            save_checkpoint(checkpoint, model, optimizer, epoch + 1)

    if is_chief:
        weights = model.state_dict()
        write_atomically(args.model_dir / MODEL_FILE, lambda path: torch.save(weights, path))
        scripted = torch.jit.script(model.to("cpu").eval())
        write_atomically(args.model_dir / TORCHSCRIPT_FILE, lambda path: scripted.save(str(path)))
        write_atomically(
            args.model_dir / CLASSES_FILE,
            lambda path: path.write_text(json.dumps(train_set.classes)),
        )
        log.info("model written to %s", args.model_dir / MODEL_FILE)
    return 0


def model_fn(model_dir: str) -> nn.Module:
    """SageMaker's PyTorch serving hook: the network rebuilt from classes.json and model.pth, in
    eval mode, on CPU (or the GPU when there is one)."""
    classes = json.loads((Path(model_dir) / CLASSES_FILE).read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = vgg_small(len(classes))
    model.load_state_dict(torch.load(Path(model_dir) / MODEL_FILE, map_location=device))
    return model.to(device).eval()


if __name__ == "__main__":
    sys.exit(main())
