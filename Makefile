# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both create (or reuse) .venv and install the package into it first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean-demo

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wsi demo --out demo-out

test: $(STAMP)
	$(PY) -m pytest -q

# mypy cannot follow setup.py's folder -> wsi.* mapping, so it checks a tree of links laid out as the
# wheel installs it (build/typecheck/wsi/{models,pipelines,configs,...}); paths in its messages read
# wsi/models/... for models/...
TYPECHECK := build/typecheck
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/wsi
	for f in wsi/*; do ln -s ../../../$$f $(TYPECHECK)/wsi/; done
	for d in models pipelines configs; do ln -s ../../../$$d $(TYPECHECK)/wsi/$$d; done
	cd $(TYPECHECK) && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml
