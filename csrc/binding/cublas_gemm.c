/*
 * cublas_gemm.c - lltm_cuda_gemm (cublas_gemm.h): the core's products
 * through cuBLAS directly in eager calls, through aten::mm otherwise.
 *
 * cuBLAS is not linked: the library torch loaded is found by its soname
 * (dlopen with RTLD_NOLOAD, as torch_abi_loader.c finds torch), so the
 * products run on torch's own copy, whatever CUDA major torch was built for.
 * Each thread gets a handle per device, made at its first direct product
 * there and destroyed when the thread ends (torch's handles are per thread
 * too: a handle is not safe across threads). With torch's deterministic
 * algorithms on (the call's settings, call_settings.h), every product goes
 * through aten::mm.
 */
#include "cublas_gemm.h"
#include "ops.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS's ABI as far as it is used here: the values of cublas_api.h and
 * library_types.h, the same in CUDA 11, 12 and 13. */
typedef void *cublas_handle;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_GEMM_DEFAULT = -1 };
enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77, CUBLAS_COMPUTE_64F = 70 };

typedef int (*create_fn)(cublas_handle *handle);
typedef int (*destroy_fn)(cublas_handle handle);
typedef int (*set_stream_fn)(cublas_handle handle, void *stream);
typedef int (*gemm_ex_fn)(cublas_handle handle, int transa, int transb, int m, int n, int k,
                          const void *alpha, const void *A, int a_type, int lda, const void *B,
                          int b_type, int ldb, const void *beta, void *C, int c_type, int ldc,
                          int compute_type, int algo);

static struct {
    create_fn create;
    destroy_fn destroy;
    set_stream_fn set_stream;
    gemm_ex_fn gemm_ex;
} cublas;

/* Newest first: a process holds one of them, the one torch was built with. */
static const char *const cublas_sonames[] = {"libcublas.so.13", "libcublas.so.12",
                                             "libcublas.so.11"};

enum { MAX_DEVICES = 64 }; /* the per-device bits of a uint64_t */

/* What a thread holds: its handles, the devices where torch's own product
 * already ran on this thread, the devices where a handle could not be made. */
typedef struct thread_gemm {
    cublas_handle handles[MAX_DEVICES];
    uint64_t torch_ready, failed;
} thread_gemm;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool loaded;
static pthread_key_t thread_key;
static _Thread_local thread_gemm *thread_state;
static atomic_llong direct_count, torch_count;

static void destroy_thread_gemm(void *p)
{
    thread_gemm *state = (thread_gemm *)p;
    for (int d = 0; d < MAX_DEVICES; ++d)
        if (state->handles[d] != NULL)
            cublas.destroy(state->handles[d]);
    free(state);
}

/* dlsym gives a data pointer; POSIX guarantees it converts to a function
 * pointer (torch_abi_loader.c asserts the sizes match). */
static void *symbol(void *library, const char *name)
{
    return library != NULL ? dlsym(library, name) : NULL;
}

static void load(void)
{
    void *library = NULL;
    for (size_t k = 0; library == NULL && k < sizeof cublas_sonames / sizeof *cublas_sonames; ++k)
        library = dlopen(cublas_sonames[k], RTLD_LAZY | RTLD_NOLOAD);
    /* The reference RTLD_NOLOAD counted is kept: the functions are used for
     * the life of the process. */
    void *create = symbol(library, "cublasCreate_v2"), *destroy = symbol(library, "cublasDestroy_v2");
    void *set_stream = symbol(library, "cublasSetStream_v2");
    void *gemm_ex = symbol(library, "cublasGemmEx");
    if (!create || !destroy || !set_stream || !gemm_ex)
        return;
    memcpy(&cublas.create, &create, sizeof create);
    memcpy(&cublas.destroy, &destroy, sizeof destroy);
    memcpy(&cublas.set_stream, &set_stream, sizeof set_stream);
    memcpy(&cublas.gemm_ex, &gemm_ex, sizeof gemm_ex);
    loaded = pthread_key_create(&thread_key, destroy_thread_gemm) == 0;
}

static thread_gemm *this_thread(void)
{
    if (thread_state == NULL) {
        thread_gemm *state = (thread_gemm *)calloc(1, sizeof *state);
        if (state == NULL)
            return NULL;
        if (pthread_setspecific(thread_key, state) != 0) {
            free(state);
            return NULL;
        }
        thread_state = state;
    }
    return thread_state;
}

/* One operand of the row-major product as cuBLAS's column-major one: X
 * [rows, cols] with strides (rs, cs) is read as X^T, stored column-major
 * (cs == 1: op N, leading dimension rs) or as the transpose of a
 * column-major [cols, rows] (rs == 1: op T, leading dimension cs). 0 where
 * neither fits. */
static int operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *op, int *ld)
{
    if (cs == 1 && rs >= (cols > 1 ? cols : 1) && rs <= INT_MAX) {
        *op = CUBLAS_OP_N;
        *ld = (int)rs;
        return 1;
    }
    if (rs == 1 && cs >= (rows > 1 ? rows : 1) && cs <= INT_MAX) {
        *op = CUBLAS_OP_T;
        *ld = (int)cs;
        return 1;
    }
    return 0;
}

