"""Raw TCP bandwidth (iperf3) and Horovod allreduce bus bandwidth between the same two ranks.

Run on exactly 2 ranks, one per host, by our entry point. Rank 1 serves one iperf3 test, rank 0
runs the client; then both allreduce float32 tensors of each size (Horovod's tensor fusion on,
at its default threshold). Rank 0 writes <out>/allreduce.json.

Bus bandwidth is nccl-tests' definition: size / time * 2 (n - 1) / n, which for n = 2 is the
bytes each rank sends per second, comparable with one iperf3 stream.
"""

import argparse
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

MIB = 1024 * 1024

parser = argparse.ArgumentParser()
parser.add_argument("--sizes_mb", default="1,4,16,64,256")
parser.add_argument("--seconds_per_size", type=float, default=2.0)
parser.add_argument("--iperf_seconds", type=float, default=5.0)
parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/opt/ml/output/bench"))
args = parser.parse_args()

hvd.init()
rank, size = hvd.rank(), hvd.size()
if size != 2:
    raise SystemExit(f"allreduce_bw.py runs on 2 ranks, not {size}")
hosts = hvd.allgather_object(socket.gethostname())


def barrier() -> None:
    hvd.allreduce(tf.constant(0.0), op=hvd.Sum).numpy()


def measure_iperf3() -> dict:
    server = None
    if rank == 1:
        server = subprocess.Popen(["iperf3", "--server", "--one-off"], stdout=subprocess.DEVNULL)
        time.sleep(1.0)
    barrier()
    report: dict = {}
    if rank == 0:
        for _attempt in range(10):
            done = subprocess.run(
                ["iperf3", "--client", hosts[1], "--time", str(args.iperf_seconds), "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode == 0:
                report = json.loads(done.stdout)
                break
            time.sleep(0.5)
    barrier()
    if server is not None:
        server.wait(timeout=30)
    if not report:
        return {}
    end = report["end"]
    return {
        "sent_bits_per_second": end["sum_sent"]["bits_per_second"],
        "received_bits_per_second": end["sum_received"]["bits_per_second"],
        "seconds": end["sum_received"]["seconds"],
        "retransmits": end["sum_sent"].get("retransmits"),
    }


def seconds_per_allreduce(tensor: tf.Tensor, name: str) -> float:
    """Warm up, pick one iteration count for both ranks, then time that many allreduces."""
    for _ in range(2):
        hvd.allreduce(tensor, op=hvd.Sum, name=name).numpy()
    started = time.perf_counter()
    hvd.allreduce(tensor, op=hvd.Sum, name=name).numpy()
    once = hvd.allreduce(tf.constant(time.perf_counter() - started), op=hvd.Max).numpy()
    iterations = int(min(100, max(3, args.seconds_per_size / max(once, 1e-6))))
    barrier()
    started = time.perf_counter()
    result = None
    for _ in range(iterations):
        result = hvd.allreduce(tensor, op=hvd.Sum, name=name)
    assert result is not None  # iterations >= 3
    result.numpy()
    elapsed = hvd.allreduce(tf.constant(time.perf_counter() - started), op=hvd.Max).numpy()
    return float(elapsed) / iterations


iperf3 = measure_iperf3()
points = []
for megabytes in (int(text) for text in args.sizes_mb.split(",")):
    nbytes = megabytes * MIB
    tensor = tf.ones([nbytes // 4], tf.float32)
    seconds = seconds_per_allreduce(tensor, f"bw_{megabytes}")
    algbw = nbytes / seconds
    points.append(
        {
            "megabytes": megabytes,
            "seconds": seconds,
            "algbw_bytes_per_second": algbw,
            "busbw_bytes_per_second": algbw * 2 * (size - 1) / size,
        }
    )
    if rank == 0:
        print(f"ALLREDUCE {megabytes} MiB: {seconds * 1e3:.1f} ms", flush=True)
    del tensor

if rank == 0:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fusion = os.environ.get("HOROVOD_FUSION_THRESHOLD", "default (64 MiB)")
    result = {"hosts": hosts, "iperf3": iperf3, "allreduce": points, "fusion_threshold": fusion}
    (out / "allreduce.json").write_text(json.dumps(result))
