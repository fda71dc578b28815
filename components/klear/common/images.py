"""Container images of the stages. Set KLEAR_IMAGE_REGISTRY / KLEAR_IMAGE_TAG when compiling for a cluster."""

import os

_REGISTRY = os.environ.get("KLEAR_IMAGE_REGISTRY", "klear").rstrip("/")
_TAG = os.environ.get("KLEAR_IMAGE_TAG", "0.1.0")

# Which stage runs on which image: klear.cli.STAGES (tests/layout/test_stages.py checks each component's base_image).
# CPU stages, the digest step and the training launcher's sizing step: no torch (docker/cpu.Dockerfile).
CPU_IMAGE = f"{_REGISTRY}/klear-cpu:{_TAG}"
# GPU stages: CUDA, torch, vLLM, DeepSpeed (docker/gpu.Dockerfile).
GPU_IMAGE = f"{_REGISTRY}/klear-gpu:{_TAG}"
