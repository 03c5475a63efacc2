# gpupipe: `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt
RUN_DIR ?= .runs/demo
DEMO_DATA ?= .runs/data/churn.parquet
TRAINER_DEMO_DIR ?= .runs/trainer-demo
NPROC ?= 2
RUN_ARGS ?= --param epochs=10
PYTEST_ARGS ?=
# PyTorch's CPU wheel. PyPI's Linux torch is the CUDA build (~3.5 GB with its NVIDIA wheels); the
# project's machines keep torch==2.13.0+cpu in ../shared/wheels. pip looks there first (the +cpu
# build sorts above PyPI's 2.13.0), for the venv here and for the CPU image (hack/build-images.sh
# serves the wheel it finds in PIP_FIND_LINKS to the image build).
GPUPIPE_WHEELS ?= $(abspath ../shared/wheels)
export PIP_FIND_LINKS := $(strip $(wildcard $(GPUPIPE_WHEELS)) $(PIP_FIND_LINKS))

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	@echo ">> installing gpupipe and its dev dependencies into $(VENV) (constraints.txt)"
	$(PIP_INSTALL) -e '.[dev]'
	@touch $@

.PHONY: setup
setup: $(VENV)/.installed ## create .venv and install everything (pinned by constraints.txt)

.PHONY: run
run: setup ## set up, make demo data, run the whole pipeline locally (kfp.local), print a summary
	$(BIN)/gpupipe demo-data --out $(DEMO_DATA) --rows 10000
	$(BIN)/gpupipe run --local --root $(RUN_DIR) --data $(DEMO_DATA) \
	    --target churned $(RUN_ARGS)

.PHONY: train-demo
train-demo: setup ## only the trainer: demo table, torchrun with $(NPROC) local processes (gloo)
	$(BIN)/python -m trainer.demo --out $(TRAINER_DEMO_DIR)
	$(BIN)/python -m trainer.launch --standalone --nproc_per_node=$(NPROC) \
	    -m trainer.worker --config $(TRAINER_DEMO_DIR)/config.json
	$(BIN)/python -m trainer.demo --summarize $(TRAINER_DEMO_DIR)

.PHONY: compile
compile: setup ## the golden files: pipelines and components compiled to YAML, and docs/reference/
	$(BIN)/gpupipe compile
	$(BIN)/python -m pipelines.reference

.PHONY: lock
lock: ## the images' hashed lock files (pip install --require-hashes) from constraints.txt and the add-ons' pins
	hack/lock-images.sh

# The documentation site (mkdocs.yml). --strict: a broken link, a missing page or anchor, or a
# missing included file fails the build. NO_MKDOCS_2_WARNING: Material's banner about its future.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: docs
docs: setup ## build the documentation site into site/ (docs/reference/ regenerated first; strict)
	$(BIN)/python -m pipelines.reference
	$(MKDOCS) build --strict

# The pictures: the pipeline's graph from the compiled YAML, a report's plots from a real local run
# of the demo table (as make run's). Committed in docs/images/; run again when either changes.
DOCS_RUN ?= .runs/docs-images

.PHONY: docs-images
docs-images: setup ## the docs' pictures from the real things: the pipeline's graph, the layers, a run's report plots
	$(BIN)/gpupipe demo-data --out $(DOCS_RUN)/churn.parquet --rows 10000
	$(BIN)/gpupipe run --local --root $(DOCS_RUN)/root --data $(DOCS_RUN)/churn.parquet \
	    --target churned $(RUN_ARGS) --json > $(DOCS_RUN)/summary.json
	$(BIN)/python -m pipelines.pictures --summary $(DOCS_RUN)/summary.json docs/images

UI_SHOTS ?= .runs/ui-screenshots
UI_PICTURES = run-graph run-evaluate-plots recurring-runs create-run-form-baked-defaults

.PHONY: docs-ui-images
docs-ui-images: setup ## the README's KFP UI pictures, taken from the real UI by its tests (needs make cluster-up)
	rm -rf $(UI_SHOTS)
	GPUPIPE_UI_SCREENSHOTS=$(abspath $(UI_SHOTS)) $(BIN)/pytest -m cluster -p no:cacheprovider \
	    tests/cluster/test_kfp_ui.py -k "created_in_the_ui or recurring_run_made_in_the_ui or versions_defaults_registers"
	@for name in $(UI_PICTURES); do \
	    test -f $(UI_SHOTS)/ui-$$name.png || { echo "ERROR [docs-ui-images] the UI tests saved no ui-$$name.png in $(UI_SHOTS) (did they skip? make cluster-up, hack/chromium.sh)" >&2; exit 2; }; \
	    cp $(UI_SHOTS)/ui-$$name.png docs/images/kfp-ui-$$name.png; \
	done

