# rl_app: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

EXP ?= ppo_cartpole
ARGS ?=
PYTHON ?= python3.11
CONDA := $(shell command -v mamba 2>/dev/null || command -v conda 2>/dev/null)

# With conda/mamba the environment lives in .conda-env (from environment.yml);
# otherwise a .venv made with pip from the same pin files.
ifneq ($(CONDA),)
ENV_DIR := .conda-env
else
ENV_DIR := .venv
endif
BIN := $(ENV_DIR)/bin
STAMP := $(ENV_DIR)/.rl_app-installed
LINT_PATHS := $(wildcard rl_app tests bench)
PIN_FILES := requirements.txt requirements-envs.txt requirements-dev.txt environment.yml pyproject.toml

.PHONY: bench-learning-atari bench-learning-minatar bench-env-speed bench-multi-agent bench-memory bench-offline offline-data record mlflow-ui test-cluster bench-solve bench-before-after bench-scale bench-parity cluster-join help setup train resume sweep sweep-resume cluster-up cluster-down submit eval export runs report tensorboard show list lint format test test-fast bench bench-quick bench-learning bench-sweep bench-serve soak serve clean-env

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'
	@echo "  variables: EXP=$(EXP) ARGS='--set training.lr=0.0003 --set stop.timesteps=50000'"

setup: $(STAMP) ## create the environment from the pins (idempotent; fast when up to date)

$(STAMP): $(PIN_FILES)
ifneq ($(CONDA),)
	@if [ -d $(ENV_DIR) ]; then $(CONDA) env update -p $(ENV_DIR) -f environment.yml; \
	else $(CONDA) env create -p $(ENV_DIR) -f environment.yml; fi
