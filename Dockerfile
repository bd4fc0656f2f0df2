# SageMaker "bring your own container" for distributed TensorFlow + Horovod over OpenMPI and ssh.
#
#   make build                 GPU flavor (default): CUDA 11.8, NCCL 2.16, Horovod with NCCL ops
#   make build FLAVOR=cpu      CPU flavor: the same without CUDA (what the tests run)
#   make build FLAVOR=torch    PyTorch instead of TensorFlow (GPU; FLAVOR=torch-cpu: CPU), below
#
# Stages, top to bottom, in the order of how rarely they change:
#   os       runtime system packages (OpenMPI, OpenSSH, Python, tini)
#   pydeps   pinned Python packages (docker/constraints.txt), tensorflow by flavor
#   build    compilers (+ CUDA toolkit on GPU) to build Horovod, mpi4py, sagemaker-training wheels
#   final    pydeps + those wheels + this repository's code, checked by `horovodrun --check-build`
# Only `final` ships: no compiler, no CUDA toolkit, no key, no CA bundle in any of its layers.
#
# A CA bundle for a TLS-intercepting proxy can be passed as a BuildKit secret (never a layer):
#   DOCKER_BUILDKIT=1 docker build --secret id=ca,src=/path/to/ca-bundle.crt .

# A Debian bookworm base: `make base` builds it with debootstrap where no registry is reachable;
# with a registry, BASE_IMAGE=debian:bookworm-slim (or an Ubuntu 22.04/24.04 image) works too.
ARG BASE_IMAGE=sm-horovod-base:bookworm
ARG FLAVOR=gpu
# Stack dumps of the ranks (both images).
ARG PY_SPY_VERSION=0.4.2

