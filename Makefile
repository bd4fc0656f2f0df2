# sm-horovod: distributed TensorFlow + Horovod training image for SageMaker.
# `make` (or `make help`) lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

IMAGE      ?= sm-horovod
FLAVOR     ?= gpu
BASE_IMAGE ?= sm-horovod-base:bookworm
# The CA bundle the build's package downloads trust, passed as a BuildKit secret (never a
# layer): this machine's system bundle where there is one, so a TLS-intercepting proxy that the
# machine trusts works as is. CA_BUNDLE= (empty) builds with the image's own bundle.
CA_BUNDLE  ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem))
# Any docker client with BuildKit: one with buildx, or a pre-23 client (DOCKER_BUILDKIT=1).
# Unless DOCKER= is given, the first such client on PATH, picked once when a recipe first needs
# it: after `make setup` (a prerequisite of smoke and test) has installed one where none was.
DOCKER_GIVEN := $(if $(filter undefined,$(origin DOCKER)),,$(DOCKER))
ifeq ($(DOCKER_GIVEN),)
DOCKER = $(eval DOCKER := $(or $(shell docker/setup-docker.sh --pick-client 2>/dev/null),docker))$(DOCKER)
endif
PYTHON     ?= python3
VENV       ?= .venv
# The SageMaker Python SDK v3's own venv (requirements-sdk3.txt): v3 and the v2 `sagemaker` of
# requirements-dev.txt cannot share one.
SDK3_VENV  ?= .venv-sdk3
REGISTRY   ?=
REGION     ?=
STACK      ?=
REPOSITORY ?= $(IMAGE)
IMMUTABLE  ?=
BUCKET     ?=
ARGS       ?=
PYTEST_ARGS ?=
# Processes the docker tests run in (pytest-xdist): they mostly wait (stall timeouts, container
# starts, jobs of sleeping ranks), so two share a 2-core machine well; 1 runs them in order.
# Those marked `alone` (a bound on time that the other process's work would stretch) run after
# them, one at a time.
DOCKER_TEST_WORKERS ?= 2
# The images `make facts` measures (those not built here are left as last measured).
FACT_IMAGES ?= $(IMAGE):cpu,$(IMAGE):tf2.21-cpu,$(IMAGE):torch-cpu,$(IMAGE):gpu,$(IMAGE):tf2.21,$(IMAGE):torch

GIT_SHA := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
TAG     ?= $(FLAVOR)
PY      := $(VENV)/bin/python

, := ,
BUILD_SECRET := $(if $(CA_BUNDLE),--secret id=ca$(,)src=$(CA_BUNDLE),)
BUILD_LOG    ?= build/docker-build.log
# What a download failing on an untrusted certificate prints: pip, apt and curl.
CERT_ERRORS  := certificate verify failed|certificate verification failed|SSL certificate problem

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: FLAVOR=gpu|cpu|tf2.21|tf2.21-cpu|torch|torch-cpu IMAGE=$(IMAGE) TAG=<FLAVOR> BASE_IMAGE=$(BASE_IMAGE)"
	@echo "           CA_BUNDLE=$(or $(CA_BUNDLE),<path>) DOCKER=$(DOCKER) REGISTRY=host:port REGION= STACK= BUCKET= ARGS="

# ---------------------------------------------------------------------------------------------
# Image

.PHONY: setup
setup: ## Install and start Docker where missing (root on Debian/Ubuntu), check the client
	DOCKER='$(DOCKER_GIVEN)' docker/setup-docker.sh >/dev/null

