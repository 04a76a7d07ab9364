# lltm - the two commands of the README:
#   make bench   set up everything, then run the main job (the benchmark table)
#   make test    set up everything, then run every test (C, ABI drift, CUDA compile, Python)
#
# Set-up is idempotent: a virtual environment in .venv with torch 2.13.0 (CPU
# build), the test / bench / example dependencies, and lltm installed editable
# (which builds the native library with lltm/build.py).

PYTHON_SYS ?= python3
VENV       := .venv
PY         := $(VENV)/bin/python
TORCH_SPEC := torch==2.13.0
DEPS       := numpy pytest matplotlib tqdm scikit-learn
STAMP      := $(VENV)/.lltm-setup
CC         ?= cc
NVCC       ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_SRCS  := $(wildcard csrc/core/*.cu)
BENCH_ARGS ?=

.PHONY: all setup bench test test-c test-python abi-check cuda-compile-check build clean

all: test

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC) $(DEPS)
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# Rebuild the native library in place (incremental; seconds from scratch).
build: $(STAMP)
	$(PY) lltm/build.py --inplace

bench: setup
	$(PY) -m lltm.bench $(BENCH_ARGS)

test: test-c abi-check cuda-compile-check test-python

# The C core against a naive C reference, under AddressSanitizer + UBSan:
# the cell kernels and conversions (test_core), the sequence (test_sequence).
TEST_C_FLAGS := -std=c11 -g -O2 -fno-trapping-math -fno-math-errno -Wall -Wextra -Werror \
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
test-c:
	mkdir -p build
	$(CC) $(TEST_C_FLAGS) tests/c/test_core.c csrc/core/lltm_cpu.c -lm -o build/test_core
	$(CC) $(TEST_C_FLAGS) tests/c/test_sequence.c csrc/core/lltm_sequence_cpu.c \
	    csrc/core/lltm_cpu.c -lm -o build/test_sequence
	./build/test_core
	./build/test_sequence

# Our C declarations of the stable ABI against the installed torch's headers.
abi-check: setup
	$(eval TORCH_INC := $(shell $(PY) -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include'))"))
	c++ -std=c++17 -fsyntax-only -I$(TORCH_INC) tests/abi/abi_drift_check.cpp
	@echo "abi-check: our stable-ABI prototypes match torch $$($(PY) -c 'import torch; print(torch.__version__)')"

# Every .cu compiles for Hopper (sm_90) with the local nvcc; no GPU needed.
cuda-compile-check:
	@if [ -z "$(NVCC)" ]; then echo "cuda-compile-check: nvcc not found, skipped"; \
	elif [ -z "$(CUDA_SRCS)" ]; then echo "cuda-compile-check: no .cu files yet"; \
	else mkdir -p build/cuda-check && for f in $(CUDA_SRCS); do \
	    echo "nvcc sm_90: $$f"; \
	    $(NVCC) -std=c++17 -O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-fPIC \
	        -gencode=arch=compute_90,code=sm_90 -c $$f \
	        -o build/cuda-check/$$(basename $$f).o || exit 1; \
	done; fi

# Warnings are errors in the project's own checks (not for users' installs).
test-python: setup
	LLTM_WERROR=1 $(PY) lltm/build.py --inplace
	$(PY) -m pytest -q tests

clean:
	rm -rf build lltm/*.so lltm/obj
