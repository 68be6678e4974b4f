# batchfill developer entry points. `make demo` runs the main job, `make test` the whole suite (what CI runs).
# Both install what they need first (idempotent): a virtualenv in .venv, the Python packages (Triton itself
# comes from the nvidia-pytriton wheel), and the Debian packages the real components need.

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.batchfill-setup
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages: python3.11 with venv (ensurepip), libpython3.11, which the Triton Python-backend stub
# shipped in nvidia-pytriton links against, and Prometheus 2.42, the real server the metrics tests scrape with.
# The dev cluster's real nodes (`dev-cluster up --real-nodes N`, tests/cluster/test_real_node.py): containerd,
# runc, the CNI plugins, iproute2 and iptables (the kubelet's and the CNI plugins' rules, inside the node's
# namespace), openssl (certificates). The local Triton image (scripts/build-triton-image.sh):
# debootstrap, umoci, skopeo; the nodes' pause and test-pod image: busybox-static.
DEB_PACKAGES := python3.11 python3.11-venv libpython3.11 prometheus debootstrap \
	containerd runc containernetworking-plugins iproute2 iptables umoci skopeo busybox-static openssl

.PHONY: setup tools test lint demo serve plan image-check clean-venv
.DEFAULT_GOAL := test

$(STAMP): pyproject.toml Makefile
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing the Python packages into $(VENV) (first time: 1-3 minutes; the virtualenv takes ~1.1 GB)"
	$(BIN)/python -m pip install -q --upgrade pip
	# dev: the base, the simulate and testbed extras (matplotlib; tritonserver, onnxruntime) and the test tools.
	$(BIN)/python -m pip install -q -e '.[dev]'
	# Trained OCR weights for the real example model; --no-deps keeps OpenCV & co. out (only the .onnx files are used).
	$(BIN)/python -m pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	@touch $@

setup: $(STAMP)

# The real Kubernetes control plane (etcd, kube-apiserver, scheduler, controller-manager, kubectl, kwok) and
# helm, built from Go modules into ${BATCHFILL_K8S_CACHE:-~/.cache/batchfill/k8s} (outside the repo; rebuilt only
# when missing).
# A cold build takes 12-25 minutes on 2 cores (751 and 917 s idle, 756 and 1,502 s on a busy machine). The fake-GPU device plugin (tools/fake-gpu-plugin/) is
# rebuilt there whenever its source changes (seconds).
tools:
	scripts/build-k8s.sh
	scripts/build-helm.sh
	scripts/build-fake-gpu-plugin.sh

# The whole test suite: unit, property, static checks (ruff, mypy, import-linter run as tests), the
# component tests against the real tritonserver, and the cluster tests against the real control plane; the 40
# slowest tests are listed at the end (CI's time budget is 90 minutes).
test: $(STAMP) tools
	$(BIN)/pytest --durations=40

# The main job: local control plane with a real node (kubelet + containerd, fake GPUs from a device plugin),
# the operator, the example BatchedModel served by its real Triton pods under Poisson load through the Service,
# a real Prometheus. Builds the control plane, kubelet, device plugin and Triton image first when missing.
# `make demo KWOK=1`: the kwok variant (fake GPU nodes, one local tritonserver per Ready kwok pod).
demo: $(STAMP)
	$(BIN)/batchfill demo $(if $(KWOK),,--real-nodes)

# One real tritonserver without Kubernetes: measure the example model, plan, serve at 90 % of capacity.
serve: $(STAMP)
	$(BIN)/batchfill serve examples/ocr-recognizer.yaml

plan: $(STAMP)
	$(BIN)/batchfill plan examples/seed-example.yaml --rps 500

# The operator image's package set (the Dockerfile's `pip install` line) in a fresh venv, without Docker: the
# operator's commands work and no test bed or matplotlib is installed (one to two minutes).
image-check: $(STAMP)
	$(BIN)/python scripts/check_operator_image.py --python $(PYTHON)

clean-venv:
	rm -rf $(VENV)