.PHONY: check-docker
check-docker:
	@$(DOCKER) info >/dev/null 2>&1 || { echo "error: no Docker engine answers '$(DOCKER) info':" \
	    "start Docker, or run 'make setup' (installs and starts it as root on Debian/Ubuntu)" >&2; exit 1; }
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
build: base ## Build IMAGE:FLAVOR and IMAGE:FLAVOR-<git sha> (FLAVOR=gpu|cpu|tf2.21|tf2.21-cpu|torch|torch-cpu)
	@case "$(FLAVOR)" in gpu|cpu|tf2.21|tf2.21-cpu|torch|torch-cpu) ;; *) echo "error: FLAVOR must be gpu, cpu, tf2.21, tf2.21-cpu, torch or torch-cpu" >&2; exit 2;; esac
	if $(DOCKER) buildx version >/dev/null 2>&1; then \
	    build="$(DOCKER) buildx build --load"; \
	else \
	    build="env DOCKER_BUILDKIT=1 $(DOCKER) build"; \
	fi; \
	mkdir -p $(dir $(BUILD_LOG)); \
	$$build --progress=plain \
	    --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg FLAVOR=$(FLAVOR) $(BUILD_SECRET) \
	    --tag $(IMAGE):$(TAG) --tag $(IMAGE):$(FLAVOR)-$(GIT_SHA) . 2>&1 | tee $(BUILD_LOG) \
	|| { status=$$?; ! grep -qiE '$(CERT_ERRORS)' $(BUILD_LOG) \
	    || echo "error: a download in the build did not trust the TLS certificate it got" \
	        "(CA_BUNDLE=$(or $(CA_BUNDLE),none)): set CA_BUNDLE=<your proxy's CA bundle, PEM>" >&2; \
	    exit $$status; }
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
# `make smoke` and `make test` record their own wall time when they pass (build/facts/;
# `make facts` renders it).
smoke: setup venv ## Train the built-in model on digits in one container, as SageMaker would
	@$(PY) -m bench.facts start smoke
	@$(DOCKER) image inspect $(IMAGE):cpu >/dev/null 2>&1 || $(MAKE) build FLAVOR=cpu DOCKER=$(DOCKER)
	$(PY) -m tests.smoke --image $(IMAGE):cpu --docker $(DOCKER) --workdir build/smoke
	@$(PY) -m bench.facts finish smoke

# `make serve MODEL_DIR=build/smoke/hosts/algo-1/model`: what SageMaker's `docker run IMAGE serve`
# does, on this machine (SERVE_ENV="-e SM_SERVE_MAX_BATCH_SIZE=64" passes settings).
MODEL_DIR  ?=
SERVE_PORT ?= 8080
SERVE_ENV  ?=

.PHONY: serve
serve: ## Serve MODEL_DIR (a training job's /opt/ml/model) in the CPU image on SERVE_PORT (8080)
	@test -n "$(MODEL_DIR)" || { echo "error: MODEL_DIR= is required (a folder with <version>/saved_model.pb, or <name>/<version>/saved_model.pb)" >&2; exit 2; }
	@test -d "$(MODEL_DIR)" || { echo "error: MODEL_DIR=$(MODEL_DIR) is not a folder" >&2; exit 2; }
	@$(DOCKER) image inspect $(IMAGE):cpu >/dev/null 2>&1 || $(MAKE) build FLAVOR=cpu
	$(DOCKER) run --rm --publish 127.0.0.1:$(SERVE_PORT):8080 \
	    --volume "$(abspath $(MODEL_DIR))":/opt/ml/model:ro $(SERVE_ENV) $(IMAGE):cpu serve

