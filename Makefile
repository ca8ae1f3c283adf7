# trainmap: `make run` (set-up + the default study) and `make test` (set-up + the full test suite).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

CONFIG ?= config/config.yaml
CORES ?= 2
PORT ?= 5000
# A DVC remote, opt-in: the cache (.dvc/cache, linked to results/ by .dvc/config's cache.type, no
# copy) already holds every version here, and a remote on the same disk would be a second full copy.
# Set it to storage elsewhere, e.g. a cluster's shared or project file system:
# make run DVC_REMOTE=/project/<group>/trainmap-dvc (docs/running.md: DVC on a cluster). make run
# and make repro push to it, or to a default remote set with `dvc remote add -d`.
DVC_REMOTE ?=

export MLFLOW_DISABLE_TELEMETRY := true
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
RUN := $(UV) run --locked --quiet
SNAKEMAKE := $(RUN) snakemake
DVC := $(RUN) dvc
# Push to the default remote where one is set (DVC_REMOTE, or `dvc remote add -d`); else say so.
DVC_PUSH = if $(DVC) remote default >/dev/null 2>&1; then \
	    echo "dvc push to remote $$($(DVC) remote default)"; $(DVC) push --quiet; \
	else echo "No DVC remote: versions stay in .dvc/cache (make run DVC_REMOTE=/shared/path pushes)"; fi
DVC_CONFIG = $(shell $(RUN) python -c "import yaml; print(yaml.safe_load(open('params.yaml'))['dvc']['configfile'])")
# Where a config file's study writes (config key results: results for the default study,
# results-paper/<setting> for the paper's, ...): $(call RESULTS_OF,config/paper/cpu.yaml).
RESULTS_OF = $(shell $(RUN) python -m trainmap.grid --results-root $(1))
# The digest a config's results are checked against, its findings page and machine record beside
# it (trainmap.io.published_digest_of): config/config.yaml -> config/published/config.results.sha256.
PUBLISHED_OF = $(dir $(1))published/$(notdir $(basename $(1))).results.sha256

# bench: BENCH_ARGS=--quick for a fast pass (each script's --help says what it measures).
BENCH_ARGS ?=
# mlflow-server: where the server keeps runs and artifacts (a PostgreSQL URI works too, e.g.
# BACKEND=postgresql://user:pass@host/db).
BACKEND ?= sqlite:///$(CURDIR)/mlflow-server.db
ARTIFACTS ?= $(CURDIR)/mlartifacts-server
# mlflow-server: the address it listens on. 127.0.0.1 reaches jobs on this machine only (the local
# SLURM of make slurm-up included); for a cluster's compute nodes use HOST=0.0.0.0 or the login
# node's own address, and set mlflow.tracking_uri: http://<login node>:$(PORT) in the config. MLflow
# answers only Host headers it allows (default: localhost and private IPs): where the nodes call the
# server by name, also ALLOWED_HOSTS=<login node name>[,<its FQDN>].
HOST ?= 127.0.0.1
ALLOWED_HOSTS ?=
# The local SLURM's state, logs and pid files: a private (0700) directory, never a shared /tmp path.
SLURM_DIR ?= $(CURDIR)/.slurm

.PHONY: help setup run plan resolve paper repro report test test-fast test-faults test-record lint format bench docs mlflow-ui mlflow-server \
	slurm-up slurm-down dvc-remote clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup:  ## install uv if missing, then the locked environment (fast when nothing changed)
	@command -v $(UV) >/dev/null 2>&1 || python3 -m pip install --quiet --user uv
	@$(UV) sync --locked --quiet

# Each workflow job is a fresh Python process: without .pyc files every job compiles torch, MLflow
# and the analysis again (their imports: 21 s without, 8 s with, measured). Python writes a module's
# bytecode at its first import, into this project's .venv and src/, unless PYTHONDONTWRITEBYTECODE
# is set: the targets here unset it. Compiling the whole environment up front instead took 58 s of a
# fresh clone's `make run`, most of it for modules no job imports.
unexport PYTHONDONTWRITEBYTECODE

