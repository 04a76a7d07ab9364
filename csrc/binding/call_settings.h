/*
 * call_settings.h - the settings one operator call runs with: every
 * operator's last argument, `int settings` (ops.h), one packed integer.
 *
 * The stable C ABI reads none of torch's global settings, and the library
 * keeps no copy of them: lltm's Python reads them with each call and packs
 * them with the constraints of lltm.overrides (lltm/_settings.py), so a
 * result never depends on what ran before it. A graph traced by
 * torch.compile holds the value read when it was traced, and torch traces
 * anew when TF32 or deterministic mode change (it guards on both).
 *
 * LLTM_SETTINGS_NOT_GIVEN (-1, the schemas' default; what an exported
 * program passes, as it may run under other settings than it was exported
 * under): every matrix product through aten::mm, which reads torch's TF32
 * and deterministic settings itself when it runs; the library's own kernels
 * keep float32 in float32; nothing forced; the device to the layer alone.
 *
 * Otherwise fields of 4 bits, from the lowest (a size is coded 0 for none,
 * else log2(size) + 1):
 *   0      flags: LLTM_SETTING_TF32 (float32 products may run on TF32,
 *          torch.backends.cuda.matmul), LLTM_SETTING_DETERMINISTIC
 *          (torch.use_deterministic_algorithms, warn-only too),
 *          LLTM_SETTING_INFERENCE (a forward whose results no backward
 *          reads: the CPU library neither makes nor writes what it keeps
 *          for one, which comes back undefined; lltm sets it on eager CPU
 *          calls without gradients)
 *   1      the cell's matrix-product route: LLTM_MATMUL_AUTO, _FUSED, _CUBLAS
 *   2      layers running at once on the device (0 or 1: one; 2)
 *   3      family (lltm_sequence_plan_options, csrc/core/lltm.h: 0 any)
 *   4, 5   grid_lanes, grid_values (sizes: a layout of
 *          csrc/core/lltm_cuda_grid_layouts.h, or both 0)
 *   6 - 7  grid_groups_max (8 bits, 0 - 255; 0 with the cluster family)
 *   8 - 11 cluster_blocks, cluster_chunk, grid_chunk, block_chunk (sizes)
 *   12     grid_tf32: 0 free, 1 only the TF32 build, 2 only FFMA
 */
#ifndef LLTM_BINDING_CALL_SETTINGS_H
#define LLTM_BINDING_CALL_SETTINGS_H

#include "../core/lltm.h"

#include <stdbool.h>

typedef struct lltm_error lltm_error; /* (tensor_args.h) */

#define LLTM_SETTINGS_NOT_GIVEN (-1)
#define LLTM_SCHEMA_SETTINGS "int settings=-1"

enum { LLTM_SETTING_TF32 = 1, LLTM_SETTING_DETERMINISTIC = 2, LLTM_SETTING_INFERENCE = 4 };
enum { LLTM_MATMUL_AUTO = 0, LLTM_MATMUL_FUSED = 1, LLTM_MATMUL_CUBLAS = 2 };

typedef struct lltm_call_settings {
    bool given;         /* false: LLTM_SETTINGS_NOT_GIVEN */
    bool float32_tf32;  /* float32 products may run on TF32 tensor cores */
    bool deterministic; /* every product through aten::mm */
    bool inference;     /* nothing kept for a backward (CPU) */
    int cell_matmul;    /* LLTM_MATMUL_* */
    lltm_sequence_plan_options plan; /* constraints and concurrent layers; eager 0 */
} lltm_call_settings;

/* `packed` into *out; nonzero with a message for a value no field allows. */
int lltm_call_settings_decode(int64_t packed, lltm_call_settings *out, lltm_error *err);

/* The same for the *_in_force queries (ctypes, no message to give):
 * LLTM_OK, or LLTM_ERR_ARGUMENT for a value no field allows. */
int lltm_call_settings_query(int64_t packed, lltm_call_settings *out);

#endif /* LLTM_BINDING_CALL_SETTINGS_H */