/* c [M,N] = a [M,K] b [K,N] through cuBLAS: 0 when it ran; -1 where this
 * call goes to aten::mm instead (nothing was launched then). Row-major C is
 * column-major C^T = B^T A^T. */
static int direct(const lltm_torch_gemm_ctx *ctx, lltm_dtype dtype, int64_t M, int64_t N,
                  int64_t K, const void *a, int64_t a_rs, int64_t a_cs, const void *b,
                  int64_t b_rs, int64_t b_cs, void *c, int64_t ldc)
{
    const int device = ctx->device_index;
    int op_b, ld_b, op_a, ld_a;
    /* Under torch.use_deterministic_algorithms (and where the call's settings
     * are not known) the products are aten::mm's: torch gives each of its
     * handle's streams a workspace of its own, while this thread's handle
     * takes cuBLAS's default one on every stream, which cuBLAS keeps bit for
     * bit reproducible only with one stream active. Any check torch makes
     * there (one that wants CUBLAS_WORKSPACE_CONFIG raises or warns) then
     * applies as to torch.mm. */
    if (!ctx->cublas_direct)
        return -1;
    if (pthread_once(&load_once, load) != 0 || !loaded ||
        ctx->device_type != aoti_torch_device_type_cuda() || device < 0 ||
        device >= MAX_DEVICES || M <= 0 || N <= 0 || K <= 0 || M > INT_MAX || N > INT_MAX ||
        K > INT_MAX || ldc < N || ldc > INT_MAX || !operand(K, N, b_rs, b_cs, &op_b, &ld_b) ||
        !operand(M, K, a_rs, a_cs, &op_a, &ld_a))
        return -1;
    thread_gemm *state = this_thread();
    const uint64_t bit = (uint64_t)1 << device;
    if (state == NULL || (state->failed & bit))
        return -1;
    void *stream = NULL;
    if (aoti_torch_get_current_cuda_stream(device, &stream) != 0 ||
        lltm_cuda_stream_capturing(stream))
        return -1;
    if (!(state->torch_ready & bit)) {
        /* torch makes its own handle at a thread's first product on a device,
         * which a CUDA graph captured later (products through aten::mm)
         * cannot do: this thread's first product here runs one element
         * through aten::mm first (overwritten below), so that every product
         * goes the same way, whichever call came first */
        if (lltm_torch_gemm((void *)ctx, dtype, 1, 1, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc))
            return -1;
        state->torch_ready |= bit;
    }
    if (state->handles[device] == NULL &&
        cublas.create(&state->handles[device]) != CUBLAS_STATUS_SUCCESS) {
        state->handles[device] = NULL;
        state->failed |= bit;
        return -1;
    }
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void *alpha = &one_f, *beta = &zero_f;
    int type, compute = CUBLAS_COMPUTE_32F;
    switch (dtype) {
    case LLTM_FLOAT32:
        type = CUDA_R_32F;
        /* TF32 exactly where torch lets aten::mm use it */
        if (ctx->float32_tf32)
            compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        break;
    case LLTM_FLOAT64:
        type = CUDA_R_64F;
        compute = CUBLAS_COMPUTE_64F;
        alpha = &one_d;
        beta = &zero_d;
        break;
    case LLTM_FLOAT16:
        type = CUDA_R_16F;
        break;
    case LLTM_BFLOAT16:
        type = CUDA_R_16BF;
        break;
    default:
        return -1;
    }
    cublas_handle handle = state->handles[device];
    if (cublas.set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS ||
        cublas.gemm_ex(handle, op_b, op_a, (int)N, (int)M, (int)K, alpha, b, type, ld_b, a, type,
                       ld_a, beta, c, type, (int)ldc, compute,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return 0;
}

int lltm_cuda_gemm(void *vctx, lltm_dtype dtype, int64_t M, int64_t N, int64_t K, const void *a,
                   int64_t a_rs, int64_t a_cs, const void *b, int64_t b_rs, int64_t b_cs,
                   void *c, int64_t ldc)
{
    const lltm_torch_gemm_ctx *ctx = (const lltm_torch_gemm_ctx *)vctx;
    if (direct(ctx, dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc) == 0) {
        atomic_fetch_add_explicit(&direct_count, 1, memory_order_relaxed);
        return 0;
    }
    atomic_fetch_add_explicit(&torch_count, 1, memory_order_relaxed);
    return lltm_torch_gemm(vctx, dtype, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc);
}

__attribute__((visibility("default"))) int lltm_cuda_gemm_direct_available(void)
{
    return pthread_once(&load_once, load) == 0 && loaded;
}

__attribute__((visibility("default"))) void lltm_cuda_gemm_counts(int64_t *direct_products,
                                                                  int64_t *through_torch)
{
    *direct_products = atomic_load(&direct_count);
    *through_torch = atomic_load(&torch_count);
}