run: setup dvc-remote  ## the study on CONFIG (default: the embedded grid); versions it with DVC
	@# Snakemake reads --configfile files before the Snakefile: this check names a YAML error's line.
	$(RUN) python -m trainmap.grid $(CONFIG)
	@# Refused before any work when a job or the whole grid does not fit one node (make plan: why).
	$(RUN) python -m trainmap.plan --configfile $(CONFIG) --check $(PLAN_ARGS)
	@# The run's time goes beside its results (a timing sidecar) for the findings page.
	SECONDS=0; $(SNAKEMAKE) --cores $(CORES) --configfile $(CONFIG) --rerun-incomplete; \
	$(RUN) python -m trainmap.findings time $(call RESULTS_OF,$(CONFIG)) $$SECONDS --cores $(CORES) >/dev/null
	@if [ "$(CONFIG)" = "$(DVC_CONFIG)" ]; then \
	    echo "Recording data and checkpoints in DVC (dvc commit into .dvc/cache)"; \
	    $(RUN) python -m trainmap.grid.dvc_record && $(DVC_PUSH); \
	else \
	    echo "Not versioned by DVC: dvc.yaml runs $(DVC_CONFIG) (params.yaml: dvc.configfile)"; \
	fi
	@echo "Evaluation table: $(call RESULTS_OF,$(CONFIG))/summary/evaluation.csv   Report: make report   Runs: make mlflow-ui"
	@# The published answer: every result file's sha256 (config/published/), and the findings page
	@# (docs/findings.md includes config/published/config.findings.md) against this run's answers.
	@$(RUN) python -m trainmap.digest check $(call PUBLISHED_OF,$(CONFIG)) $(call RESULTS_OF,$(CONFIG))
	@# The answer sentences of the README and the docs are written from the default study's results,
	@# the times they quote from the records (trainmap.records; the times themselves aside).
	@if [ "$(CONFIG)" = "config/config.yaml" ]; then \
	    $(RUN) python -m trainmap.findings answers --check $(call RESULTS_OF,$(CONFIG)) README.md docs/index.md docs/getting-started.md || true; \
	    $(RUN) python -m trainmap.records write --check || true; \
	fi

plan: setup  ## bytes written, peak RAM/GPU memory and time of every job of CONFIG, checked against one node (python -m trainmap.plan --help)
	$(RUN) python -m trainmap.plan --configfile $(CONFIG) $(PLAN_ARGS)

resolve: setup  ## list the revisions of the suites CONFIG fetches from the Hub (external sets with hub.fetch) into their revisions.json, before make run (trainmap resolve --help)
	$(RUN) trainmap resolve --configfile $(CONFIG)

# paper: the training-maps paper's settings this machine can run (PAPER_CONFIG=config/paper.yaml
# for every setting, on a GPU node with the MNIST/CIFAR-100 files).
PAPER_CONFIG ?= config/paper/cpu.yaml

paper: setup  ## the training-maps paper's tables side by side (40 seeds per setting; 1.5-2.5 h on 2 cores with TRAINMAP_PORTABLE=0 by CPU, about 3 h under portable mode: docs/paper.md, Cost): results-paper/cpu/paper/table.md
	$(RUN) python -m trainmap.grid $(PAPER_CONFIG)
	$(SNAKEMAKE) paper --cores $(CORES) --configfile $(PAPER_CONFIG) --rerun-incomplete
	@echo "Table: $(call RESULTS_OF,$(PAPER_CONFIG))/paper/table.md   Figure: $(call RESULTS_OF,$(PAPER_CONFIG))/paper/table.png"

report: setup  ## one HTML report of CONFIG's results (maps, selection curves, tables): results/report.html
	$(SNAKEMAKE) --cores 1 --configfile $(CONFIG) --report $(call RESULTS_OF,$(CONFIG))/report.html
	@echo "Report: $(call RESULTS_OF,$(CONFIG))/report.html"

repro: setup dvc-remote  ## the same study through DVC: dvc repro (stage by stage), then dvc push if a remote is set
	$(DVC) repro
	@$(DVC_PUSH)

# The suite runs on TEST_WORKERS pytest-xdist workers (default: CORES), a module (or the smoke
# study's readers) to a worker, the longest first (tests/conftest.py: pytest_xdist_make_scheduler).
# A test that hangs fails after TEST_TIMEOUT s with its stack, not at CI's limit.
TEST_WORKERS ?= $(CORES)
TEST_TIMEOUT ?= 1800
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadscope --timeout $(TEST_TIMEOUT)

# Each tier leaves what its tests took in .test-durations/ (ignored: a run never changes the
# checkout); make test-record publishes them.
DURATIONS_DIR := .test-durations

test: setup  ## the full suite but the fault tier (bench/results/times.md gives each tier's time); prints the 25 slowest steps
	$(RUN) pytest -m "not faults" $(PYTEST_PARALLEL) --durations=25 --durations-file=$(DURATIONS_DIR)/full.json $(PYTEST_ARGS)

test-fast: setup  ## the tier to run before every commit: no Snakemake, server, browser or subprocess, nothing slow
	$(RUN) pytest -m "not integration and not slow and not faults" $(PYTEST_PARALLEL) --durations=10 --durations-file=$(DURATIONS_DIR)/fast.json $(PYTEST_ARGS)

# The fault tier, one case at a time (each runs the smoke study's workflow on 2 cores): copies of a
# finished smoke study killed at named points, filled disks, a second run; each recovered the
# documented way must match the uninterrupted copy's digest. Its table: $(DURATIONS_DIR)/faults.md.
# FAULT_SEED picks the kill points (trainmap.faults; tests/faults/test_faults.py).
FAULT_SEED ?= 0

test-faults: setup  ## the fault tier: kills at named points, full disks, a second run, damaged files; each recovery checked against an uninterrupted run's digest
	TRAINMAP_FAULT_SEED=$(FAULT_SEED) $(RUN) pytest -m faults -n 0 --timeout $(TEST_TIMEOUT) --durations=10 --durations-file=$(DURATIONS_DIR)/faults.json $(PYTEST_ARGS)
	@cat $(DURATIONS_DIR)/faults.md

