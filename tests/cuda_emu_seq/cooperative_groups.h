/* cooperative_groups.h (fiber emulation): grid and cluster barriers. The
 * emulated launch is one cluster or one cooperative grid, so both meet every
 * thread of the launch (see cuda_runtime.h beside this file). */
#pragma once
#include "cuda_runtime.h"

namespace cooperative_groups {
struct grid_group {
    void sync() { emu::arrive(emu::g->grid_barrier); }
};
struct cluster_group {
    void sync() { emu::arrive(emu::g->grid_barrier); }
};
inline grid_group this_grid() { return grid_group(); }
inline cluster_group this_cluster() { return cluster_group(); }
} // namespace cooperative_groups
