/* cooperative_groups.h (fiber emulation): grid and cluster barriers, and
 * the cluster's distributed shared memory. Both barriers meet every thread of
 * the launch (a cooperative grid, or clusters along x: stronger than the
 * hardware's cluster barrier), and a block's cluster rank is its block index
 * modulo the cluster size (see cuda_runtime.h beside this file). */
#pragma once
#include "cuda_runtime.h"

namespace cooperative_groups {
struct grid_group {
    void sync() { emu::grid_sync(); }
};
struct cluster_group {
    void sync() { emu::grid_sync(); }
    void barrier_arrive() { emu::grid_arrive(); }
    void barrier_wait() { emu::grid_wait(); }
    unsigned block_rank() const { return emu::current->block % emu::g->cluster_blocks; }
    unsigned num_blocks() const { return emu::g->cluster_blocks; }
    template <typename T> T *map_shared_rank(T *addr, int rank) const
    {
        return emu::map_shared_rank(addr, rank);
    }
};
inline grid_group this_grid() { return grid_group(); }
inline cluster_group this_cluster() { return cluster_group(); }
} // namespace cooperative_groups
