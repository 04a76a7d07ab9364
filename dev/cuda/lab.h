/*
 * lab.h - what the laboratory's CUDA programs share (dev/cuda, and
 * dev/timing's cell_tiles.cu, barrier_bench.cu, exchange_bench.cu): a CUDA
 * call checked (exit with its error), and random inputs from a seeded
 * generator.
 */
#ifndef LLTM_DEV_LAB_H
#define LLTM_DEV_LAB_H

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                \
                         cudaGetErrorString(e_));                                            \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

/* n values from N(0, scale^2) */
inline std::vector<float> random_vector(size_t n, float scale, std::mt19937 &rng)
{
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}

#endif /* LLTM_DEV_LAB_H */
