/* cuda_fp16.h (emulation): storage type and conversions only. */
#pragma once
#include <stdint.h>
#include <string.h>
struct __half { uint16_t bits; };
inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half_rn(float x)
{
    _Float16 f = (_Float16)x; /* round to nearest even */
    __half h;
    memcpy(&h.bits, &f, 2);
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
