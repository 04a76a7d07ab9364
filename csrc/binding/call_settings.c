/* call_settings.c - see call_settings.h. */
#include "tensor_args.h"
#include "../core/lltm_cuda_grid_layouts.h"

#include <string.h>

static int field(int64_t packed, int index, int bits)
{
    return (int)((packed >> (4 * index)) & ((1 << bits) - 1));
}

/* A size field (0 none, else log2(size) + 1) into *size; nonzero where the
 * size is not one of `allowed` (a zero-terminated list). */
static int size_field(int64_t packed, int index, const int *allowed, int *size)
{
    const int code = field(packed, index, 4);
    *size = code == 0 ? 0 : 1 << (code - 1);
    for (; *allowed; ++allowed)
        if (*size == *allowed)
            return 0;
    return code != 0;
}

int lltm_call_settings_decode(int64_t packed, lltm_call_settings *out, lltm_error *err)
{
    static const int lanes[] = {8, 16, 32, 0}, values[] = {8, 16, 32, 64, 0};
    static const int cluster_blocks[] = {16, 0}, cluster_chunk[] = {4, 8, 16, 0};
    static const int grid_chunk[] = {4, 16, 0}, block_chunk[] = {1, 4, 0};
    memset(out, 0, sizeof *out);
    if (packed == LLTM_SETTINGS_NOT_GIVEN)
        return 0;
    lltm_sequence_plan_options *o = &out->plan;
    const int flags = field(packed, 0, 4), tf32 = field(packed, 12, 4);
    out->given = true;
    out->float32_tf32 = (flags & LLTM_SETTING_TF32) != 0;
    out->deterministic = (flags & LLTM_SETTING_DETERMINISTIC) != 0;
    out->inference = (flags & LLTM_SETTING_INFERENCE) != 0;
    out->cell_matmul = field(packed, 1, 4);
    o->concurrent = field(packed, 2, 4);
    o->family = field(packed, 3, 4);
    o->grid_groups_max = field(packed, 6, 8);
    o->grid_tf32 = tf32 == 2 ? -1 : tf32;
    if (packed < 0 || (packed >> 52) != 0 || (flags & ~7) || out->cell_matmul > 2 ||
        o->concurrent > 2 || o->family > LLTM_SEQ_BLOCK || tf32 > 2 ||
        size_field(packed, 4, lanes, &o->grid_lanes) ||
        size_field(packed, 5, values, &o->grid_values) ||
        size_field(packed, 8, cluster_blocks, &o->cluster_blocks) ||
        size_field(packed, 9, cluster_chunk, &o->cluster_chunk) ||
        size_field(packed, 10, grid_chunk, &o->grid_chunk) ||
        size_field(packed, 11, block_chunk, &o->block_chunk) ||
        /* a layout of the library, or none */
        ((o->grid_lanes || o->grid_values) &&
         lltm_grid_layout_index(o->grid_lanes, o->grid_values) < 0) ||
        /* the clusters run one a batch chunk: no cap on their groups */
        (o->family == LLTM_SEQ_CLUSTER && o->grid_groups_max != 0))
        return lltm_fail(err, "settings = %lld is not a value lltm packs (-1, or the fields of "
                         "csrc/binding/call_settings.h; lltm._settings.current() gives "
                         "the settings in force)", (long long)packed);
    return 0;
}

int lltm_call_settings_query(int64_t packed, lltm_call_settings *out)
{
    lltm_error err;
    return lltm_call_settings_decode(packed, out, &err) ? LLTM_ERR_ARGUMENT : LLTM_OK;
}

/* For tests: the fields of `packed` as lltm.overrides names them, in the
 * order of lltm_sequence_plan_options then given, float32_tf32,
 * deterministic, cell_matmul; nonzero for a value decode refuses. */
__attribute__((visibility("default"))) int lltm_settings_fields(int64_t packed, int *fields)
{
    lltm_call_settings s;
    if (lltm_call_settings_query(packed, &s) != LLTM_OK)
        return -1;
    const lltm_sequence_plan_options *o = &s.plan;
    const int all[] = {o->family,      o->grid_lanes,   o->grid_values, o->grid_groups_max,
                       o->cluster_blocks, o->cluster_chunk, o->concurrent, o->grid_chunk,
                       o->block_chunk, o->eager,        o->grid_tf32,   s.given,
                       s.float32_tf32, s.deterministic, s.cell_matmul};
    memcpy(fields, all, sizeof all);
    return 0;
}
