// abi_drift_check.cpp - the one C++ file of the project, compiled in CI only.
//
// It includes PyTorch's official stable-ABI headers and then our C
// redeclarations. C++ rejects a redeclared extern "C" function whose
// parameter or return types differ, so any prototype in our header that has
// drifted from the installed torch is a compile error here. Our header
// includes the generated table of pointers the libraries call torch through
// (torch_stable_abi_table.h), which then asserts that each pointer has the
// type of its function.
#define USE_CUDA 1  // declare the CUDA shim functions too
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>

#define LLTM_WITH_CUDA 1
#include "../../csrc/binding/torch_stable_abi.h"

int main() { return 0; }
