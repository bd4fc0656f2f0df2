# sm-horovod: distributed TensorFlow + Horovod training image for SageMaker.
# `make` (or `make help`) lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

IMAGE      ?= sm-horovod
FLAVOR     ?= gpu
BASE_IMAGE ?= sm-horovod-base:bookworm
# A CA bundle for a TLS-intercepting proxy, passed to the build as a BuildKit secret.
CA_BUNDLE  ?=
# Any docker client with BuildKit: one with buildx, or a pre-23 client (DOCKER_BUILDKIT=1).
# `make smoke` and `make test` set the machine up first (docker/setup-docker.sh: installs and
# starts Docker where none answers, as root on Debian/Ubuntu) and pick such a client themselves
# unless DOCKER= is given, in which case it is checked.
ifneq ($(filter smoke test,$(MAKECMDGOALS)),)
DOCKER_SETUP := $(shell DOCKER='$(if $(filter undefined,$(origin DOCKER)),,$(DOCKER))' docker/setup-docker.sh)
$(if $(DOCKER_SETUP),,$(error docker/setup-docker.sh found no usable Docker (see its messages above)))
DOCKER := $(DOCKER_SETUP)
endif
DOCKER     ?= docker
PYTHON     ?= python3
VENV       ?= .venv
REGISTRY   ?=
REGION     ?=
STACK      ?=
REPOSITORY ?= $(IMAGE)
IMMUTABLE  ?=
BUCKET     ?=
ARGS       ?=
PYTEST_ARGS ?=

GIT_SHA := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
TAG     ?= $(FLAVOR)
PY      := $(VENV)/bin/python

, := ,
BUILD_SECRET := $(if $(CA_BUNDLE),--secret id=ca$(,)src=$(CA_BUNDLE),)

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: FLAVOR=gpu|cpu IMAGE=$(IMAGE) TAG=<FLAVOR> BASE_IMAGE=$(BASE_IMAGE)"
	@echo "           CA_BUNDLE=<path> DOCKER=$(DOCKER) REGISTRY=host:port REGION= STACK= BUCKET= ARGS="

# ---------------------------------------------------------------------------------------------
# Image

.PHONY: check-docker
check-docker:
	@$(DOCKER) info >/dev/null 2>&1 || { echo "error: no Docker engine answers '$(DOCKER) info'" >&2; exit 1; }
	@if ! $(DOCKER) buildx version >/dev/null 2>&1; then \
	    major=$$($(DOCKER) version --format '{{.Client.Version}}' | cut -d. -f1); \
	    if [ "$$major" -ge 23 ]; then \
	        echo "error: '$(DOCKER)' has no buildx and is too new for DOCKER_BUILDKIT=1;" \
	             "install docker-buildx or set DOCKER= to a BuildKit-capable client" >&2; exit 1; \
	    fi; \
	fi

.PHONY: base
base: check-docker ## Build the Debian base image from Debian's packages (no registry needed)
	@if [ "$(BASE_IMAGE)" != "sm-horovod-base:bookworm" ]; then \
	    echo "base: BASE_IMAGE=$(BASE_IMAGE) is used as is"; \
	elif $(DOCKER) image inspect $(BASE_IMAGE) >/dev/null 2>&1; then \
	    echo "base: $(BASE_IMAGE) exists"; \
	else \
	    DOCKER=$(DOCKER) docker/build-base.sh $(BASE_IMAGE) bookworm; \
	fi

.PHONY: build
build: base ## Build IMAGE:FLAVOR and IMAGE:FLAVOR-<git sha> (FLAVOR=gpu|cpu)
	@case "$(FLAVOR)" in gpu|cpu|torch|torch-cpu) ;; *) echo "error: FLAVOR must be gpu, cpu, torch or torch-cpu" >&2; exit 2;; esac
	if $(DOCKER) buildx version >/dev/null 2>&1; then \
	    build="$(DOCKER) buildx build --load"; \
	else \
	    build="env DOCKER_BUILDKIT=1 $(DOCKER) build"; \
	fi; \
	$$build --progress=plain \
	    --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg FLAVOR=$(FLAVOR) $(BUILD_SECRET) \
	    --tag $(IMAGE):$(TAG) --tag $(IMAGE):$(FLAVOR)-$(GIT_SHA) .
	@echo "built $(IMAGE):$(TAG) and $(IMAGE):$(FLAVOR)-$(GIT_SHA)"

.PHONY: push
push: venv ## Push IMAGE:FLAVOR-<sha> and :FLAVOR to ECR (or REGISTRY=host:port); prints the URI
	$(PY) -m launch push --image $(IMAGE) --flavor $(FLAVOR) --docker "$(DOCKER)" \
	    --repository $(REPOSITORY) $(if $(REGISTRY),--registry $(REGISTRY)) \
	    $(if $(REGION),--region $(REGION)) $(if $(IMMUTABLE),--immutable-tags)