.PHONY: venv-sdk3
venv-sdk3: $(SDK3_VENV)/.installed ## Create .venv-sdk3 with the SageMaker Python SDK v3
$(SDK3_VENV)/.installed: requirements-sdk3.txt
	$(PYTHON) -m venv $(SDK3_VENV)
	$(SDK3_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-sdk3.txt
	touch $@

.PHONY: test
# The unit tests run first and stop the run on a failure, before any image is built; each
# pytest run keeps its per-test durations in build/test-results/ (junit XML). Tests marked
# `bench` check the benchmark's own parts: `make bench` runs them (bench-preflight).
# The TensorFlow 2.21 line's tests (tests/test_tf221_docker.py) read its image from SM_IMAGE_TF221.
test: setup venv venv-sdk3 ## Run every test: unit tests, then the cluster tests on the CPU images
	@$(PY) -m bench.facts start test
	$(PY) -m pytest -m "not docker" --junitxml=build/test-results/unit.xml $(PYTEST_ARGS)
	$(MAKE) build FLAVOR=cpu DOCKER=$(DOCKER)
	$(MAKE) build FLAVOR=torch-cpu DOCKER=$(DOCKER)
	$(MAKE) build FLAVOR=tf2.21-cpu DOCKER=$(DOCKER)
	SM_IMAGE=$(IMAGE):cpu SM_TORCH_IMAGE=$(IMAGE):torch-cpu SM_IMAGE_TF221=$(IMAGE):tf2.21-cpu \
	    DOCKER=$(DOCKER) \
	    SDK3_PYTHON=$(abspath $(SDK3_VENV))/bin/python \
	    $(PY) -m pytest -m "docker and not bench and not alone" -n $(DOCKER_TEST_WORKERS) \
	    --dist loadgroup --junitxml=build/test-results/docker.xml $(PYTEST_ARGS)
	SM_IMAGE=$(IMAGE):cpu SM_TORCH_IMAGE=$(IMAGE):torch-cpu SM_IMAGE_TF221=$(IMAGE):tf2.21-cpu \
	    DOCKER=$(DOCKER) \
	    SDK3_PYTHON=$(abspath $(SDK3_VENV))/bin/python \
	    $(PY) -m pytest -m "docker and not bench and alone" \
	    --junitxml=build/test-results/docker-alone.xml $(PYTEST_ARGS)
	@$(PY) -m bench.facts finish test

.PHONY: test-unit
test-unit: venv ## Run the unit tests only (no Docker)
	$(PY) -m pytest -m "not docker" --junitxml=build/test-results/unit.xml $(PYTEST_ARGS)

.PHONY: facts
facts: venv ## Measure the images' sizes, render them and the recorded smoke/test times; refresh the docs' tables
	$(PY) -m bench.facts render --docker $(DOCKER) --images $(FACT_IMAGES) --out bench/results
	$(PY) -m bench.docs

.PHONY: lint
lint: venv ## ruff, mypy, hadolint, cfn-lint and checkov
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
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

# The benchmark's own parts (its peers, in <IMAGE>-peers: tests marked `bench`) are checked
# before it measures anything, not by `make test`: nothing of the product is proven there, and
# their image is rebuilt after every change to the CPU image.
.PHONY: bench-preflight
bench-preflight: venv ## Check the benchmark's own parts (the serving peers answer right)
	SM_IMAGE=$(IMAGE):cpu DOCKER=$(DOCKER) CA_BUNDLE='$(CA_BUNDLE)' \
	    $(PY) -m pytest -m bench --junitxml=build/test-results/bench.xml $(PYTEST_ARGS)

.PHONY: bench
bench: venv bench-preflight ## Measure overhead, faults, allreduce, input pipeline, torch; then 4-64 hosts (bench.scale)
	CA_BUNDLE='$(CA_BUNDLE)' $(PY) -m bench --image $(IMAGE):cpu --torch-image $(IMAGE):torch-cpu --docker $(DOCKER) \
	    --out bench/results
	DOCKER=$(DOCKER) $(PY) -m bench.scale --image $(IMAGE):cpu --out bench/results

.PHONY: bench-quick
bench-quick: venv bench-preflight ## An 8-minute pass over every benchmark (1 run, 2 hosts), results to build/bench
	CA_BUNDLE='$(CA_BUNDLE)' $(PY) -m bench --quick --image $(IMAGE):cpu --torch-image $(IMAGE):torch-cpu \
	    --docker $(DOCKER) --out build/bench

.PHONY: clean
clean: ## Remove the venv and generated files
	rm -rf $(VENV) $(SDK3_VENV) build .pytest_cache .ruff_cache .mypy_cache
