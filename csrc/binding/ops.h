/*
 * ops.h - the lltm operators (one contract for every device: their tables
 * in ops.c, from which register.c writes the schemas) and the boxed kernels
 * that implement them per device.
 *
 * A boxed kernel takes its arguments from stack[0..num_args) (tensor
 * handles it owns) and leaves its results in stack[0..num_outputs).
 */
#ifndef LLTM_BINDING_OPS_H
#define LLTM_BINDING_OPS_H

#include "tensor_args.h"

#define LLTM_NAMESPACE "lltm"

/* LLTM_KERNELS(X) calls X(operator, CPU kernel, CUDA kernel) for every
 * operator (its lltm_op: lltm_<operator>_op); a lengths overload runs the
 * kernels of its operator (the argument count tells them apart). */
#define LLTM_KERNELS(X)                                                                    \
    X(cell_forward, lltm_cell_forward_cpu, lltm_cell_forward_cuda)                         \
    X(cell_backward, lltm_cell_backward_cpu, lltm_cell_backward_cuda)                      \
    X(sequence_forward, lltm_sequence_forward_cpu_boxed, lltm_sequence_forward_cuda_boxed) \
    X(sequence_backward, lltm_sequence_backward_cpu_boxed, lltm_sequence_backward_cuda_boxed) \
    X(sequence_backward_gates, lltm_sequence_backward_gates_cpu_boxed,                     \
      lltm_sequence_backward_gates_cuda_boxed)                                             \
    X(stack_forward, lltm_stack_forward_cpu_boxed, lltm_stack_forward_cuda_boxed)          \
    X(stack_backward, lltm_stack_backward_cpu_boxed, lltm_stack_backward_cuda_boxed)

typedef void (*lltm_boxed_kernel)(StableIValue *stack, uint64_t num_args,
                                  uint64_t num_outputs);

/* The CPU kernels are in liblltm.so, the CUDA ones in liblltm_cuda.so. */
#define LLTM_DECLARE_KERNELS(op, cpu, cuda)                                       \
    void cpu(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);     \
    void cuda(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);
LLTM_KERNELS(LLTM_DECLARE_KERNELS)
#undef LLTM_DECLARE_KERNELS

#endif /* LLTM_BINDING_OPS_H */