################################################################################################
FROM ${BASE_IMAGE} AS os

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Versions come from the Debian release the base image follows (bookworm: OpenMPI 4.1.4,
# OpenSSH 9.2, Python 3.11); pinning Debian revisions would break on every security update.
# hadolint ignore=DL3008
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        ca-certificates \
        libopenmpi3 \
        openmpi-bin \
        openssh-client \
        openssh-server \
        procps \
        python3 \
        python3-venv \
        tini \
    ; \
    rm -rf /var/lib/apt/lists/*; \
# openssh-server's postinst generated host keys: no private key may stay in a layer; the entry
# point makes the job's keys when the container starts.
    rm -f /etc/ssh/ssh_host_*; \
    mkdir -p /run/sshd; \
    mpirun --version; \
    python3 --version

COPY docker/sshd_config /etc/ssh/sshd_config.d/sm-horovod.conf
COPY docker/ssh_config /etc/ssh/ssh_config.d/sm-horovod.conf
COPY docker/openmpi-mca-params.conf /tmp/openmpi-mca-params.conf
RUN set -eux; \
    cat /tmp/openmpi-mca-params.conf >> /etc/openmpi/openmpi-mca-params.conf; \
    rm /tmp/openmpi-mca-params.conf

# SageMaker runs training as root; mpirun refuses root unless told twice.
ENV OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

# A virtualenv keeps pip away from Debian's own Python packages (PEP 668).
RUN python3 -m venv /opt/venv

################################################################################################
FROM os AS pydeps-install
ARG FLAVOR
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/constraints.txt docker/requirements*.txt /opt/requirements/
# The secret, when given, replaces the system bundle for this one command only.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install -r "/opt/requirements/requirements-${FLAVOR}.txt"; \
# Third-party test suites ship throwaway private keys (gevent/tests/*.key, *.pem). No private
# key may be in any layer, so they are deleted in the layer that installed them.
    { grep -rlZ --include='*.pem' --include='*.key' -e 'PRIVATE KEY-----' /opt/venv/lib || true; } \
        | xargs -0r rm -v

FROM pydeps-install AS pydeps-cpu

FROM pydeps-install AS pydeps-gpu
# tensorflow 2.14 and Horovod load CUDA, cuDNN and NCCL from the nvidia-*-cu11 wheels, which
# the loader only finds on LD_LIBRARY_PATH; the driver's libcuda.so.1 is mounted by the NVIDIA
# container runtime (SageMaker's GPU hosts).
# https://github.com/tensorflow/tensorflow/issues/65842
# XLA looks for libdevice and ptxas under /usr/local/cuda unless told where the wheel put them.
# https://github.com/tensorflow/tensorflow/issues/59013
ENV NVIDIA_VISIBLE_DEVICES=all \
    XLA_FLAGS=--xla_gpu_cuda_data_dir=/opt/venv/lib/python3.11/site-packages/nvidia/cuda_nvcc \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cublas/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_cupti/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cufft/lib:/opt/venv/lib/python3.11/site-packages/nvidia/curand/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusolver/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusparse/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib

# The TensorFlow 2.21 line (FLAVOR=tf2.21-cpu; FLAVOR=tf2.21 for GPU; docs/tf-lines.md): Keras
# 3, plus tf-keras for TF_USE_LEGACY_KERAS=1; tensorflow-io, which has no release after TF 2.16,
# without its op libraries and with a shim of ours (s3://: stage tf-io-plugins). Its own
# requirements and pins (docker/tf2.21/, a folder of its own so that the 2.14 line's
# requirements*.txt never picks them up); the stages below this one are shared with 2.14.
FROM os AS tf2.21-pydeps-install
ARG FLAVOR
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/tf2.21/ /opt/requirements/
# tf-keras requires `tensorflow`, which on the CPU flavor would install the 570 MB CUDA build over
# tensorflow-cpu (the same Python code): it goes in without dependencies, and pip check below
# allows exactly that one missing requirement.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install -r "/opt/requirements/requirements-${FLAVOR}.txt"; \
    pip install --no-deps -c /opt/requirements/constraints.txt tf-keras; \
    { grep -rlZ --include='*.pem' --include='*.key' -e 'PRIVATE KEY-----' /opt/venv/lib || true; } \
        | xargs -0r rm -v
# tf_s3 loads this before it registers tensorflow-io's file system plugins (stage tf-io-plugins).
ENV SM_HVD_TF_IO_SHIM=/opt/sm-horovod/tf-io/libsm_tsl_shim.so

FROM tf2.21-pydeps-install AS pydeps-tf2.21-cpu

FROM tf2.21-pydeps-install AS pydeps-tf2.21
# tensorflow[and-cuda] 2.21 finds its nvidia-*-cu12 libraries through its own RUNPATH; Horovod's
# mpi_lib needs libnccl.so.2 by name (the wheel's folder is no RUNPATH of it). The driver's
# libcuda.so.1 is mounted by the NVIDIA container runtime (SageMaker's GPU hosts).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib

# hadolint ignore=DL3006
FROM pydeps-${FLAVOR} AS pydeps

################################################################################################
FROM pydeps AS build-common
# hadolint ignore=DL3008
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        build-essential \
        cmake \
        libopenmpi-dev \
        python3-dev \
    ; \
    rm -rf /var/lib/apt/lists/*
ENV HOROVOD_WITH_TENSORFLOW=1 \
    HOROVOD_WITH_MPI=1 \
    HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1

FROM build-common AS build-cpu
ENV HOROVOD_CPU_OPERATIONS=MPI

FROM build-common AS build-gpu
# Debian's CUDA 11.8 toolkit lives in non-free; add the components to the sources line the base
# already has (sources.list for debootstrap bases, debian.sources for the official images).
# nvcc 11.8 supports host compilers up to g++ 11.
# hadolint ignore=DL3008
RUN set -eux; \
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then \
        sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' /etc/apt/sources.list.d/debian.sources; \
    fi; \
    if [ -f /etc/apt/sources.list ]; then \
        sed -i -E 's/^(deb .* main)$/\1 contrib non-free non-free-firmware/' /etc/apt/sources.list; \
    fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends g++-11 nvidia-cuda-toolkit; \
    rm -rf /var/lib/apt/lists/*; \
    nvcc --version; \
# The nccl wheel ships only the versioned soname; Horovod's build links against libnccl.so.
    ln -s libnccl.so.2 /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so
# V100 (70), T4 (75), A100 (80), A10G (86), L4/L40S (89), H100 (90).
ENV CC=gcc-11 \
    CXX=g++-11 \
    HOROVOD_GPU=CUDA \
    HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_CUDA_HOME=/usr \
    HOROVOD_NCCL_HOME=/opt/venv/lib/python3.11/site-packages/nvidia/nccl \
    HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_BUILD_CUDA_CC_LIST=70,75,80,86,89,90

# The 2.21 line's GPU compilers, below its Horovod source so that a patch change does not
# install them again: build-gpu's (FLAVOR=tf2.21 builds it on the 2.21 line's build-common).
# No CUDA 12 nvcc is reachable here (docs/tf-lines.md): Debian's CUDA 11.8 nvcc compiles
# Horovod's kernels, against the cu12 NCCL wheel's nccl.h (it accepts CUDA >= 11); Horovod
# links CUDA 11.8's runtime statically (its CMake default), so the image needs no
# libcudart.so.11: TensorFlow's libcudart.so.12 and it share the driver.
FROM build-common AS build-tf2.21-toolchain-tf2.21-cpu
FROM build-gpu AS build-tf2.21-toolchain-tf2.21

# Horovod 0.28.1 (its last release) from its sdist, checksum pinned, with our patches for
# TensorFlow 2.21 (docker/horovod-patches/source/: each file's header says what it fixes and
# why); docker/tf2.21/requirements-build.txt builds the patched folder. The Python side's
# patches go into the built wheel (stage wheels-tf2.21-common).
# hadolint ignore=DL3006
FROM build-tf2.21-toolchain-${FLAVOR} AS build-tf2.21-common
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG HOROVOD_VERSION=0.28.1
ARG HOROVOD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
COPY docker/horovod-patches/source /tmp/horovod-patches
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip download --no-cache-dir --no-deps --no-binary :all: --dest /tmp/sdist "horovod==${HOROVOD_VERSION}"; \
    echo "${HOROVOD_SHA256} */tmp/sdist/horovod-${HOROVOD_VERSION}.tar.gz" | sha256sum -c -; \
    tar -C /opt -xzf "/tmp/sdist/horovod-${HOROVOD_VERSION}.tar.gz"; \
    mv "/opt/horovod-${HOROVOD_VERSION}" /opt/horovod-src; \
    for patch in /tmp/horovod-patches/*.patch; do \
        patch --directory /opt/horovod-src --strip 1 --forward --batch < "$patch"; \
    done; \
    rm -rf /tmp/sdist /tmp/horovod-patches

FROM build-tf2.21-common AS build-tf2.21-cpu
ENV HOROVOD_CPU_OPERATIONS=MPI
FROM build-tf2.21-common AS build-tf2.21

# hadolint ignore=DL3006
FROM build-${FLAVOR} AS build
# --no-build-isolation: Horovod must compile against the tensorflow already in this venv.
# --no-cache-dir: pip's wheel cache is keyed by version only, so a Horovod wheel compiled for
# one flavor would be reused for the other (seen: a GPU image without NCCL).
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    MAKEFLAGS="-j$(nproc)"; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt MAKEFLAGS; \
    pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels \
        -r /opt/requirements/requirements-build.txt

# s3:// on the 2.21 line (tf_s3/, docs/tf-lines.md): tensorflow-io 0.37.1 (checksum pinned), its
# last release, built for TF 2.16: its Python package and file system plugin library
# (libtensorflow_io_plugins.so: s3, az, hdfs, http) load on 2.21, its op libraries do not (they
# need TF 2.16's internals) and leave the wheel here, most of its size; a tfio op then fails in
# one line naming the missing library. The plugin library needs 18 TensorFlow-internal symbols
# that 2.21 no longer exports: the shim library built here has them
# (docker/tf-io-shim/tsl_shim.cc says which and why). docker/tf-io-patches/: a script's own
# `import tensorflow_io` after tf_s3 registered the plugins. The final stage installs both.
FROM build-common AS tf-io-plugins
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TENSORFLOW_IO_VERSION=0.37.1
ARG TENSORFLOW_IO_SHA256=b072ae78143df8f786d3cbb9060b76f17f966824dd1e7906d3252c79525d2358
RUN --mount=type=bind,source=docker/tf-io-shim,target=/tmp/tf-io-shim \
    --mount=type=bind,source=docker/tf-io-patches,target=/tmp/tf-io-patches \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip download --no-cache-dir --no-deps --only-binary :all: --dest /tmp/wheel \
        "tensorflow-io==${TENSORFLOW_IO_VERSION}"; \
    wheel="$(echo /tmp/wheel/tensorflow_io-*.whl)"; \
    echo "${TENSORFLOW_IO_SHA256} *${wheel}" | sha256sum -c -; \
    python -m wheel unpack --dest /tmp/unpacked "$wheel"; \
    find /tmp/unpacked -name '*.so' ! -name libtensorflow_io_plugins.so -print -delete; \
    for patch in /tmp/tf-io-patches/*.patch; do \
        patch --directory /tmp/unpacked/tensorflow_io-* --strip 1 --forward --batch < "$patch"; \
    done; \
    mkdir -p /tf-io/wheel; \
    python -m wheel pack --dest-dir /tf-io/wheel /tmp/unpacked/tensorflow_io-*; \
    g++ -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror \
        -o /tf-io/libsm_tsl_shim.so /tmp/tf-io-shim/tsl_shim.cc; \
    rm -rf /tmp/wheel /tmp/unpacked

# The TensorFlow 2.21 line's patches to Horovod's Python side (docker/horovod-patches/python/:
# Keras 3) are applied to the built wheel, not to the source before its compile: a change to
# them rebuilds this layer in seconds, not Horovod's C++ (20 minutes on 2 loaded cores).
FROM build AS wheels-tf2.21-common
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=bind,source=docker/horovod-patches/python,target=/tmp/horovod-patches \
    set -eux; \
    python -m wheel unpack --dest /tmp/unpacked /wheels/horovod-*.whl; \
    for patch in /tmp/horovod-patches/*.patch; do \
        patch --directory /tmp/unpacked/horovod-* --strip 1 --forward --batch < "$patch"; \
    done; \
    rm /wheels/horovod-*.whl; \
    python -m wheel pack --dest-dir /wheels /tmp/unpacked/horovod-*; \
    rm -rf /tmp/unpacked
COPY --from=tf-io-plugins /tf-io/wheel/ /wheels/
COPY --from=tf-io-plugins /tf-io/libsm_tsl_shim.so /wheels/tf-io/

FROM wheels-tf2.21-common AS wheels-tf2.21-cpu
FROM wheels-tf2.21-common AS wheels-tf2.21
FROM build AS wheels-cpu
FROM build AS wheels-gpu

# hadolint ignore=DL3006
FROM wheels-${FLAVOR} AS wheels

################################################################################################
# hadolint ignore=DL3006
FROM pydeps AS final
ARG FLAVOR
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Horovod and the other compiled packages, from the build stage's wheels (no compiler here).
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    set -eux; \
    pip install --no-deps --no-index --no-cache-dir /wheels/*.whl; \
    if [ -d /wheels/tf-io ]; then install -D -m 0644 /wheels/tf-io/libsm_tsl_shim.so "$SM_HVD_TF_IO_SHIM"; fi; \
# Two requirements are left out on purpose on the 2.21 line, and pip check allows exactly those:
# tf-keras asks for `tensorflow`, the CUDA build, where tensorflow-cpu is installed (the CPU
# flavor), and tensorflow-io for tensorflow-io-gcs-filesystem, a plugin built for TF 2.16 that
# TensorFlow would load at its own import (gs:// is TensorFlow's own since 2.6).
    if [ -d /wheels/tf-io ]; then \
        { pip check || true; } > /tmp/pip-check.txt; \
        sed -i -E -e '/^tf-keras [0-9.]+ requires tensorflow, which is not installed\.$/d' \
            -e '/^tensorflow-io [0-9.]+ requires tensorflow-io-gcs-filesystem, which is not installed\.$/d' \
            /tmp/pip-check.txt; \
        if grep -v '^No broken requirements found\.$' /tmp/pip-check.txt; then exit 1; fi; \
        rm /tmp/pip-check.txt; \
    else \
        pip check; \
    fi; \
    horovodrun --check-build | tee /tmp/check-build.txt; \
    grep -q '\[X\] TensorFlow' /tmp/check-build.txt; \
    grep -q '\[X\] MPI' /tmp/check-build.txt; \
    grep -q '\[X\] Gloo' /tmp/check-build.txt; \
    case "$FLAVOR" in gpu|tf2.21) grep -q '\[X\] NCCL' /tmp/check-build.txt;; esac; \
    rm /tmp/check-build.txt; \
    python -c 'import horovod.tensorflow.keras, mpi4py.MPI, sagemaker_training.environment'; \
# Every library Horovod's ops link resolves in the image, without a GPU: TensorFlow's own
# from its folder (`import tensorflow` loads them first), NCCL from LD_LIBRARY_PATH; CUDA's
# runtime is linked in statically, and libcuda.so.1 is the GPU host's, loaded at first use.
    tf_dir="$(python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("tensorflow").origin))')"; \
    for lib in /opt/venv/lib/python3.11/site-packages/horovod/tensorflow/mpi_lib*.so; do \
        LD_LIBRARY_PATH="$tf_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$lib" | tee /tmp/ldd.txt; \
        if grep 'not found' /tmp/ldd.txt; then exit 1; fi; \
    done; \
    rm /tmp/ldd.txt

# py-spy reads every rank's stack from outside, a stopped rank's too (entrypoint/host/stacks.py,
# a stall or a stop's grace running out). Where ptrace is refused, the ranks the entry point
# starts (SM_HVD_STACKS_DIR set) write their own on SIGUSR2 into a file of their own: a .pth line
# registers faulthandler at start, never chained to SIGUSR2's default action, which would end the
# rank (smcommon/stacks_hook.py; Debian's own sitecustomize would shadow one of ours).
ARG PY_SPY_VERSION
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install --only-binary=:all: "py-spy==${PY_SPY_VERSION}"; \
    py-spy --version
COPY docker/sm_horovod_stacks.pth /opt/venv/lib/python3.11/site-packages/sm_horovod_stacks.pth

# TF Text's ops, as TF Serving links them in: serve imports tensorflow_text before any model
# loads, so a SavedModel with a tokenizer or text normalizer loads as it does in TF Serving
# (docs/serve.md). --no-deps: its wheel asks for `tensorflow`, the GPU distribution, which the
# CPU flavor's tensorflow-cpu already is; tensorflow-hub is what `import tensorflow_text`
# imports (0.15: the last release before it asks for tf-keras). About 22 MB installed.
# https://github.com/tensorflow/text#compatibility
# The 2.21 line has none yet: TF Text's wheels are built against one TensorFlow each (2.14's
# fails to load on 2.21 with an abseil symbol missing), and no 2.21 wheel was tried.
ARG TENSORFLOW_TEXT_VERSION=2.14.0
ARG TENSORFLOW_HUB_VERSION=0.15.0
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    case "$FLAVOR" in tf2.21*) exit 0;; esac; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install --no-deps --only-binary=:all: \
        "tensorflow-text==${TENSORFLOW_TEXT_VERSION}" "tensorflow-hub==${TENSORFLOW_HUB_VERSION}"; \
    python -c 'import tensorflow_text'

COPY docker/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# This repository's code, last: a code-only change rebuilds only this layer.
COPY pyproject.toml /opt/src/
COPY entrypoint /opt/src/entrypoint
COPY smcommon /opt/src/smcommon
COPY model /opt/src/model
COPY serve /opt/src/serve
COPY smdistributed /opt/src/smdistributed
COPY tf_s3 /opt/src/tf_s3
RUN set -eux; \
# sagemaker-training installs its own `train` script; ours replaces it.
    rm -f /opt/venv/bin/train; \
    pip install --no-deps --no-build-isolation --no-cache-dir /opt/src; \
    rm -rf /opt/src; \
# mpirun's rsh agent for the channel launch, one per worker on the master: a script run by
# `python -IS` (entrypoint/launches/mpi/rsh_agent.py says why); without arguments it exits 127 (usage).
    install -m 0755 "$(python -c 'import entrypoint.launches.mpi.rsh_agent as m; print(m.__file__)')" \
        /opt/venv/bin/sm-horovod-rsh-agent; \
    { sm-horovod-rsh-agent 2>/dev/null || [ $? -eq 127 ]; }; \
# Every rank of mpirun and torchrun starts through it (entrypoint/host/rank_shim.py): it registers
# with its host's entry point, then execs the program; without arguments it exits 127 (usage).
    install -m 0755 "$(python -c 'import entrypoint.host.rank_shim as m; print(m.__file__)')" \
        /opt/venv/bin/sm-horovod-rank; \
    { sm-horovod-rank 2>/dev/null || [ $? -eq 127 ]; }; \
    [ "$(sm-horovod-rank echo ok)" = ok ]; \
    [ "$(command -v train)" = /opt/venv/bin/train ]; \
    grep -q 'entrypoint.main' /opt/venv/bin/train; \
    [ "$(command -v serve)" = /opt/venv/bin/serve ]; \
    python -c 'import serve.app, uvicorn, uvloop, httptools'; \
# s3:// in TensorFlow for scripts that never import tensorflow_io (tf_s3/__init__.py), on both
# lines (2.21: tensorflow-io's plugin library after our shim, stage tf-io-plugins). Offline proof: the scheme
# is registered and answers (a local 404, not "not implemented"), the data-parallel API
# imports, and the process exits 0 after creating an S3 client (tensorflow/io#1912).
    echo 'import tf_s3; tf_s3.install()' \
        > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sm-horovod-tf-s3.pth"; \
    AWS_ACCESS_KEY_ID=smoke AWS_SECRET_ACCESS_KEY=smoke AWS_EC2_METADATA_DISABLED=true \
        python -m tf_s3.smoke; \
# sshd must accept its configuration; a throwaway host key proves it and leaves no trace.
    ssh-keygen -q -t ed25519 -N '' -f /tmp/check_host_key; \
    /usr/sbin/sshd -t -o HostKey=/tmp/check_host_key; \
    rm -f /tmp/check_host_key /tmp/check_host_key.pub

# SDK v3's `source_code` jobs replace the entry point with `/bin/bash -c ".../sm_train.sh"`: in
# bash as PID 1 this hook runs `tini -- train` instead (docker/bash-env.sh says why).
COPY docker/bash-env.sh /etc/sm-horovod/bash-env.sh
ENV BASH_ENV=/etc/sm-horovod/bash-env.sh

# TensorFlow's C++ INFO lines (oneDNN notices, CPU features) drown the training log on every
# rank; warnings and errors still show. Override with -e TF_CPP_MIN_LOG_LEVEL=0.
ENV SM_IMAGE_FLAVOR=${FLAVOR} \
    TF_CPP_MIN_LOG_LEVEL=1
# `docker run IMAGE serve` listens on SAGEMAKER_BIND_TO_PORT when SageMaker sets it (inference
# pipelines), else on 8080.
# https://docs.aws.amazon.com/sagemaker/latest/dg/inference-pipeline-real-time.html
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
EXPOSE 8080
WORKDIR /opt/ml
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/docker-entrypoint.sh"]
CMD []

################################################################################################
# The PyTorch image (FLAVOR=torch for GPU, FLAVOR=torch-cpu): the same `os` stage, entry point
# and contract, with torch instead of TensorFlow; no Horovod, no built-in model; `serve` runs
# SageMaker's PyTorch inference contract (docs/torch.md says why and what each flavor holds).

FROM os AS torch-pydeps-install
ARG FLAVOR
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/constraints.txt docker/constraints-torch.txt docker/requirements-torch*.txt /opt/requirements/
# PyPI has no CPU-only torch: every torch wheel there is a CUDA build. The CPU flavor installs
# torch without its dependencies plus only the CUDA libraries `import torch` loads
# (requirements-torch-cpu.txt says which stay out).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install -r /opt/requirements/requirements-torch-common.txt; \
    if [ "$FLAVOR" = torch-cpu ]; then no_deps=--no-deps; else no_deps=; fi; \
    pip install $no_deps -r "/opt/requirements/requirements-${FLAVOR}.txt"; \
    { grep -rlZ --include='*.pem' --include='*.key' -e 'PRIVATE KEY-----' /opt/venv/lib || true; } \
        | xargs -0r rm -v

FROM torch-pydeps-install AS torch-pydeps-torch-cpu

FROM torch-pydeps-install AS torch-pydeps-torch
# torch finds its CUDA libraries through its own RPATH (no LD_LIBRARY_PATH); the driver's
# libcuda.so.1 is mounted by the NVIDIA container runtime on SageMaker's GPU hosts.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# hadolint ignore=DL3006
FROM torch-pydeps-${FLAVOR} AS torch-pydeps

FROM torch-pydeps AS torch-build
# hadolint ignore=DL3008
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends build-essential libopenmpi-dev python3-dev; \
    rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    MAKEFLAGS="-j$(nproc)"; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt MAKEFLAGS; \
    pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels \
        -r /opt/requirements/requirements-torch-build.txt

FROM torch-pydeps AS torch-final
ARG FLAVOR
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The CPU flavor leaves out what torch lists but never loads without a GPU; pip check may
# report exactly those as missing, and nothing else.
RUN --mount=type=bind,from=torch-build,source=/wheels,target=/wheels \
    --mount=type=bind,source=docker/torch_check.py,target=/tmp/torch_check.py \
    set -eux; \
    pip install --no-deps --no-index --no-cache-dir /wheels/*.whl; \
    { pip check || true; } | tee /tmp/pip-check.txt; \
    if [ "$FLAVOR" = torch-cpu ]; then \
        sed -i -E '/^torch [0-9.]+ requires (triton|cuda-bindings|nvidia-[a-z-]+-cu12), which is not installed\.$/d' /tmp/pip-check.txt; \
    fi; \
    if grep -v '^No broken requirements found\.$' /tmp/pip-check.txt; then exit 1; fi; \
    rm /tmp/pip-check.txt; \
    python -c 'import mpi4py.MPI, sagemaker_training.environment, torch, torchvision; print(torch.__version__, torchvision.__version__, torch._C._cuda_getArchFlags())'; \
# NCCL is a library torch loads, not a device: its version reads without a GPU.
    if [ "$FLAVOR" = torch ]; then \
        python -c 'import torch, torch.cuda.nccl, torch.distributed as d; assert d.is_nccl_available(); print("NCCL", torch.cuda.nccl.version())'; \
    fi; \
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 /tmp/torch_check.py

# `serve`'s server, as in the TensorFlow images (docker/requirements.txt says why these), at the
# same pins; a layer of its own, so that the torch layers above stay cached.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install -c /opt/requirements/constraints.txt starlette uvicorn uvloop httptools; \
    python -c 'import starlette, uvicorn, uvloop, httptools'

# torch.compile's default backend (inductor) builds its CPU kernels, and triton its GPU
# launchers, with the system's C++ compiler and Python's headers when a model first runs:
# without them a user's model_fn that compiles its model fails at the first request
# (docs/torch.md: what this layer adds to the image).
# hadolint ignore=DL3008
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends g++ python3-dev; \
    rm -rf /var/lib/apt/lists/*; \
    python -c 'import torch; f = torch.compile(lambda x: x.sin() + 1); assert float(f(torch.zeros(4)).sum()) == 4.0'; \
# The check's compiled kernels (inductor's cache, ~120 MB) stay out of the layer.
    rm -rf /tmp/torchinductor_*

# py-spy reads every rank's stack from outside, a stopped rank's too (entrypoint/host/stacks.py,
# a stall or a stop's grace running out). Where ptrace is refused, the ranks the entry point
# starts (SM_HVD_STACKS_DIR set) write their own on SIGUSR2 into a file of their own: a .pth line
# registers faulthandler at start, never chained to SIGUSR2's default action, which would end the
# rank (smcommon/stacks_hook.py; Debian's own sitecustomize would shadow one of ours).
ARG PY_SPY_VERSION
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    set -eux; \
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; \
    pip install --only-binary=:all: "py-spy==${PY_SPY_VERSION}"; \
    py-spy --version
COPY docker/sm_horovod_stacks.pth /opt/venv/lib/python3.11/site-packages/sm_horovod_stacks.pth

COPY docker/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# This repository's code, last: no TensorFlow code (the built-in model and tf_s3, whose program
# checks the entry point then does not run: pyproject.toml's entry points).
COPY pyproject.toml /opt/src/
COPY entrypoint /opt/src/entrypoint
COPY smcommon /opt/src/smcommon
COPY serve /opt/src/serve
COPY smdistributed /opt/src/smdistributed
RUN set -eux; \
# sagemaker-training installs its own `train` script; ours replaces it.
    rm -f /opt/venv/bin/train; \
    pip install --no-deps --no-build-isolation --no-cache-dir /opt/src; \
    rm -rf /opt/src; \
# mpirun's rsh agent for the channel launch, one per worker on the master: a script run by
# `python -IS` (entrypoint/launches/mpi/rsh_agent.py says why); without arguments it exits 127 (usage).
    install -m 0755 "$(python -c 'import entrypoint.launches.mpi.rsh_agent as m; print(m.__file__)')" \
        /opt/venv/bin/sm-horovod-rsh-agent; \
    { sm-horovod-rsh-agent 2>/dev/null || [ $? -eq 127 ]; }; \
# Every rank of mpirun and torchrun starts through it (entrypoint/host/rank_shim.py): it registers
# with its host's entry point, then execs the program; without arguments it exits 127 (usage).
    install -m 0755 "$(python -c 'import entrypoint.host.rank_shim as m; print(m.__file__)')" \
        /opt/venv/bin/sm-horovod-rank; \
    { sm-horovod-rank 2>/dev/null || [ $? -eq 127 ]; }; \
    [ "$(sm-horovod-rank echo ok)" = ok ]; \
    grep -q 'entrypoint.main' "$(command -v train)"; \
    python -c 'import entrypoint.main as m; assert m.registered_checks() == {}, m.registered_checks()'; \
# Every rank mpirun starts gets torch's env:// variables (RANK, LOCAL_RANK, WORLD_SIZE,
# MASTER_ADDR, ...) from OpenMPI's, as AWS's smddprun gives them (smdistributed/dataparallel/
# torch/launch_env.py); the `smddp` backend registers and joins a world of one.
    echo 'import smdistributed.dataparallel.torch.launch_env as m; m.install_under_mpi()' \
        > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sm-horovod-smddp-env.pth"; \
    OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 python -c 'import os; assert os.environ["RANK"] == "0", os.environ'; \
    python -c 'import smdistributed.dataparallel.torch.torch_smddp, torch.distributed as d; d.init_process_group(backend="smddp"); assert d.get_backend() == "smddp"; d.destroy_process_group()'; \
# `serve` runs the PyTorch runner here and never imports TensorFlow (there is none).
    [ "$(command -v serve)" = /opt/venv/bin/serve ]; \
    SM_IMAGE_FLAVOR=${FLAVOR} python -c 'import sys, serve.app, serve.torch.runner; assert "tensorflow" not in sys.modules'; \
# sshd (mpirun between hosts) must accept its configuration; a throwaway host key proves it.
    ssh-keygen -q -t ed25519 -N '' -f /tmp/check_host_key; \
    /usr/sbin/sshd -t -o HostKey=/tmp/check_host_key; \
    rm -f /tmp/check_host_key /tmp/check_host_key.pub

# SDK v3's `source_code` jobs replace the entry point with `/bin/bash -c ".../sm_train.sh"`: in
# bash as PID 1 this hook runs `tini -- train` instead (docker/bash-env.sh says why).
COPY docker/bash-env.sh /etc/sm-horovod/bash-env.sh
ENV BASH_ENV=/etc/sm-horovod/bash-env.sh

ENV SM_IMAGE_FLAVOR=${FLAVOR}
# `docker run IMAGE serve`: as in the TensorFlow images (SAGEMAKER_BIND_TO_PORT, else 8080).
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
EXPOSE 8080
WORKDIR /opt/ml
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/docker-entrypoint.sh"]
CMD []

################################################################################################
# The image `make build FLAVOR=...` builds: the last stage, one per flavor. BuildKit builds only
# the stages the chosen one needs.
FROM final AS image-gpu
FROM final AS image-cpu
FROM final AS image-tf2.21-cpu
FROM final AS image-tf2.21
FROM torch-final AS image-torch
FROM torch-final AS image-torch-cpu
# hadolint ignore=DL3006
FROM image-${FLAVOR}