.PHONY: docs-serve
docs-serve: setup ## serve the documentation on http://127.0.0.1:8000, rebuilt on every change
	$(BIN)/python -m pipelines.reference
	$(MKDOCS) serve

.PHONY: test
test: setup ## set up and run the test suite (unit + integration; no GPU, no cluster, no Docker)
	$(BIN)/pytest -m "not e2e and not slow and not containers and not cluster and not teardown" --durations=15 $(PYTEST_ARGS)

.PHONY: test-slow
test-slow: setup ## the tests that run the pipeline into training, too slow for make test (.ci/run runs them after it)
	$(BIN)/pytest -m "slow and not e2e and not containers and not cluster and not teardown" $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: setup ## only the fast unit tests
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

.PHONY: test-all
test-all: setup ## every test, slow ones too (GPU and cluster tests skip where absent)
	$(BIN)/pytest $(PYTEST_ARGS)

.PHONY: lint
lint: setup ## ruff (lint + format check), mypy on trainer/, hadolint, shellcheck, the strict docs build
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint images/*/Dockerfile
	$(BIN)/shellcheck -x hack/*.sh hack/cluster/*.sh $(wildcard hack/cluster/addons/*.sh)
	$(BIN)/shellcheck --shell=sh images/*.sh
	$(MKDOCS) build --strict --quiet

.PHONY: fmt
fmt: setup ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: bench
bench: setup ## run the ratio benchmarks (each prints its ratio last)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b; done

.PHONY: images
images: ## build both images, tagged <registry>/trainer-{cpu,cuda}:<version> (GPUPIPE_IMAGE_REGISTRY)
	hack/docker-up.sh
	hack/build-images.sh all

.PHONY: test-containers
test-containers: setup ## start Docker (installing it as root), build the images, run tests/containers
	hack/docker-up.sh
	$(BIN)/pytest -m containers tests/containers $(PYTEST_ARGS)

# NODES=N: the test cluster's nodes (hack/cluster/nodes.sh); left out, what the running cluster
# has, else 2 (make test-cluster: 3, the third a spare for the node-loss test).
CLUSTER_NODES = $(if $(NODES),GPUPIPE_CLUSTER_NODES=$(NODES) )
TEST_CLUSTER_NODES = $(if $(NODES),GPUPIPE_CLUSTER_NODES=$(NODES) ,GPUPIPE_CLUSTER_NODES_DEFAULT=3 )

.PHONY: cluster-up
cluster-up: ## Kubernetes as host processes (NODES=N nodes), built from upstream, with the Kubeflow add-ons
	$(CLUSTER_NODES)hack/cluster-up.sh

.PHONY: test-cluster
test-cluster: setup ## bring the test cluster up (hack/cluster-up.sh) and run tests/cluster
	@# Exit 3: a piece cannot run on this machine; the tests skip with cluster-up's reason.
	$(TEST_CLUSTER_NODES)hack/cluster-up.sh || [ $$? -eq 3 ]
	@# The browser of the UI tests (tests/cluster/test_kfp_ui.py); they skip, saying why, without it.
	hack/chromium.sh || [ $$? -eq 3 ]
	@# With PYTEST_ARGS, one pytest over tests/cluster with them; without, every cluster test:
	@# all but KFP's in one stream, then KFP's in three (hack/cluster-tests.sh). .ci/run runs
	@# the same tests, with the add-ons installed in stages and its stage 2 beside KFP's.
ifneq ($(strip $(PYTEST_ARGS)),)
	$(BIN)/pytest -m cluster tests/cluster $(PYTEST_ARGS)
else
	hack/cluster-tests.sh
endif

.PHONY: cluster-down
cluster-down: ## stop the test cluster's processes and remove its state (keeps the build cache)
	hack/cluster-down.sh

.PHONY: kind-up
kind-up: setup ## kind cluster with KFP 2.17.0, training operator, Katib, RBAC, MLflow, CPU image
	hack/kind-up.sh

.PHONY: e2e
e2e: setup ## on the kind cluster: the pipeline with launcher=pytorchjob (gloo, 2 nodes)
	hack/e2e.sh

.PHONY: kind-down
kind-down: ## delete the kind cluster
	hack/kind-down.sh

.PHONY: clean
clean: ## remove run outputs and caches (keeps .venv)
	rm -rf .runs .pytest_cache .ruff_cache .mypy_cache site