# ---------------------------------------------------------------------------------------------
# Run and test

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with the test, lint and launcher tools
$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

.PHONY: smoke
smoke: venv ## Train the built-in model on digits in one container, as SageMaker would
	@$(DOCKER) image inspect $(IMAGE):cpu >/dev/null 2>&1 || $(MAKE) build FLAVOR=cpu DOCKER=$(DOCKER)
	$(PY) -m tests.smoke --image $(IMAGE):cpu --docker $(DOCKER) --workdir build/smoke

# `make serve MODEL_DIR=build/smoke/hosts/algo-1/model`: what SageMaker's `docker run IMAGE serve`
# does, on this machine (SERVE_ENV="-e SM_SERVE_MAX_BATCH_SIZE=64" passes settings).
MODEL_DIR  ?=
SERVE_PORT ?= 8080
SERVE_ENV  ?=

.PHONY: serve
serve: ## Serve MODEL_DIR (a training job's /opt/ml/model) in the CPU image on SERVE_PORT (8080)
	@test -n "$(MODEL_DIR)" || { echo "error: MODEL_DIR= is required (a folder with 1/saved_model.pb and classes.json)" >&2; exit 2; }
	@test -d "$(MODEL_DIR)" || { echo "error: MODEL_DIR=$(MODEL_DIR) is not a folder" >&2; exit 2; }
	@$(DOCKER) image inspect $(IMAGE):cpu >/dev/null 2>&1 || $(MAKE) build FLAVOR=cpu
	$(DOCKER) run --rm --publish 127.0.0.1:$(SERVE_PORT):8080 \
	    --volume "$(abspath $(MODEL_DIR))":/opt/ml/model:ro $(SERVE_ENV) $(IMAGE):cpu serve

.PHONY: test
test: venv ## Run every test: unit tests, then the cluster tests on the CPU and torch-cpu images
	$(MAKE) build FLAVOR=cpu DOCKER=$(DOCKER)
	$(MAKE) build FLAVOR=torch-cpu DOCKER=$(DOCKER)
	SM_IMAGE=$(IMAGE):cpu SM_TORCH_IMAGE=$(IMAGE):torch-cpu DOCKER=$(DOCKER) \
	    $(PY) -m pytest $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## Run the unit tests only (no Docker)
	$(PY) -m pytest -m "not docker" $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff, hadolint, cfn-lint and checkov
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/cfn-lint --include-checks I --custom-rules cfn/custom-rules.txt -- cfn/*.yaml
	$(VENV)/bin/checkov -d cfn --quiet --compact --framework cloudformation --skip-download

# ---------------------------------------------------------------------------------------------
# AWS

.PHONY: stack
stack: venv ## Deploy the CloudFormation stack (STACK, REGION, BUCKET; ARGS="--create-fsx true")
	@test -n "$(BUCKET)" || { echo "error: BUCKET= is required (an existing bucket in REGION)" >&2; exit 2; }
	$(PY) -m cfn.deploy deploy --stack $(or $(STACK),sm-horovod) --bucket $(BUCKET) $(if $(REGION),--region $(REGION)) $(ARGS)

.PHONY: stack-delete
stack-delete: venv ## Delete the CloudFormation stack (STACK, REGION); the EFS file system is kept
	$(PY) -m cfn.deploy delete --stack $(or $(STACK),sm-horovod) $(if $(REGION),--region $(REGION))

.PHONY: train
train: venv ## Launch a SageMaker job from the image pushed at HEAD (ARGS="--instance-count 2 --dry-run")
	$(PY) -m launch train --flavor $(FLAVOR) --repository $(REPOSITORY) \
	    $(if $(STACK),--stack $(STACK)) $(if $(REGION),--region $(REGION)) $(ARGS)

# ---------------------------------------------------------------------------------------------
# Benchmarks

.PHONY: bench
bench: venv ## Measure overhead, faults, allreduce, input pipeline; then 4-128 hosts (bench.scale)
	$(PY) -m bench --image $(IMAGE):cpu --docker $(DOCKER) --out bench/results
	DOCKER=$(DOCKER) $(PY) -m bench.scale --image $(IMAGE):cpu --out bench/results

.PHONY: bench-quick
bench-quick: venv ## A 3-minute pass over every benchmark (1 run, 2 hosts), results to build/bench
	$(PY) -m bench --quick --image $(IMAGE):cpu --docker $(DOCKER) --out build/bench

.PHONY: clean
clean: ## Remove the venv and generated files
	rm -rf $(VENV) build .pytest_cache .ruff_cache
