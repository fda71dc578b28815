"""Container images of the stages. Set KLEAR_IMAGE_REGISTRY / KLEAR_IMAGE_TAG when compiling for a cluster."""

import os

_REGISTRY = os.environ.get("KLEAR_IMAGE_REGISTRY", "klear").rstrip("/")
_TAG = os.environ.get("KLEAR_IMAGE_TAG", "0.1.0")

# CPU stages (curate, demo data): the package with its curate extra, no torch (docker/cpu.Dockerfile).
CPU_IMAGE = f"{_REGISTRY}/klear-cpu:{_TAG}"
# GPU stages (sample, sft, rl_filter, gppo, evaluate): CUDA, torch, vLLM, DeepSpeed (docker/gpu.Dockerfile).
GPU_IMAGE = f"{_REGISTRY}/klear-gpu:{_TAG}"
