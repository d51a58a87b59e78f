// SHA-256 on the device over a stream of 32-bit big-endian words (messages are whole words).
// Mirrors cuda/sha256.py; a digest is kept as its 8 state words (digest bytes = words big-endian).
#pragma once

#include "goldilocks.cuh"

__constant__ u32 SHA_K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

__device__ __forceinline__ u32 rotr32(u32 x, u32 r) { return (x >> r) | (x << (32u - r)); }

__device__ __forceinline__ u32 bswap32(u32 x) { return __byte_perm(x, 0, 0x0123); }

struct Sha256 {
    u32 h[8];
    u32 w[16];
    u32 fill;   // words in w
    u32 words;  // message words so far
};

__device__ __forceinline__ void sha_init(Sha256& s) {
    s.h[0] = 0x6a09e667u; s.h[1] = 0xbb67ae85u; s.h[2] = 0x3c6ef372u; s.h[3] = 0xa54ff53au;
    s.h[4] = 0x510e527fu; s.h[5] = 0x9b05688cu; s.h[6] = 0x1f83d9abu; s.h[7] = 0x5be0cd19u;
    s.fill = 0;
    s.words = 0;
}

__device__ void sha_compress(u32* h, u32* w) {
    u32 a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        u32 wi;
        if (i < 16) {
            wi = w[i];
        } else {  // rolling 16-word schedule, in place
            u32 w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
            u32 s0 = rotr32(w15, 7) ^ rotr32(w15, 18) ^ (w15 >> 3);
            u32 s1 = rotr32(w2, 17) ^ rotr32(w2, 19) ^ (w2 >> 10);
            wi = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
            w[i & 15] = wi;
        }
        u32 S1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
        u32 ch = (e & f) ^ (~e & g);
        u32 t1 = hh + S1 + ch + SHA_K[i] + wi;
        u32 S0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
        u32 mj = (a & b) ^ (a & c) ^ (b & c);
        u32 t2 = S0 + mj;
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

__device__ __forceinline__ void sha_raw(Sha256& s, u32 word) {
    s.w[s.fill++] = word;
    if (s.fill == 16) {
        sha_compress(s.h, s.w);
        s.fill = 0;
    }
}

__device__ __forceinline__ void sha_word(Sha256& s, u32 word) {
    sha_raw(s, word);
    s.words++;
}

// A field element as its 8 little-endian bytes: two big-endian SHA words.
__device__ __forceinline__ void sha_u64_le(Sha256& s, u64 v) {
    sha_word(s, bswap32((u32)v));
    sha_word(s, bswap32((u32)(v >> 32)));
}

__device__ __forceinline__ void sha_final(Sha256& s) {
    u64 bits = (u64)s.words * 32ULL;
    sha_raw(s, 0x80000000u);
    while (s.fill != 14) sha_raw(s, 0u);
    sha_raw(s, (u32)(bits >> 32));
    sha_raw(s, (u32)bits);
}