else
	@command -v $(PYTHON) >/dev/null || { echo "make setup: $(PYTHON) not found (set PYTHON=...)"; exit 2; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(ENV_DIR)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-envs.txt -r requirements-dev.txt
	@# setuptools' "Editable installation" notice is a box of asterisks on every fresh setup
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --no-deps -e .
endif
	@touch $(STAMP)

train: setup ## train EXP (ARGS passes --set overrides etc.)
	$(BIN)/rl_app train $(EXP) $(ARGS)

resume: setup ## continue run RUN=runs/<exp>/<stamp> (or a storage URI) from its latest checkpoint
	@[ -n "$(RUN)" ] || { echo "make resume: set RUN=runs/<experiment>/<timestamp>"; exit 2; }
	$(BIN)/rl_app train --resume $(RUN) $(ARGS)

sweep: setup ## Ray Tune sweep over EXP's sweep: section (SAMPLES=N sets num_samples)
	$(BIN)/rl_app sweep $(EXP) $(if $(SAMPLES),--samples $(SAMPLES)) $(ARGS)

sweep-resume: setup ## continue the sweep in RUN=runs/<exp>/<stamp> after Ctrl-C or a crash
	@[ -n "$(RUN)" ] || { echo "make sweep-resume: set RUN=runs/<experiment>/<timestamp>"; exit 2; }
	$(BIN)/rl_app sweep --resume $(RUN) $(ARGS)

cluster-up: setup ## start a Ray head with token auth (127.0.0.1; ARGS="--bind 127.0.0.2" takes workers)
	$(BIN)/rl_app cluster up $(ARGS)

cluster-join: setup ## join the head at HEAD=host:port as a worker node (ARGS="--bind 127.0.0.3 --num-cpus 2")
	@[ -n "$(HEAD)" ] || { echo "make cluster-join: set HEAD=host:port (the head's GCS address)"; exit 2; }
	$(BIN)/rl_app cluster join $(HEAD) $(ARGS)

cluster-down: setup ## stop the head and workers started from here (only their processes, by pid)
	$(BIN)/rl_app cluster down

submit: setup ## submit EXP as a Ray Job (ADDRESS=http://host:8265, SWEEP=1, NO_WAIT=1)
	$(BIN)/rl_app submit $(EXP) $(if $(ADDRESS),--address $(ADDRESS)) $(if $(SWEEP),--sweep) $(if $(NO_WAIT),--no-wait) $(ARGS)

eval: setup ## evaluate RUN deterministically (EPISODES=10, VIDEO=1 records mp4s of VIDEO_EPISODES=3)
	@[ -n "$(RUN)" ] || { echo "make eval: set RUN=runs/<experiment>/<timestamp>"; exit 2; }
	$(BIN)/rl_app evaluate $(RUN) --episodes $(or $(EPISODES),10) $(if $(VIDEO),--video --video-episodes $(or $(VIDEO_EPISODES),3)) $(ARGS)

export: setup ## export RUN's policy (FORMAT=torchscript|onnx)
	@[ -n "$(RUN)" ] || { echo "make export: set RUN=runs/<experiment>/<timestamp>"; exit 2; }
	$(BIN)/rl_app export $(RUN) --format $(or $(FORMAT),torchscript) $(ARGS)

serve: setup ## answer HTTP on 127.0.0.1:8000 with RUN's policy (a run, checkpoint or export folder; PORT=8000)
	@[ -n "$(RUN)" ] || { echo "make serve: set RUN=runs/<experiment>/<timestamp> (or its export folder)"; exit 2; }
	$(BIN)/rl_app serve $(RUN) --port $(or $(PORT),8000) $(ARGS)

runs: setup ## list runs with status, best return and last checkpoint
	@$(BIN)/rl_app runs $(ARGS)

report: setup ## reward curves of RUN (several: RUN="a b" adds runs/reports/<stamp>/comparison.png, or OUT=file.png)
	$(BIN)/rl_app report $(RUN) $(if $(OUT),--out $(OUT)) $(ARGS)

offline-data: setup ## record the episodes bc_cartpole and iql_pendulum learn from into data/ (trains their behaviour policies; ~2 min)
	$(BIN)/python bench/offline_data.py

bench-offline: offline-data ## offline experiments on held-out seeds vs their targets (bc_cartpole 10 seeds, iql_pendulum 3; ~25 min)
	$(BIN)/python bench/offline.py $(ARGS)

record: setup ## write RUN's episodes for offline learning (OUT=data/<name>, EPISODES=100, EPSILON=0)
	@[ -n "$(RUN)" ] && [ -n "$(OUT)" ] || { echo "make record: set RUN=runs/<experiment>/<timestamp> and OUT=data/<name>"; exit 2; }
	$(BIN)/rl_app record $(RUN) --out $(OUT) --episodes $(or $(EPISODES),100) --epsilon $(or $(EPSILON),0) $(ARGS)

MLFLOW_UI_ENV := .venv-mlflow-ui
$(MLFLOW_UI_ENV)/.installed: requirements-mlflow-ui.txt
	@[ -x $(MLFLOW_UI_ENV)/bin/python ] || $(PYTHON) -m venv $(MLFLOW_UI_ENV)
	$(MLFLOW_UI_ENV)/bin/python -m pip install --quiet -r requirements-mlflow-ui.txt
	@touch $@

mlflow-ui: $(MLFLOW_UI_ENV)/.installed ## the MLflow UI of ./mlruns (train --track) on 127.0.0.1:5000 (PORT=5000; its own venv)
	@mkdir -p mlruns/artifacts
	$(MLFLOW_UI_ENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db \
		--default-artifact-root $(CURDIR)/mlruns/artifacts --host 127.0.0.1 --port $(or $(PORT),5000) --workers 1

tensorboard: setup ## serve TensorBoard for runs/ on 127.0.0.1:6006
	$(BIN)/tensorboard --logdir runs --host 127.0.0.1 --port $(or $(PORT),6006)

show: setup ## print EXP's fully resolved config
	$(BIN)/rl_app show $(EXP) $(ARGS)

list: setup ## list the shipped experiments
	@$(BIN)/rl_app list

lint: setup ## ruff (lint + format check), mypy, hadolint
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy
	@if ls docker/Dockerfile* >/dev/null 2>&1; then $(BIN)/hadolint docker/Dockerfile*; fi

format: setup ## apply ruff's formatting and autofixes
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

test: setup ## the full test suite, learning tests included (the multi-node ones: make test-cluster)
	$(BIN)/python -m pytest tests -m "not cluster"

test-fast: setup ## everything but the slow learning tests and the multi-node ones
	$(BIN)/python -m pytest tests -m "not slow and not cluster"

test-cluster: setup ## a head and two workers on loopback addresses: lost nodes, jobs, sweeps (~4 min)
	$(BIN)/python -m pytest tests -m cluster

bench: setup ## rl_app vs Stable-Baselines3 (PPO and DQN time to solve, held-out seeds 100-109), sampling, learner, start-up (~55 min)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/compare.py --solve-only $(ARGS)
	$(BIN)/python bench/compare.py --no-solve
	$(BIN)/python bench/learner.py
	$(BIN)/python bench/env_speed.py

bench-quick: setup ## start-up, sampling, learner throughput and SAC training vs SB3 (~8 min)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/compare.py --quick $(ARGS)
	$(BIN)/python bench/learner.py --updates 10

bench-solve: setup ## time to solve CartPole only: PPO (3 ways) and DQN vs SB3 on held-out seeds 100-109 (~26 min)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/compare.py --solve-only $(ARGS)

bench-learning: setup ## train every shipped experiment as shipped and check its target return
	$(BIN)/python bench/learning.py $(EXPS)

soak: setup ## a 20-minute run, checkpoint every iteration: RSS, descriptors, threads, disk (MINUTES=20)
	$(BIN)/python bench/soak.py --minutes $(or $(MINUTES),20)

bench-serve: setup ## rl_app serve vs FastAPI baselines (naive, tuned) vs Ray Serve: req/s, p50/p99 at c=1,8,64, two clients, 3 rounds (~11 min; ARGS=--rev REV adds an earlier rl_app)
	$(BIN)/python bench/serve.py $(ARGS)

bench-scale: setup ## env runners on one node vs spread over loopback nodes; bytes per iteration (~6 min)
	$(BIN)/python bench/scale.py $(ARGS)

bench-before-after: setup ## training speed of REV=<git revision> against this tree, in turn, fresh processes (~8 min)
	@[ -n "$(REV)" ] || { echo "make bench-before-after: set REV=<git revision>, e.g. REV=HEAD~1"; exit 2; }
	$(BIN)/python bench/before_after.py $(REV) $(ARGS)

bench-parity: setup ## learning at equal env steps, rl_app vs SB3 on held-out seeds (CASES=..., long: see bench/README.md)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/parity.py $(CASES) $(ARGS)

bench-multi-agent: setup ## ppo_simple_spread and ppo_tictactoe_selfplay on held-out seeds, against random and a controller (~40 min)
	$(BIN)/python bench/multi_agent.py $(ARGS)

bench-learning-atari: setup ## ppo_breakout for one hour of training on this machine, its curve and final score vs random (~70 min)
	$(BIN)/python bench/atari_learning.py $(ARGS)

bench-learning-minatar: setup ## ppo_minatar_breakout on 3 held-out seeds to 5.12M steps vs gymnax-blines' published PPO (~27 min)
	$(BIN)/python bench/minatar_learning.py $(ARGS)

bench-env-speed: setup ## steps/s raw and under the runners: Pong (Python vector envs vs ale-py's native one), HalfCheetah with its filter (~12 min)
	$(BIN)/python bench/env_speed.py $(ARGS)

bench-memory: setup ## ppo_stateless_cartpole with its LSTM vs without, held-out seeds 100-104 (~25 min)
	$(BIN)/python bench/memory.py $(ARGS)

bench-sweep: setup ## run ppo_cartpole_sweep and check its best against hand-tuned ppo_cartpole
	$(BIN)/python bench/sweep.py $(EXP_SWEEP)

clean-env: ## remove the environment
	rm -rf .venv .conda-env
