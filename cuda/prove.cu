// The proving kernels: seeded trace, batched multi-stage NTT passes in shared memory,
// coset scatter, and device-side SHA-256 Merkle hashing. Driven by cuda/gpu.py;
// each kernel mirrors a NumPy function (trace.py, ntt.py, proof.py, merkle.py).
// Data layout: column-major, column c of a (W, n) matrix at data + c * n.
#include "goldilocks.cuh"
#include "sha256.cuh"

#define TILE 2048  // field elements per block in an NTT pass (16 KiB of shared memory)

// SplitMix64 of (seed, index), reduced into the field (trace.py: splitmix64_int).
extern "C" __global__ void gen_trace(u64* out, u64 seed, u64 count) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
        u64 z = seed + (i + 1ULL) * 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        out[i] = z >= GL_P ? z - GL_P : z;
    }
}

// One pass of `t` radix-2 stages whose half-sizes are 2^lo .. 2^(lo+t-1).
// dif != 0: Gentleman-Sande, largest half-size first: a' = a + b, b' = (a - b) w.
// dif == 0: Cooley-Tukey, smallest half-size first:  a' = a + b w, b' = a - b w.
// Twiddle for half-size h at offset j = i mod h: tw[j * n / (2h)] (tw[e] = root^e, e < n/2).
// A block holds the 2^t * r_width elements base + r + m * 2^lo (m < 2^t, r in its r range),
// which are closed under those stages. grid.x = (n / 2^(lo+t)) * (2^lo / r_width), grid.y = column.
extern "C" __global__ void ntt_pass(u64* data, const u64* tw, u32 log_n, u32 lo, u32 t, u32 r_width, u32 dif) {
    __shared__ u64 tile[TILE];
    const u64 n = 1ULL << log_n;
    u64* col = data + (u64)blockIdx.y * n;
    const u64 r_chunks = (1ULL << lo) / r_width;
    const u64 base = (blockIdx.x / r_chunks) << (lo + t);
    const u64 r0 = (blockIdx.x % r_chunks) * r_width;
    const u32 size = (1u << t) * r_width;
    for (u32 e = threadIdx.x; e < size; e += blockDim.x) {
        u32 m = e / r_width, rr = e % r_width;
        tile[e] = col[base + r0 + rr + ((u64)m << lo)];
    }
    __syncthreads();
    const u32 half = size / 2;
    for (u32 k = 0; k < t; ++k) {
        const u32 u = dif ? (t - 1 - k) : k;  // stage half-size 2^(lo+u), stride 2^u in m
        const u32 log_h = lo + u;
        const u32 tw_shift = log_n - 1 - log_h;  // n / (2h) = 2^tw_shift
        for (u32 b = threadIdx.x; b < half; b += blockDim.x) {
            u32 rr = b % r_width, bm = b / r_width;
            u32 ma = ((bm >> u) << (u + 1)) | (bm & ((1u << u) - 1u));
            u32 mb = ma + (1u << u);
            u64 j = r0 + rr + ((u64)(ma & ((1u << u) - 1u)) << lo);
            u64 w = tw[j << tw_shift];
            u32 ia = ma * r_width + rr, ib = mb * r_width + rr;
            u64 a = tile[ia], x = tile[ib];
            if (dif) {
                tile[ia] = gl_add(a, x);
                tile[ib] = gl_mul(gl_sub(a, x), w);
            } else {
                u64 y = gl_mul(x, w);
                tile[ia] = gl_add(a, y);
                tile[ib] = gl_sub(a, y);
            }
        }
        __syncthreads();
    }
    for (u32 e = threadIdx.x; e < size; e += blockDim.x) {
        u32 m = e / r_width, rr = e % r_width;
        col[base + r0 + rr + ((u64)m << lo)] = tile[e];
    }
}

// ext (W, m = n << log_blowup): ext[c, p << log_blowup] = coeffs[c, p] * scale[p], zero elsewhere.
// coeffs holds the bit-reversed unnormalised inverse DIF output; scale[p] = 7^bitrev(p) / n.
extern "C" __global__ void coset_scatter(const u64* coeffs, const u64* scale, u64* ext, u32 log_n,
                                         u32 log_blowup, u64 total) {
    const u64 m_mask = (1ULL << (log_n + log_blowup)) - 1ULL;
    const u64 b_mask = (1ULL << log_blowup) - 1ULL;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 c = i >> (log_n + log_blowup), idx = i & m_mask;
        u64 v = 0;
        if ((idx & b_mask) == 0) {
            u64 p = idx >> log_blowup;
            v = gl_mul(coeffs[(c << log_n) + p], scale[p]);
        }
        ext[i] = v;
    }
}

// digests[i] = sha256(row i of ext as little-endian u64 words), 8 state words per digest.
extern "C" __global__ void merkle_leaves(const u64* ext, u32* digests, u32 width, u64 m) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < m; i += (u64)gridDim.x * blockDim.x) {
        Sha256 s;
        sha_init(s);
        for (u32 c = 0; c < width; ++c) sha_u64_le(s, ext[(u64)c * m + i]);
        sha_final(s);
        for (int k = 0; k < 8; ++k) digests[i * 8 + k] = s.h[k];
    }
}

// out[i] = sha256(in[2i] || in[2i+1]) for i < count: one level of the tree.
extern "C" __global__ void merkle_level(const u32* in, u32* out, u64 count) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
        Sha256 s;
        sha_init(s);
        for (int k = 0; k < 16; ++k) sha_word(s, in[i * 16 + k]);
        sha_final(s);
        for (int k = 0; k < 8; ++k) out[i * 8 + k] = s.h[k];
    }
}
