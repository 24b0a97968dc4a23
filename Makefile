# Set-up and checks. `make demo` and `make test` work from a fresh clone on a fresh machine and
# are idempotent: the environment is (re)installed only when pyproject.toml or constraints.txt change.

VENV        ?= .venv
PYTHON      ?= python3
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
# constraints.txt pins torch to the local CPU build on these machines; without it pip would pull
# a newer torch with gigabytes of CUDA packages.
CONSTRAINTS := -c constraints.txt
PYTEST_ARGS ?=

.PHONY: demo test test-gpu install install-dev lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) install --quiet $(CONSTRAINTS) torch
	$(PIP) install --quiet $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install --quiet $(CONSTRAINTS) -e '.[dev,onnx]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# The Debian packages the bundled data and the parity tasks are built from: the byte-for-byte
# rebuild test is skipped, with the reason, without them; tests/test_parity_tasks.py fails.
# arabic-messages reads the Arabic catalogs of six applications (only their data packages: no recommends)
ARABIC_PACKAGES = cinnamon-l10n evolution-common gimp-data gnucash-common krita-l10n vlc-l10n
ARABIC_CATALOGS = nemo evolution gimp20 gnucash krita vlc
.PHONY: sample-sources
sample-sources:
	@if [ -x /usr/bin/bible ] && [ -f /usr/share/wordnet/data.noun ] && [ -f /usr/share/man/man7/man.7.gz ] && [ -f /usr/share/man/man3/printf.3.gz ] \
		&& (for lang in de fr es ja zh_CN; do [ -f /usr/share/man/$$lang/man1/chmod.1.gz ] || exit 1; done) \
		&& (for mo in $(ARABIC_CATALOGS); do [ -f /usr/share/locale/ar/LC_MESSAGES/$$mo.mo ] || exit 1; done); then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base bible-kjv manpages manpages-dev \
			manpages-de manpages-fr manpages-es manpages-ja manpages-zh >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(ARABIC_PACKAGES) >/dev/null) \
		|| echo "note: could not install wordnet-base/bible-kjv/manpages(-dev, -de, -fr, -es, -ja, -zh)/$(ARABIC_PACKAGES); the tests that rebuild data from them will fail or be skipped"; \
	else echo "note: wordnet-base/bible-kjv/manpages(-dev, -de, -fr, -es, -ja, -zh)/$(ARABIC_PACKAGES) not installed; the tests that rebuild data from them will fail or be skipped"; fi

demo: install
	$(VENV)/bin/bertforge quickstart

# Two pytest workers, one per core, each test file on one worker (its module fixtures built once),
# each worker's torch on one thread: the tests' models are tiny, so two single-threaded workers do
# about twice the work of one two-threaded process, which spends its time in thread hand-offs.
# Tests that launch torchrun get one thread per rank anyway (torchrun's own default).
# Files with `slow` tests are handed out first (tests/helpers/suite_order.py), so no long file starts
# last with the other worker idle; --no-loadscope-reorder keeps that order.
TEST_WORKERS ?= 2

test: install-dev sample-sources
	@BERTFORGE_STRICT_TESTS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests; the suite must never be empty"; exit 1; fi; \
	exit $$rc

# The tests marked `cuda` only (tests/test_cuda.py), on a machine with a CUDA GPU (PyPI's Linux torch
# wheel is a CUDA build; on a machine with no GPU this stops with one line instead of skipping them all).
test-gpu: install-dev
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch ' + torch.__version__ + ' sees no CUDA GPU here; run it on a GPU machine (bertforge doctor checks any machine)')"
	BERTFORGE_STRICT_TESTS=1 $(PY) -m pytest -m cuda -rs $(PYTEST_ARGS)

# One prepared check of bertforge on a GPU machine (docs/scaling.md): stages with their own time limits,
# one JSON and one log in OUT. On the GPU machine it runs with that machine's own python3 (its CUDA torch)
# and installs nothing over the network: the wheels it lacks come from gpu-wheels/ (`make gpu-wheels`,
# here, with the network). DRY_RUN=1 runs every stage's CPU code path with tiny shapes, in this venv.
OUT ?= runs/gpu-check
GPU_PYTHON ?= python3

.PHONY: gpu-check gpu-wheels
ifeq ($(DRY_RUN),)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --out $(OUT)
else
gpu-check: install-dev
	$(PY) benchmarks/gpu_check.py --out $(OUT) --dry-run
endif

gpu-wheels: install-dev
	$(PY) benchmarks/gpu_check.py --build-wheels gpu-wheels

lint: install-dev
	$(VENV)/bin/ruff check src tests benchmarks scripts

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
