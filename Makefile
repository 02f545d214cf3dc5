# gemma3-ray — the two commands: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TOOLS  := $(CURDIR)/.tools
# The only torch a CPU machine here installs from local disk; an unpinned torch pulls a CUDA build.
TORCH_CPU := torch==2.13.0
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
CHART := charts/gemma3-ray

export PATH := $(TOOLS)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export HELM  := $(TOOLS)/bin/helm
export HELM3 := $(TOOLS)/bin/helm3
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: help setup tools venv checkov apt-packages e2e-packages e2e-parts sync-trainer test lint demo e2e prereqs bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: tools venv checkov apt-packages  ## install everything tests and the demo need (project-local, idempotent)

tools: $(TOOLS)/bin/helm  ## pinned Helm 4 and Helm 3 into .tools/bin (sha256-verified)
$(TOOLS)/bin/helm: scripts/install-tools.sh
	scripts/install-tools.sh $(TOOLS)
	@touch $@

venv: $(VENV)/.stamp  ## .venv with CPU torch, the trainer's pinned runtime and the test deps
$(VENV)/.stamp: pyproject.toml trainer/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_CPU)
	grep -vE '^torch==' trainer/requirements.txt > $(VENV)/runtime-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/runtime-requirements.txt -e '.[test]' $(TORCH_CPU)
	@touch $@

checkov: $(CHECKOV_VENV)/.stamp  ## checkov in a venv of its own (it pins many packages)
$(CHECKOV_VENV)/.stamp:
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION)
	@touch $@

# Debian packages the tests run: etcd-server for the real kube-apiserver of tests/lifecycle
# (../shared/kube-apiserver); chromium (headless, with a font) renders report.html in tests/ and the
# README screenshot. apt-get runs only when one is missing.
APT_PACKAGES := etcd-server chromium fonts-dejavu-core
apt-packages:  ## Debian packages the tests need (apt-get install only what is missing)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "apt-get install $$missing"; \
	  $$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends $$missing; \
	fi

# What the local cluster of `make e2e` runs on (e2e/cluster/cluster.sh) and builds its images with (e2e/build/image.sh).
E2E_PACKAGES := containerd runc containernetworking-plugins iptables conntrack socat etcd-server openssl \
  mmdebstrap buildah umoci skopeo busybox-static gcc libc6-dev python3-yaml curl
e2e-packages:  ## Debian packages of the local e2e cluster (apt-get install only what is missing)
	@$(MAKE) --no-print-directory apt-packages APT_PACKAGES="$(E2E_PACKAGES)"

e2e-parts: e2e-packages  ## build the cluster's parts from their Go modules once per version (cache: ~/.cache/gemma3-ray)
	e2e/build/parts.sh build

sync-trainer:  ## the trainer's flags into the chart's `training:` schema (trainer/ is the chart's files/trainer)
	$(PY) -m scripts.sync_trainer_schema

lint: setup  ## ruff
	$(PY) -m ruff check .

# Two processes (pytest-xdist): a module's tests stay together (tests/conftest.py); TEST_WORKERS=0 runs one.
TEST_WORKERS ?= 2
test: setup  ## the test suite (offline; CPU)
	$(PY) -m ruff check .
	CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=10 tests

# With KUBECONFIG: only helm (tools) and ct (on PATH, else built from its Go module); no apt, no root,
# no cluster parts. Without: the local cluster's packages and parts (e2e/README.md).
e2e: tools venv  ## the chart on a real cluster: $$KUBECONFIG (E2E_VALUES, E2E_STORAGE_IMAGE), else a local one-node cluster of real parts
	@if [ -n "$$KUBECONFIG" ]; then command -v ct >/dev/null || e2e/build/parts.sh build ct; \
	elif [ "$$(id -u)" != 0 ] || [ "$$(uname -s)" != Linux ]; then \
	  echo "make e2e: the local cluster needs root on Linux (containerd, the kubelet, iptables); set KUBECONFIG to run against another cluster" >&2; exit 2; \
	else $(MAKE) --no-print-directory e2e-parts; fi
	$(PY) -m e2e $(ARGS)

# DEMO_START is read when make starts, so the demo's "make demo total" includes the installs.
demo: export DEMO_START := $(shell date +%s.%N)
demo: tools venv  ## the chart's own RayJob, end to end, on a local Ray cluster (ARGS='--max_steps=10')
	$(PY) -m demo $(ARGS)

prereqs: venv  ## plan the GCP prerequisites (nothing changed); APPLY=1 creates them (--apply)
	$(VENV)/bin/gemma3-ray prereqs $(if $(APPLY),--apply,) $(ARGS)

helm-plugin: tools  ## install the Helm plugin as `helm gemma3-ray` (Helm 3 and 4, honours HELM_PLUGINS)
	scripts/install-helm-plugin.sh

GROUP ?= headline
bench:  ## on the GPU machine: one group of bench/scenarios.toml (GROUP=headline|workloads|kernels), checked (bench/README.md)
	python3 -m bench.call $(GROUP)

clean:  ## remove local installs and caches
	rm -rf $(VENV) $(CHECKOV_VENV) $(TOOLS) .cache .pytest_cache
