# Image of the CPU stages (curate, demo data): the package with its curate extra and kfp, no torch.
# Build from the repository root: docker build -f docker/cpu.Dockerfile -t $KLEAR_IMAGE_REGISTRY/klear-cpu:$TAG .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/klear
COPY pyproject.toml constraints.txt README.md ./
COPY components ./components
# kfp is baked in: components compile with install_kfp_package=False.
RUN pip install -c constraints.txt '.[curate,pipeline]'
RUN useradd --create-home --uid 1000 klear
USER 1000
