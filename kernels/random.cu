// Random number kernels (see backend/core/src/kernels/random.rs): uniform, normal, bernoulli
// and uniform_int on strided outputs. `common.cuh` is prepended.
//
// Generator: Philox4x32-10 (Salmon et al., Random123). The key is the 64-bit seed
// (lo, hi words); output element `i` (row-major linear index of the logical shape) takes
// word `i % 4` of the block whose 128-bit counter is
//     [lo32(c), hi32(c), carry, stream]   with   c = offset + i / 4   (carry: the add's
// overflow bit), `stream` 0 for the main word and 1 for a second, independent word (the
// low bits of f64 uniforms, the low half of 64-bit integers). Each thread computes one
// block and writes its (up to) four elements, so results do not depend on the launch
// configuration. The host mirrors all of this (`philox4x32_10` in random.rs).

__device__ __forceinline__ i64 off(const Layout& l, i64 i) {
    return l.rank <= 1 ? l.offset + i * l.strides[0] : offset_of(l, i);
}

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        u32 hi0 = __umulhi(0xD2511F53u, c.x);
        u32 lo0 = 0xD2511F53u * c.x;
        u32 hi1 = __umulhi(0xCD9E8D57u, c.z);
        u32 lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

// The four words of block `b` (elements 4b .. 4b+3) in `stream`.
__device__ __forceinline__ void block_words(u64 offset, u64 seed, i64 b, u32 stream, u32 w[4]) {
    u64 c = offset + (u64)b;
    u32 carry = c < offset ? 1u : 0u;
    uint4 r = philox4x32_10(make_uint4((u32)c, (u32)(c >> 32), carry, stream), (u32)seed, (u32)(seed >> 32));
    w[0] = r.x;
    w[1] = r.y;
    w[2] = r.z;
    w[3] = r.w;
}

// [0, 1) with 24 bits / 53 bits; (0, 1] variants for the log of Box-Muller.
__device__ __forceinline__ float u24(u32 w) { return (float)(w >> 8) * 5.9604644775390625e-8f; }
__device__ __forceinline__ float u24_open0(u32 w) { return (float)((w >> 8) + 1u) * 5.9604644775390625e-8f; }
__device__ __forceinline__ double u53(u32 hi, u32 lo) {
    return (double)((((u64)hi << 32) | lo) >> 11) * 1.1102230246251565e-16;
}
__device__ __forceinline__ double u53_open0(u32 hi, u32 lo) {
    return (double)(((((u64)hi << 32) | lo) >> 11) + 1ull) * 1.1102230246251565e-16;
}

// Loops over the blocks of n outputs; in the body `w` holds the block's stream-0 words,
// `w2` (when WIDE) its stream-1 words (else zeros), `j` the word and `o` the element offset
// of element 4b+j. The body is variadic so that it may contain commas.
#define FOR_EACH_BLOCK(WIDE, ...)                                                   \
    i64 nb = (n + 3) / 4;                                                           \
    FOR_EACH(b, nb) {                                                               \
        u32 w[4], w2[4];                                                            \
        block_words(offset, seed, b, 0u, w);                                        \
        if (WIDE) block_words(offset, seed, b, 1u, w2);                             \
        else { w2[0] = w2[1] = w2[2] = w2[3] = 0u; }                                \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) {                             \
            i64 i = 4 * b + j;                                                      \
            if (i < n) {                                                            \
                i64 o = off(lo, i);                                                 \
                __VA_ARGS__                                                         \
            }                                                                       \
        }                                                                           \
    }

// ---------------------------------------------------------------------------------------
// uniform: low + range * u, clamped to [lo_c, hi_c] (the dtype's values inside
// [low, high), so `high` never comes out; for a range holding none of them, the two
// values around it)

KERNEL void uniform_f32(float* out, Layout lo, i64 n, u64 offset, u64 seed, double low,
                                       double range, double lo_c, double hi_c) {
    float l = (float)low, r = (float)range, a = (float)lo_c, z = (float)hi_c;
    FOR_EACH_BLOCK(false, {
        float v = __fmaf_rn(u24(w[j]), r, l);
        out[o] = fminf(fmaxf(v, a), z);
    })
}

KERNEL void uniform_f64(double* out, Layout lo, i64 n, u64 offset, u64 seed, double low,
                                       double range, double lo_c, double hi_c) {
    FOR_EACH_BLOCK(true, {
        double v = __fma_rn(u53(w[j], w2[j]), range, low);
        out[o] = fmin(fmax(v, lo_c), hi_c);
    })
}

