# Image of the GPU stages (sft, gppo; later sample, rl_filter, evaluate). One pinned, mutually
# compatible set: vLLM 0.31 needs torch 2.13 and transformers < 5.18; TRL 1.16 supports vLLM 0.22-0.31.
# PyPI's torch 2.13.0 wheel for Linux is the CUDA build. A devel base: DeepSpeed JIT-compiles its ops.
# Build from the repository root: docker build -f docker/gpu.Dockerfile -t $KLEAR_IMAGE_REGISTRY/klear-gpu:$TAG .
FROM nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git libseccomp2 \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/klear
COPY pyproject.toml README.md ./
COPY components ./components
# constraints.txt pins the CPU torch build for CI; the GPU image takes PyPI's CUDA build of the same release.
RUN pip install torch==2.13.0 && pip install '.[gppo,pipeline,curate]' vllm==0.31.0
