// Linear-algebra and quantization kernels (see backend/core/src/kernels/linalg.rs): integer
// and exact float batched matmul, 3-vector cross product, and symmetric int8 quantize /
// dequantize. `common.cuh` is prepended.

// ---------------------------------------------------------------------------------------
// int_matmul: c[z, m, n] = sum_k a[z, m, k] * b[z, k, n] with wrapping (two's complement)
// arithmetic, accumulated in 64 bits (unsigned, so overflow is defined). One 16x16 block
// per output tile, shared-memory tiles of a and b; grid-stride loops over the batch (z),
// the row tiles (y) and the column tiles (x). The batch layouts map a batch index to each
// operand's base offset (stride 0 on broadcast batch dims).

#define MM_TILE 16

#define INT_MATMUL(DT, T)                                                                     \
    KERNEL void int_matmul_##DT(const T* a, const T* b, T* c, Layout la,                      \
                                               Layout lb, Layout lc, i64 batches, i64 M,      \
                                               i64 N, i64 K, i64 sam, i64 sak, i64 sbk,       \
                                               i64 sbn, i64 scm, i64 scn) {                   \
        __shared__ T as_[MM_TILE][MM_TILE];                                                   \
        __shared__ T bs_[MM_TILE][MM_TILE + 1];                                               \
        const int tx = threadIdx.x, ty = threadIdx.y;                                         \
        const i64 mt = (M + MM_TILE - 1) / MM_TILE, nt = (N + MM_TILE - 1) / MM_TILE;         \
        for (i64 z = blockIdx.z; z < batches; z += gridDim.z) {                               \
            const T* ab = a + offset_of(la, z);                                               \
            const T* bb = b + offset_of(lb, z);                                               \
            T* cb = c + offset_of(lc, z);                                                     \
            for (i64 ti = blockIdx.y; ti < mt; ti += gridDim.y) {                             \
                for (i64 tj = blockIdx.x; tj < nt; tj += gridDim.x) {                         \
                    const i64 row = ti * MM_TILE + ty, col = tj * MM_TILE + tx;               \
                    u64 acc = 0;                                                              \
                    for (i64 k0 = 0; k0 < K; k0 += MM_TILE) {                                 \
                        const i64 ka = k0 + tx, kb = k0 + ty;                                 \
                        as_[ty][tx] = (row < M && ka < K) ? ab[row * sam + ka * sak] : (T)0;  \
                        bs_[ty][tx] = (kb < K && col < N) ? bb[kb * sbk + col * sbn] : (T)0;  \
                        __syncthreads();                                                      \
                        _Pragma("unroll") for (int kk = 0; kk < MM_TILE; ++kk) {              \
                            acc += (u64)(i64)as_[ty][kk] * (u64)(i64)bs_[kk][tx];             \
                        }                                                                     \
                        __syncthreads();                                                      \
                    }                                                                         \
                    if (row < M && col < N) cb[row * scm + col * scn] = (T)acc;               \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

INT_MATMUL(i64, i64)
INT_MATMUL(i32, i32)

// ---------------------------------------------------------------------------------------
// matmul: the float counterpart of int_matmul (same tiling, batching and strides), with
// every product and sum computed in double (no TF32, no reduced precision) and rounded
// once to T at the store. Products of f32 / f16 / bf16 values are exact in double, so the
// result is the exact sum up to double rounding; f64 is an ordinary FMA-accumulated GEMM.

__device__ __forceinline__ double mm_ld_f32(float v) { return (double)v; }
__device__ __forceinline__ double mm_ld_f64(double v) { return v; }
__device__ __forceinline__ double mm_ld_f16(u16 v) { return (double)f16_to_f32(v); }
__device__ __forceinline__ double mm_ld_bf16(u16 v) { return (double)bf16_to_f32(v); }
__device__ __forceinline__ float mm_st_f32(double v) { return (float)v; }
__device__ __forceinline__ double mm_st_f64(double v) { return v; }
__device__ __forceinline__ u16 mm_st_f16(double v) { return f32_to_f16((float)v); }
__device__ __forceinline__ u16 mm_st_bf16(double v) { return f32_to_bf16((float)v); }

#define FLOAT_MATMUL(DT, T)                                                                   \
    KERNEL void matmul_##DT(const T* a, const T* b, T* c, Layout la,                          \
                                           Layout lb, Layout lc, i64 batches, i64 M, i64 N,   \
                                           i64 K, i64 sam, i64 sak, i64 sbk, i64 sbn,         \
                                           i64 scm, i64 scn) {                                \
        __shared__ double as_[MM_TILE][MM_TILE + 1];                                          \
        __shared__ double bs_[MM_TILE][MM_TILE + 1];                                          \
        const int tx = threadIdx.x, ty = threadIdx.y;                                         \
        const i64 mt = (M + MM_TILE - 1) / MM_TILE, nt = (N + MM_TILE - 1) / MM_TILE;         \
        for (i64 z = blockIdx.z; z < batches; z += gridDim.z) {                               \
            const T* ab = a + offset_of(la, z);                                               \
            const T* bb = b + offset_of(lb, z);                                               \
            T* cb = c + offset_of(lc, z);                                                     \
            for (i64 ti = blockIdx.y; ti < mt; ti += gridDim.y) {                             \
                for (i64 tj = blockIdx.x; tj < nt; tj += gridDim.x) {                         \
                    const i64 row = ti * MM_TILE + ty, col = tj * MM_TILE + tx;               \
                    double acc = 0.0;                                                         \
                    for (i64 k0 = 0; k0 < K; k0 += MM_TILE) {                                 \
                        const i64 ka = k0 + tx, kb = k0 + ty;                                 \
                        as_[ty][tx] =                                                         \
                            (row < M && ka < K) ? mm_ld_##DT(ab[row * sam + ka * sak]) : 0.0; \
                        bs_[ty][tx] =                                                         \
                            (kb < K && col < N) ? mm_ld_##DT(bb[kb * sbk + col * sbn]) : 0.0; \
                        __syncthreads();                                                      \
                        _Pragma("unroll") for (int kk = 0; kk < MM_TILE; ++kk) {              \
                            acc = fma(as_[ty][kk], bs_[kk][tx], acc);                         \
                        }                                                                     \
                        __syncthreads();                                                      \
                    }                                                                         \
                    if (row < M && col < N) cb[row * scm + col * scn] = mm_st_##DT(acc);      \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

FLOAT_MATMUL(f32, float)
FLOAT_MATMUL(f64, double)
FLOAT_MATMUL(f16, u16)
FLOAT_MATMUL(bf16, u16)

// ---------------------------------------------------------------------------------------
// cross3: out = a x b along one axis of size 3. The layouts run over out's dims with the
// axis removed (a and b broadcast, stride 0); `sa`, `sb`, `so` step along the axis.
// f32 and f64 compute in double, f16 and bf16 in float.

__device__ __forceinline__ double cx_ld_f32(float v) { return (double)v; }
__device__ __forceinline__ float cx_st_f32(double v) { return (float)v; }
__device__ __forceinline__ double cx_ld_f64(double v) { return v; }
__device__ __forceinline__ double cx_st_f64(double v) { return v; }
__device__ __forceinline__ float cx_ld_f16(u16 v) { return f16_to_f32(v); }
__device__ __forceinline__ u16 cx_st_f16(float v) { return f32_to_f16(v); }
__device__ __forceinline__ float cx_ld_bf16(u16 v) { return bf16_to_f32(v); }
__device__ __forceinline__ u16 cx_st_bf16(float v) { return f32_to_bf16(v); }

#define CROSS3(DT, T, ACC)                                                                    \
    KERNEL void cross3_##DT(const T* a, const T* b, T* out, Layout la,                        \
                                           Layout lb, Layout lo, i64 sa, i64 sb, i64 so,      \
                                           i64 n) {                                           \
        FOR_EACH(i, n) {                                                                      \
            const T* pa = a + offset_of(la, i);                                               \
            const T* pb = b + offset_of(lb, i);                                               \
            T* po = out + offset_of(lo, i);                                                   \
            const ACC a0 = cx_ld_##DT(pa[0]), a1 = cx_ld_##DT(pa[sa]),                        \
                      a2 = cx_ld_##DT(pa[2 * sa]);                                            \
            const ACC b0 = cx_ld_##DT(pb[0]), b1 = cx_ld_##DT(pb[sb]),                        \
                      b2 = cx_ld_##DT(pb[2 * sb]);                                            \
            po[0] = cx_st_##DT(a1 * b2 - a2 * b1);                                            \
            po[so] = cx_st_##DT(a2 * b0 - a0 * b2);                                           \
            po[2 * so] = cx_st_##DT(a0 * b1 - a1 * b0);                                       \
        }                                                                                     \
    }

CROSS3(f32, float, double)
CROSS3(f64, double, double)
CROSS3(f16, u16, float)
CROSS3(bf16, u16, float)

// ---------------------------------------------------------------------------------------
// Symmetric int8 quantization (burn's Q8S: range [-127, 127]) on packed row-major data,
// in blocks of `block` consecutive elements (one scale each):
//   scale = (2 * max|x|) / 254   (f32; 0 becomes 0.1, as burn-ndarray's valid_scale)
//   q     = clamp(roundf(x / scale), -127, 127)   (round half away from zero; NaN -> 0)
//   x'    = scale * q
// Values are converted to f32 first (exact for f16/bf16).

__device__ __forceinline__ float q_ld_f32(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float q_ld_f64(const double* p, i64 i) { return (float)p[i]; }
__device__ __forceinline__ float q_ld_f16(const u16* p, i64 i) { return f16_to_f32(p[i]); }
__device__ __forceinline__ float q_ld_bf16(const u16* p, i64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void q_st_f32(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void q_st_f64(double* p, i64 i, float v) { p[i] = (double)v; }
__device__ __forceinline__ void q_st_f16(u16* p, i64 i, float v) { p[i] = f32_to_f16(v); }
__device__ __forceinline__ void q_st_bf16(u16* p, i64 i, float v) { p[i] = f32_to_bf16(v); }

__device__ __forceinline__ float sym_scale(float max_abs) {
    float s = (max_abs * 2.0f) / 254.0f;
    return s == 0.0f ? 0.1f : s;
}

// Threads per block of `quant_scales_*` (the launch must match).
#define QS_THREADS 256

#define QUANT(DT, T)                                                                          \
    KERNEL void quant_scales_##DT(const T* x, float* scales, i64 block,                       \
                                                 i64 nblocks) {                               \
        __shared__ float red[QS_THREADS];                                                     \
        for (i64 bi = blockIdx.x; bi < nblocks; bi += gridDim.x) {                            \
            const T* xb = x + bi * block;                                                     \
            float m = 0.0f;                                                                   \
            for (i64 j = threadIdx.x; j < block; j += QS_THREADS) {                           \
                m = fmaxf(m, fabsf(q_ld_##DT(xb, j)));                                        \
            }                                                                                 \
            red[threadIdx.x] = m;                                                             \
            __syncthreads();                                                                  \
            for (int s = QS_THREADS / 2; s > 0; s >>= 1) {                                    \
                if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); \
                __syncthreads();                                                              \
            }                                                                                 \
            if (threadIdx.x == 0) scales[bi] = sym_scale(red[0]);                             \
            __syncthreads();                                                                  \
        }                                                                                     \
    }                                                                                         \
    KERNEL void quantize_##DT(const T* x, const float* scales, i8* out,                       \
                                             i64 block, i64 n) {                              \
        FOR_EACH(i, n) {                                                                      \
            float v = roundf(q_ld_##DT(x, i) / scales[i / block]);                            \
            v = (v != v) ? 0.0f : fminf(fmaxf(v, -127.0f), 127.0f);                           \
            out[i] = (i8)(int)v;                                                              \
        }                                                                                     \
    }                                                                                         \
    KERNEL void dequantize_##DT(const i8* q, const float* scales, T* out,                     \
                                               i64 block, i64 n) {                            \
        FOR_EACH(i, n) { q_st_##DT(out, i, scales[i / block] * (float)q[i]); }                \
    }

QUANT(f32, float)
QUANT(f64, double)
QUANT(f16, u16)
QUANT(bf16, u16)