#define UNIFORM_HALF(NAME, TO, FROM)                                                          \
    KERNEL void NAME(u16* out, Layout lo, i64 n, u64 offset, u64 seed, double low,                \
                                    double range, double lo_c, double hi_c) {                 \
        float l = (float)low, r = (float)range, a = (float)lo_c, z = (float)hi_c;            \
        u16 ab = TO(a), zb = TO(z);                                                           \
        FOR_EACH_BLOCK(false, {                                                               \
            u16 h = TO(__fmaf_rn(u24(w[j]), r, l));                                           \
            float f = FROM(h);                                                                \
            out[o] = f < a ? ab : (f > z ? zb : h);                                           \
        })                                                                                    \
    }

UNIFORM_HALF(uniform_f16, f32_to_f16, f16_to_f32)
UNIFORM_HALF(uniform_bf16, f32_to_bf16, bf16_to_f32)

// ---------------------------------------------------------------------------------------
// normal: Box-Muller on the word pairs (0, 1) and (2, 3): even j takes the cosine, odd j
// the sine of the pair's angle; mean + std * z.

__device__ __forceinline__ float normal32(const u32 w[4], int j) {
    int p = j & ~1;
    float rad = sqrtf(-2.0f * logf(u24_open0(w[p])));
    float s, c;
    sincospif(2.0f * u24(w[p + 1]), &s, &c);
    return rad * ((j & 1) ? s : c);
}

KERNEL void normal_f32(float* out, Layout lo, i64 n, u64 offset, u64 seed, double mean,
                                      double std) {
    float m = (float)mean, sd = (float)std;
    FOR_EACH_BLOCK(false, { out[o] = __fmaf_rn(normal32(w, j), sd, m); })
}

KERNEL void normal_f64(double* out, Layout lo, i64 n, u64 offset, u64 seed, double mean,
                                      double std) {
    FOR_EACH_BLOCK(true, {
        int p = j & ~1;
        double rad = sqrt(-2.0 * log(u53_open0(w[p], w2[p])));
        double s, c;
        sincospi(2.0 * u53(w[p + 1], w2[p + 1]), &s, &c);
        out[o] = __fma_rn(rad * ((j & 1) ? s : c), std, mean);
    })
}

#define NORMAL_HALF(NAME, TO)                                                                   \
    KERNEL void NAME(u16* out, Layout lo, i64 n, u64 offset, u64 seed, double mean,                \
                                    double std) {                                               \
        float m = (float)mean, sd = (float)std;                                                 \
        FOR_EACH_BLOCK(false, { out[o] = TO(__fmaf_rn(normal32(w, j), sd, m)); })              \
    }

NORMAL_HALF(normal_f16, f32_to_f16)
NORMAL_HALF(normal_bf16, f32_to_bf16)

// ---------------------------------------------------------------------------------------
// bernoulli: `one` (the dtype's bit pattern of 1) when word < thr (= p * 2^32), else 0.

#define BERNOULLI(B, T)                                                                          \
    KERNEL void bernoulli_b##B(T* out, Layout lo, i64 n, u64 offset, u64 seed,                    \
                                              u64 thr, u64 one) {                                \
        T t = (T)one;                                                                            \
        FOR_EACH_BLOCK(false, { out[o] = (u64)w[j] < thr ? t : (T)0; })                           \
    }

BERNOULLI(1, u8)
BERNOULLI(2, u16)
BERNOULLI(4, u32)
BERNOULLI(8, u64)

// ---------------------------------------------------------------------------------------
// uniform_int: low + floor(x * range / 2^k) with x a 32-bit word (k = 32) or, when `wide`
// (range > 2^32), a 64-bit value (stream-0 word high, stream-1 word low; k = 64).

#define UNIFORM_INT(B, T)                                                                          \
    KERNEL void uniform_int_b##B(T* out, Layout lo, i64 n, u64 offset, u64 seed,                    \
                                                i64 low, u64 range, int wide) {                    \
        FOR_EACH_BLOCK(wide != 0, {                                                                \
            u64 v = wide ? __umul64hi(((u64)w[j] << 32) | w2[j], range) : (((u64)w[j] * range) >> 32); \
            out[o] = (T)((u64)low + v);                                                            \
        })                                                                                         \
    }

UNIFORM_INT(1, u8)
UNIFORM_INT(4, u32)
UNIFORM_INT(8, u64)
