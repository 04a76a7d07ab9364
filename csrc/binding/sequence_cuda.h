/*
 * sequence_cuda.h - what the CUDA kernels of the sequence and stack
 * operators share (csrc/binding/sequence_cuda.c): the plan of one layer on
 * the call's device and stream, with the constraints of lltm.overrides.
 */
#ifndef LLTM_BINDING_SEQUENCE_CUDA_H
#define LLTM_BINDING_SEQUENCE_CUDA_H

#include "sequence_args.h"

/* The options a call on `stream` (NULL: torch's current stream of `device`)
 * plans with: lltm.overrides' constraints, the calling thread's concurrent
 * layers, whether the call is eager. */
void lltm_cuda_plan_options(lltm_sequence_plan_options *o, int device, void *stream);

/* The plan of one layer of sizes d on `device`, for a call on `stream`;
 * nonzero with a message when no plan of a forced family fits. */
int lltm_cuda_choose_plan(const lltm_sequence_dims *d, int device, void *stream,
                          lltm_sequence_plan *plan, lltm_error *err);

#endif /* LLTM_BINDING_SEQUENCE_CUDA_H */
