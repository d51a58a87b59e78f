// Goldilocks field arithmetic (p = 2^64 - 2^32 + 1) on the device, without a 128-bit type:
// the high half of a 64x64 product comes from __umul64hi. Mirrors cuda/field.py exactly.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

#define GL_P 0xFFFFFFFF00000001ULL
#define GL_EPS 0x00000000FFFFFFFFULL  // 2^64 mod p

__device__ __forceinline__ u64 gl_add(u64 a, u64 b) {
    u64 s = a + b;
    if (s < a) s += GL_EPS;  // carry: 2^64 = 2^32 - 1 (mod p); cannot overflow again
    if (s >= GL_P) s -= GL_P;
    return s;
}

__device__ __forceinline__ u64 gl_sub(u64 a, u64 b) {
    u64 d = a - b;
    if (a < b) d -= GL_EPS;  // borrow: take the extra 2^64 = EPS back off
    return d;
}

// (hi * 2^64 + lo) mod p, using 2^64 = 2^32 - 1 and 2^96 = -1 (mod p).
__device__ __forceinline__ u64 gl_reduce128(u64 hi, u64 lo) {
    u64 hi_hi = hi >> 32;
    u64 hi_lo = hi & 0xFFFFFFFFULL;
    u64 t0 = lo - hi_hi;
    if (lo < hi_hi) t0 -= GL_EPS;
    u64 t1 = (hi_lo << 32) - hi_lo;
    u64 s = t0 + t1;
    if (s < t1) s += GL_EPS;
    if (s >= GL_P) s -= GL_P;
    return s;
}

__device__ __forceinline__ u64 gl_mul(u64 a, u64 b) {
    return gl_reduce128(__umul64hi(a, b), a * b);
}
