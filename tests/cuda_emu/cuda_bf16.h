/* cuda_bf16.h (emulation): storage type and conversions only. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    __nv_bfloat16 h;
    if (isnan(x)) { h.bits = 0x7fc0; return h; }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    h.bits = (uint16_t)(u >> 16);
    return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
