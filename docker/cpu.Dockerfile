# syntax=docker/dockerfile:1
# Image of the CPU stages: curate, judge, sft-data, rl-filter, evaluate's scoring, the demo's data, and the
# pipeline-upload Job of the Helm chart (the compiled pipelines are baked in, compiled for this registry and tag).
# No torch. Every package comes from docker/locks/cpu.txt (make lock), resolved for this base's Python and glibc.
#
# Build from the repository root (make images does this):
#   docker build -f docker/cpu.Dockerfile --build-arg KLEAR_IMAGE_REGISTRY=REG --build-arg KLEAR_IMAGE_TAG=TAG \
#     -t REG/klear-cpu:TAG .
#
# Code execution (judge, rl-filter, evaluate run model-written programs) needs from the node's kernel: Landlock
# ABI >= 6 (Linux >= 6.12, `landlock` in the LSM list) and seccomp-bpf; the container runtime's seccomp profile
# must allow the landlock_* syscalls. libseccomp2 is installed here. Without them the sandbox refuses to start.
FROM python:3.11-slim-bookworm

ARG KLEAR_IMAGE_REGISTRY=klear
ARG KLEAR_IMAGE_TAG=0.1.0

LABEL org.opencontainers.image.title="klear-cpu" \
      org.opencontainers.image.description="Klear-Reasoner pipeline: CPU stages and compiled pipelines" \
      io.klear.sandbox.kernel="Linux >= 6.12: Landlock ABI >= 6 enabled, seccomp-bpf; runtime seccomp profile allowing landlock_* syscalls" \
      io.klear.sandbox.libraries="libseccomp2"

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# libseccomp2: the sandbox's seccomp filter (pyseccomp loads it with ctypes).
RUN apt-get update && apt-get install -y --no-install-recommends libseccomp2 \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
WORKDIR /opt/klear

# The locked set first, in its own layer: source edits do not reinstall it. PIP_CONSTRAINT holds every later pip
# (and pip's isolated build environments) to the same pins.
COPY docker/locks/cpu.txt docker/locks/cpu.txt
ENV PIP_CONSTRAINT=/opt/klear/docker/locks/cpu.txt
RUN pip install --no-deps -r docker/locks/cpu.txt

# The project itself, without dependencies (the lock has them all); pip check proves the set is complete.
COPY pyproject.toml ./
COPY components ./components
RUN pip install --no-deps --no-build-isolation -c docker/locks/cpu.txt . && pip check

# Compiled here, for the registry and tag these images are pushed under, so the pipelines the upload Job sends
# to KFP always name images that exist.
COPY pipelines ./pipelines
RUN KLEAR_IMAGE_REGISTRY="$KLEAR_IMAGE_REGISTRY" KLEAR_IMAGE_TAG="$KLEAR_IMAGE_TAG" \
    python -m pipelines.compile --output-dir /opt/klear/pipelines/compiled

# KFP's launcher writes artifacts under /gcs, /minio and /s3: writable by any uid, like /tmp.
RUN mkdir -p /gcs /minio /s3 && chmod 1777 /gcs /minio /s3 \
    && useradd --uid 10001 --create-home --home-dir /home/klear --shell /usr/sbin/nologin klear
ENV HOME=/home/klear
USER 10001:10001

# The commit this image was built from, for the lineage every output records (klear.common.lineage); last, so a
# new commit rebuilds no layer above. make images passes it: --build-arg KLEAR_GIT_COMMIT=$(git rev-parse HEAD).
ARG KLEAR_GIT_COMMIT=
LABEL org.opencontainers.image.revision="$KLEAR_GIT_COMMIT"
ENV KLEAR_GIT_COMMIT=$KLEAR_GIT_COMMIT
