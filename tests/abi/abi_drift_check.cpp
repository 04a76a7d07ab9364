// abi_drift_check.cpp - the one C++ file of the project, compiled in CI only.
//
// It includes PyTorch's official stable-ABI headers and then our C header,
// whose list of functions is declared here as prototypes (not as the
// libraries' pointers). C++ rejects a redeclared extern "C" function whose
// parameter or return types differ, so any entry of our list that has
// drifted from the installed torch is a compile error here.
#define USE_CUDA 1  // declare the CUDA shim functions too
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>

#define LLTM_WITH_CUDA 1
#define LLTM_TORCH_PROTOTYPES 1
#include "../../csrc/binding/torch_stable_abi.h"

int main() { return 0; }
