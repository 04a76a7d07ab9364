/*
 * sequence_cuda.h - what the CUDA kernels of the sequence and stack
 * operators share (csrc/binding/sequence_cuda.c): the plan of one layer on
 * the call's device and stream, under the call's settings.
 */
#ifndef LLTM_BINDING_SEQUENCE_CUDA_H
#define LLTM_BINDING_SEQUENCE_CUDA_H

#include "sequence_args.h"

/* The properties of `device` (asked once per device: what the device is)
 * and what settings `s` allow of them (dev->tf32, with each call). */
int lltm_cuda_device_for(int device, const lltm_call_settings *s, lltm_cuda_device *dev);

/* The options of a call with settings `s` on `stream` (NULL: torch's
 * current stream of `device`): the constraints and concurrent layers of
 * the settings, and whether the call is eager (the stream not captured:
 * the host's time to issue a plan counts, lltm.h). */
void lltm_cuda_plan_options(lltm_sequence_plan_options *o, const lltm_call_settings *s,
                            int device, void *stream);

/* The plan of one layer of these sizes on `device` for a call with
 * settings `s` on `stream` (NULL: torch's current stream), with the device's
 * properties in *dev and, unless NULL, whether the call is eager in *eager:
 * an lltm_status (LLTM_ERR_ARGUMENT: no plan of a forced family fits). */
int lltm_cuda_layer_plan(const lltm_call_settings *s, int device, void *stream,
                         lltm_dtype dtype, int64_t T, int64_t B, int64_t I, int64_t H,
                         lltm_cuda_device *dev, lltm_sequence_plan *plan, int *eager);

/* The plan of one layer of sizes d on `device`, for a call with settings
 * `s` on `stream`; nonzero with a message when no plan of a forced family
 * fits. */
int lltm_cuda_choose_plan(const lltm_sequence_dims *d, const lltm_call_settings *s, int device,
                          void *stream, lltm_sequence_plan *plan, lltm_error *err);

#endif /* LLTM_BINDING_SEQUENCE_CUDA_H */
