/*
 * lltm_cuda_cluster.cuh - the thread-block-cluster primitives of the
 * persistent sequence kernels (lltm_cuda_sequence_cluster_*.cuh): transaction barriers
 * (mbarrier) in a block's shared memory, and 16-byte st.async stores into
 * another block's shared memory that complete on that block's mbarrier.
 * PTX on the GPU; the fiber emulator's (tests/cuda_emu) where
 * LLTM_CUDA_EMULATION is defined. scripts/exchange_bench.cu times them alone.
 */
#ifndef LLTM_CORE_CUDA_CLUSTER_CUH
#define LLTM_CORE_CUDA_CLUSTER_CUH

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

#if defined(LLTM_CUDA_EMULATION)
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    emu::mbar_init(bar, count);
}
__device__ __forceinline__ void mbar_fence_init() {}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes)
{
    emu::mbar_arrive_expect_tx(bar, bytes);
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    emu::mbar_wait(bar, parity);
}
/* 16 bytes at src (this block's shared memory) to dst in block `rank`
 * (dst and bar: addresses in this block's shared memory, mapped) */
__device__ __forceinline__ void send16(const void *src, void *dst, uint64_t *bar, int rank)
{
    emu::st_async16(src, dst, bar, rank);
}
#else
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
/* CTA-scope acquire (the default), as CUTLASS waits for data other blocks
 * deliver to this block's shared memory with complete_tx: the cluster-scope
 * form adds an L1 invalidation (CCTL.IVALL) after every wait, which the
 * profile showed costing ~12% of the forward; the bytes waited for are in
 * this block's shared memory, counted on this block's mbarrier. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n\t.reg .pred done;\n"
                 "LLTM_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra LLTM_WAIT_%=;\n}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
/* the 16 bytes `bits` to dst in block `rank` (dst and bar: addresses in this
 * block's shared memory, mapped), complete_tx(16) on its mbarrier */
__device__ __forceinline__ void st_async16(uint4 bits, void *dst, uint64_t *bar, int rank)
{
    uint32_t remote_dst, remote_bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote_dst)
                 : "r"(smem_addr(dst)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote_bar)
                 : "r"(smem_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], "
                 "{%1, %2, %3, %4}, [%5];" ::"r"(remote_dst),
                 "r"(bits.x), "r"(bits.y), "r"(bits.z), "r"(bits.w), "r"(remote_bar)
                 : "memory");
}
__device__ __forceinline__ void send16(const void *src, void *dst, uint64_t *bar, int rank)
{
    st_async16(*reinterpret_cast<const uint4 *>(src), dst, bar, rank);
}
#endif

/* send16 of the 16 bytes held in registers v (PK values of A) */
template <typename A, int PK>
__device__ __forceinline__ void send16v(const A (&v)[PK], void *dst, uint64_t *bar, int rank)
{
    static_assert(PK * sizeof(A) == 16, "16 bytes");
#if defined(LLTM_CUDA_EMULATION)
    alignas(16) A piece[PK];
    for (int e = 0; e < PK; ++e)
        piece[e] = v[e];
    send16(piece, dst, bar, rank);
#else
    uint4 bits;
    if constexpr (sizeof(A) == 4) {
        bits = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                          __float_as_uint(v[3]));
    } else {
        bits = make_uint4((unsigned)__double2loint(v[0]), (unsigned)__double2hiint(v[0]),
                          (unsigned)__double2loint(v[1]), (unsigned)__double2hiint(v[1]));
    }
    st_async16(bits, dst, bar, rank);
#endif
}

} // namespace

#endif /* LLTM_CORE_CUDA_CLUSTER_CUH */
