# syntax=docker/dockerfile:1
# Image of the GPU stages: sample, sft, gppo, evaluate's sampling (torch + DeepSpeed + TRL + vLLM), and the
# teacher's vLLM server of the Helm chart. Every package comes from docker/locks/gpu.txt (make lock), resolved
# for Ubuntu 24.04's Python 3.12 and glibc 2.39.
#
# CUDA: PyPI's torch 2.13.0 wheel is built for CUDA 13.0 and brings its CUDA 13 libraries (nvidia-*-cu13,
# cuda-toolkit 13.0) from the lock. The base image's toolkit must have the same CUDA major, or DeepSpeed refuses
# to JIT-build its ops (nvcc vs torch.version.cuda); a devel base, because DeepSpeed and Triton compile at run time.
# cuDNN comes with torch's wheels, so the base carries none. Host driver: one that supports CUDA 13 (>= 580).
#
# Build from the repository root (make images does this):
#   docker build -f docker/gpu.Dockerfile -t REG/klear-gpu:TAG .
#
# Code execution (gppo's code rewards, evaluate) needs from the node's kernel: Landlock ABI >= 6 (Linux >= 6.12,
# `landlock` in the LSM list) and seccomp-bpf; the container runtime's seccomp profile must allow the landlock_*
# syscalls. libseccomp2 is installed here. Without them the sandbox refuses to start.
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04

LABEL org.opencontainers.image.title="klear-gpu" \
      org.opencontainers.image.description="Klear-Reasoner pipeline: GPU stages (torch, DeepSpeed, TRL, vLLM)" \
      io.klear.cuda.major="13" \
      io.klear.sandbox.kernel="Linux >= 6.12: Landlock ABI >= 6 enabled, seccomp-bpf; runtime seccomp profile allowing landlock_* syscalls" \
      io.klear.sandbox.libraries="libseccomp2"

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive \
    CUDA_HOME=/usr/local/cuda

# python3-dev and build-essential: DeepSpeed's and Triton's run-time builds; libseccomp2: the sandbox's filter.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential git libseccomp2 \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
WORKDIR /opt/klear

# The locked set first, in its own layer: source edits do not reinstall it. PIP_CONSTRAINT holds every later pip
# and pip's isolated build environments (DeepSpeed is an sdist) to the same pins.
COPY docker/locks/gpu.txt docker/locks/gpu.txt
ENV PIP_CONSTRAINT=/opt/klear/docker/locks/gpu.txt
# DS_BUILD_OPS=0: DeepSpeed's ops are built at first use, against /usr/local/cuda, on a machine with a GPU.
RUN DS_BUILD_OPS=0 pip install --no-deps -r docker/locks/gpu.txt

# The project itself, without dependencies (the lock has them all); pip check proves the set is complete.
COPY pyproject.toml ./
COPY components ./components
RUN pip install --no-deps --no-build-isolation -c docker/locks/gpu.txt . && pip check

# KFP's launcher writes artifacts under /gcs, /minio and /s3: writable by any uid, like /tmp. Caches (Hugging
# Face, Triton, torch extensions, vLLM) go under the user's home. Ubuntu's image already has uid 1000 (ubuntu).
RUN mkdir -p /gcs /minio /s3 && chmod 1777 /gcs /minio /s3 \
    && useradd --uid 10001 --create-home --home-dir /home/klear --shell /usr/sbin/nologin klear
ENV HOME=/home/klear
USER 10001:10001

# The commit this image was built from, for the lineage every output records (klear.common.lineage); last, so a
# new commit rebuilds no layer above. make images passes it: --build-arg KLEAR_GIT_COMMIT=$(git rev-parse HEAD).
ARG KLEAR_GIT_COMMIT=
LABEL org.opencontainers.image.revision="$KLEAR_GIT_COMMIT"
ENV KLEAR_GIT_COMMIT=$KLEAR_GIT_COMMIT
