# hetero-dp developer commands. `make demo` and `make test` are the README's quick start.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
VENDORS := vendors/simulated $(wildcard vendors/udev) $(wildcard vendors/nvidia)
APT_PACKAGES := gcc umockdev libumockdev0 gir1.2-umockdev-1.0 python3-gi

.PHONY: demo test install system-deps lint proto bench docs

install:
	$(PIP) install -q --config-settings editable_mode=compat -e '.[dev]' $(foreach v,$(VENDORS),-e $(v))

system-deps:
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi; \
	fi

demo: install
	hetero-dp demo

test: system-deps install
	$(PYTHON) -m coverage run --source=hetero_dp -m pytest -q
	$(PYTHON) -m coverage report --skip-covered --omit='hetero_dp/kubelet/api/*' | tail -n 25

lint:
	ruff check .
	ruff format --check .
	mypy

proto:
	$(PYTHON) scripts/gen_proto.py

docs:
	$(PYTHON) scripts/gen_hook_docs.py --check
	$(PYTHON) -m mkdocs build --strict -d site

bench: install
	$(PYTHON) -m benchmarks
