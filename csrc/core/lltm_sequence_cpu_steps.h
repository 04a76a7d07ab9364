/*
 * lltm_sequence_cpu_steps.h - one time step of the CPU sequence
 * (lltm_sequence_cpu_steps.c), for the time loops of lltm_sequence_cpu.c:
 * the pointwise passes of each dtype and float32's fused forward step.
 * Internal to the core; B, H, G = 3H as in lltm.h.
 */
#ifndef LLTM_CORE_SEQUENCE_CPU_STEPS_H
#define LLTM_CORE_SEQUENCE_CPU_STEPS_H

#include "lltm.h"
#include "lltm_cpu_gemm.h"

#include <stdbool.h>

/* Rows past their length at step t (t >= lengths[b]; lengths NULL: none)
 * keep their state: gates 0, c unchanged, h_t 0; the recurrent product is
 * not read for them. */
typedef struct lltm_seq_forward_args {
    int64_t B, H, t;
    const int64_t *lengths;
    const void *recurrent;
    void *gates;
    const void *bias;
    void *cell_state; /* acc, in/out: c_{t-1} -> c_t */
    void *new_h, *new_cell;
} lltm_seq_forward_args;

/* Row b at step t: past its length (t >= lengths[b]): dG 0, dL/dc passes
 * through, no bias share; at its last step (t == lengths[b] - 1, or T - 1
 * without lengths) dL/dh_t is grad_output + grad_h_n, before it
 * grad_output + grad_h (dG_{t+1} W_h). */
typedef struct lltm_seq_backward_args {
    int64_t B, H, t, T;
    const int64_t *lengths;
    const void *grad_output, *grad_h, *grad_h_n;
    void *grad_cell; /* acc, in/out: dL/dc_t -> dL/dc_{t-1} */
    const void *cell, *gates;
    void *grad_gates, *grad_bias; /* grad_bias: acc */
} lltm_seq_backward_args;

/* The functions of one dtype. */
typedef struct lltm_seq_kernels {
    size_t elem, acc; /* bytes of an element, of an accumulator */
    lltm_range_body forward, backward;
    void (*load)(int64_t n, const void *src, void *dst);  /* dtype -> acc */
    void (*store)(int64_t n, const void *src, void *dst); /* acc -> dtype */
} lltm_seq_kernels;

/* The functions of `dtype`: LLTM_OK, or LLTM_ERR_DTYPE. */
int lltm_seq_kernels_for(lltm_dtype dtype, lltm_seq_kernels *k);

/* float32's forward step in one pass per range of units: the three gate
 * blocks of h_{t-1} W_h^T for those units on the core's kernel, then the
 * pointwise pass over them while they are in cache. Ranges are of whole
 * panels (16 units). */
typedef struct lltm_seq_fused_step {
    lltm_seq_forward_args *step;
    lltm_mm mm; /* one gate block: [m,H] = h_{t-1} [m,H] packed, c at column 0 of r */
    size_t gate_floats;
    bool infer; /* keep nothing: no activations, no cells */
} lltm_seq_fused_step;

int lltm_seq_fused_step_f32(lltm_parallel_for pfor, lltm_seq_fused_step *f);

#endif /* LLTM_CORE_SEQUENCE_CPU_STEPS_H */