test-record: setup  ## on the reference machine, after a green make test and make test-fast: their times into bench/results/test_tiers.json, times.md and the README
	$(RUN) python -m trainmap.records tests --durations $(DURATIONS_DIR)
	$(RUN) python -m trainmap.records write

lint: setup  ## ruff, snakefmt and snakemake --lint
	$(RUN) ruff check src tests bench workflow/scripts
	$(RUN) ruff format --check src tests bench workflow/scripts
	$(RUN) snakefmt --check Snakefile workflow/rules
	$(SNAKEMAKE) --lint --configfile config/smoke.yaml

format: setup  ## apply ruff and snakefmt formatting
	$(RUN) ruff format src tests bench workflow/scripts
	$(RUN) snakefmt Snakefile workflow/rules

bench: setup  ## every benchmark in bench/ (side-by-side ratios), then one table of figures and targets
	@# Every script runs even when one fails; the failures are named at the end and fail the target.
	@# A skipped benchmark (its inputs, e.g. a finished study, are missing) says so on its last line.
	@mkdir -p logs/bench
	@declare -A status; failed=""; \
	for script in bench/*.py; do \
	    name=$$(basename $$script .py); echo "== $$script $(BENCH_ARGS)"; \
	    status[$$name]=0; \
	    $(RUN) python $$script $(BENCH_ARGS) 2>&1 | tee logs/bench/$$name.log || status[$$name]=$$?; \
	    if [ $${status[$$name]} -ne 0 ]; then \
	        echo "== $$script failed (exit status $${status[$$name]})"; failed="$$failed $$name"; \
	        if [ $${status[$$name]} -eq 130 ]; then exit 130; fi; \
	    fi; \
	done; \
	echo; echo "== figures (last line of each benchmark; logs in logs/bench/)"; \
	for script in bench/*.py; do \
	    name=$$(basename $$script .py); line=$$(tail -n 1 logs/bench/$$name.log); \
	    if [ $${status[$$name]} -ne 0 ]; then line="FAILED (exit status $${status[$$name]}): $$line"; fi; \
	    printf "%-24s %s\n" "$$name" "$$line"; \
	done; \
	if [ -n "$$failed" ]; then \
	    echo "== $$(wc -w <<< "$$failed") benchmark(s) failed:$$failed (logs in logs/bench/)"; exit 1; \
	fi

docs: setup  ## the docs site from docs/ (MkDocs, warnings as errors: a broken link fails) into site/
	NO_MKDOCS_2_WARNING=1 $(RUN) mkdocs build --strict --site-dir site
	@echo "Docs: site/index.html"

mlflow-ui: setup  ## browse and compare runs at http://127.0.0.1:$(PORT) (prints each experiment's runs table and, per comparison, a chart of each method's mean and interval; METRIC=test_acc)
	@$(RUN) python -m trainmap.seed_groups --uri sqlite:///mlflow.db --address http://127.0.0.1:$(PORT) --metric $(or $(METRIC),test_acc)
	$(RUN) mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port $(PORT)

mlflow-server: setup  ## a tracking server for cluster jobs on HOST:PORT (cluster: HOST=0.0.0.0; mlflow.tracking_uri: http://<this node>:PORT)
	$(RUN) mlflow server --backend-store-uri '$(BACKEND)' --artifacts-destination $(ARTIFACTS) \
	    --serve-artifacts --host $(HOST) --port $(PORT) $(if $(ALLOWED_HOSTS),--allowed-hosts $(ALLOWED_HOSTS))

slurm-up:  ## start a real single-node SLURM here (root; installs slurm-wlm + munge if missing)
	profiles/slurm/local_cluster.sh start $(SLURM_DIR)
	@echo "then: export SLURM_CONF=$(SLURM_DIR)/slurm.conf; snakemake --profile profiles/slurm \
	    --slurm-status-command squeue --slurm-no-account --default-resources slurm_partition=debug"

slurm-down:  ## stop the local SLURM daemons
	profiles/slurm/local_cluster.sh stop $(SLURM_DIR)

dvc-remote: setup  ## with DVC_REMOTE=/path: point DVC's default remote there (local config, not committed)
	@if [ -n "$(DVC_REMOTE)" ]; then \
	    mkdir -p $(DVC_REMOTE) && $(DVC) remote add --local --force --default local $(DVC_REMOTE) >/dev/null; \
	fi

clean:  ## delete every marked results root (each root a study wrote, wherever it lies; and results, results-* here, the shipped configs' roots), logs and the tracking store (the DVC cache and remote stay)
	@# Roots first: their registry is in .snakemake. A root a running workflow holds stops it here.
	$(RUN) python -m trainmap.grid.roots clean
	rm -rf logs .snakemake mlflow.db mlartifacts mlflow-server.db mlartifacts-server
