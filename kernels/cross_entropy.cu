// Cross-entropy of packed logits rows [rows, k] against i64 class targets
// (backend/core/src/ops/cross_entropy.rs, variants in backend/core/src/kernels/cross_entropy.rs).
// `common.cuh` is prepended.
//
// Forward: one pass over each row keeps a running (max, sum of exp(x - max)) per thread,
// merged across the row's threads in a fixed tree: row log-sum-exp `lse` and loss
// `lse - x[target]`, both f32. Backward: dx = scale * (exp(x - lse) - [c == target]), one
// read and one write of the logits. `scale` (the upstream gradient over the mean's
// denominator) and the mean are tiny one-block reductions in a fixed order. Everything
// accumulates in f32 (the mean in f64) and is deterministic: no atomics.
//
// A row whose target is in the ignore set has loss 0, lse 0 (the row is not read) and a zero
// gradient. A target outside [0, k) that is not ignored gives that row a NaN loss and a NaN
// gradient row (checking on the host would cost a device-to-host copy per step).
//
// Rows take 16-byte vector loads between their first and last 16-byte boundary (any k: the
// elements before and after are read one by one). XENT_WARP_ROWS rows per block of one warp
// each (short rows), or one block of XENT_BLOCK_LANES threads per row.

#define XENT_MAX_IGNORE 8
#define XENT_WARP_ROWS 8
#define XENT_BLOCK_LANES 256
#define XENT_REDUCE_THREADS 512
#define XENT_UNROLL 4

// Target values whose rows are ignored (matches `XentIgnore` in ffi/launch_cross_entropy.rs).
struct XentIgnore {
    i64 n;
    i64 v[XENT_MAX_IGNORE];
};

#define XENT_NEG_INF __int_as_float(0xff800000)

// 0: a class in [0, k); 1: ignored; 2: out of range.
__device__ __forceinline__ int xent_status(i64 t, i64 k, const XentIgnore& ign) {
#pragma unroll
    for (int i = 0; i < XENT_MAX_IGNORE; ++i)
        if (i < ign.n && t == ign.v[i]) return 1;
    return (t >= 0 && t < k) ? 0 : 2;
}

// (m, s) <- the running pair of both: max and sum of exp(x - max). An empty side is
// (-inf, 0); NaN inputs reach s (fmaxf skips them, the exponential does not).
__device__ __forceinline__ void xent_merge(float& m, float& s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    float base = mx == XENT_NEG_INF ? 0.0f : mx;
    s = s * __expf(m - base) + s2 * __expf(m2 - base);
    m = mx;
}

// Adds `n` values to the running pair with one rescale.
template <int N>
__device__ __forceinline__ void xent_add(float& m, float& s, const float* v) {
    float vm = v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) vm = fmaxf(vm, v[i]);
    float mx = fmaxf(m, vm);
    float base = mx == XENT_NEG_INF ? 0.0f : mx;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) acc += __expf(v[i] - base);
    s = s * __expf(m - base) + acc;
    m = mx;
}

// 16 bytes of D::T at `p` (16-byte aligned) as floats.
template <class D>
__device__ __forceinline__ void xent_ld16(const typename D::T* p, float* out) {
    constexpr int V = 16 / sizeof(typename D::T);
    union {
        uint4 u;
        typename D::T e[V];
    } b;
    b.u = *(const uint4*)p;
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = D::ld(b.e, i);
}

// Stores V floats rounded to D::T as 16 bytes at `p` (16-byte aligned).
template <class D>
__device__ __forceinline__ void xent_st16(typename D::T* p, const float* v) {
    constexpr int V = 16 / sizeof(typename D::T);
    union {
        uint4 u;
        typename D::T e[V];
    } b;
#pragma unroll
    for (int i = 0; i < V; ++i) D::st(b.e, i, v[i]);
    *(uint4*)p = b.u;
}

// Elements of a row at `p` before its first 16-byte boundary (at most `k`).
template <class D>
__device__ __forceinline__ i64 xent_head(const typename D::T* p, i64 k) {
    i64 head = (i64)(((16 - ((u64)p & 15)) & 15) / sizeof(typename D::T));
    return head < k ? head : k;
}

// The running pair of the row's threads, merged in a fixed tree; valid in every lane of the
// row's first warp. LANES = 32 (a warp per row) or XENT_BLOCK_LANES (a block per row).
template <int LANES>
__device__ __forceinline__ void xent_row_merge(float& m, float& s) {
    for (int d = 16; d > 0; d >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, d);
        float s2 = __shfl_xor_sync(0xffffffffu, s, d);
        xent_merge(m, s, m2, s2);
    }
    if (LANES > 32) {
        constexpr int WARPS = LANES / 32;
        __shared__ float sm[WARPS], ss[WARPS];
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) {
            sm[warp] = m;
            ss[warp] = s;
        }
        __syncthreads();
        if (warp == 0) {
            m = lane < WARPS ? sm[lane] : XENT_NEG_INF;
            s = lane < WARPS ? ss[lane] : 0.0f;
            for (int d = 16; d > 0; d >>= 1) {
                float m2 = __shfl_xor_sync(0xffffffffu, m, d);
                float s2 = __shfl_xor_sync(0xffffffffu, s, d);
                xent_merge(m, s, m2, s2);
            }
        }
    }
}

// Rows [blockIdx.x * ROWS + threadIdx.y, ...) in steps of gridDim.x * ROWS; LANES threads
// (threadIdx.x) per row.
template <class D, int LANES, int ROWS>
__device__ void xent_fwd(const typename D::T* x, const i64* targets, i64 t_stride, i64 rows, i64 k, XentIgnore ign,
                         float* loss, float* lse) {
    typedef typename D::T T;
    constexpr int V = 16 / sizeof(T);
    const int lane = threadIdx.x;
    for (i64 row0 = (i64)blockIdx.x * ROWS; row0 < rows; row0 += (i64)gridDim.x * ROWS) {
        i64 row = row0 + threadIdx.y;
        // Block-wide merges need every thread: a block per row has ROWS = 1, so `live`
        // is uniform over the block there.
        bool live = row < rows;
        i64 t = live ? targets[row * t_stride] : 0;
        int status = live ? xent_status(t, k, ign) : 1;
        if (status == 1) {
            if (live && lane == 0) {
                loss[row] = 0.0f;
                lse[row] = 0.0f;
            }
            continue;
        }
        const T* xr = x + row * k;
        float m = XENT_NEG_INF, s = 0.0f;
        i64 head = xent_head<D>(xr, k);
        i64 nvec = (k - head) / V;
        for (i64 c = lane; c < head; c += LANES) {
            float v = D::ld(xr, c);
            xent_add<1>(m, s, &v);
        }
        const T* body = xr + head;
        for (i64 j = lane; j < nvec; j += XENT_UNROLL * LANES) {
            float v[XENT_UNROLL][V];
#pragma unroll
            for (int u = 0; u < XENT_UNROLL; ++u) {
                i64 jj = j + (i64)u * LANES;
                if (jj < nvec) {
                    xent_ld16<D>(body + jj * V, v[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < V; ++i) v[u][i] = XENT_NEG_INF;
                }
            }
#pragma unroll
            for (int u = 0; u < XENT_UNROLL; ++u) xent_add<V>(m, s, v[u]);
        }
        for (i64 c = head + nvec * V + lane; c < k; c += LANES) {
            float v = D::ld(xr, c);
            xent_add<1>(m, s, &v);
        }
        xent_row_merge<LANES>(m, s);
        if (lane == 0) {
            float l = m + logf(s);
            lse[row] = l;
            loss[row] = status == 0 ? l - D::ld(xr, t) : __int_as_float(0x7fc00000);
        }
    }
}

// dx[row, c] = scale * (exp(x - lse[row]) - [c == target]); 0 on ignored rows, NaN on rows
// whose target is out of range. `vec` = 1: x and dx have the same offset within 16 bytes,
// so both take vectors.
template <class D, int LANES, int ROWS>
__device__ void xent_bwd(const typename D::T* x, const i64* targets, i64 t_stride, const float* lse,
                         const float* scale, i64 rows, i64 k, XentIgnore ign, int vec, typename D::T* dx) {
    typedef typename D::T T;
    constexpr int V = 16 / sizeof(T);
    const int lane = threadIdx.x;
    const float g = scale[0];
    for (i64 row0 = (i64)blockIdx.x * ROWS; row0 < rows; row0 += (i64)gridDim.x * ROWS) {
        i64 row = row0 + threadIdx.y;
        if (row >= rows) continue;
        i64 t = targets[row * t_stride];
        int status = xent_status(t, k, ign);
        const T* xr = x + row * k;
        T* dr = dx + row * k;
        // Ignored: zeros (lse is not read); out of range: NaN.
        bool zero = status == 1;
        float a = status == 0 ? g : __int_as_float(0x7fc00000);
        float l = zero ? 0.0f : lse[row];
        i64 head = vec ? xent_head<D>(xr, k) : k;
        i64 nvec = (k - head) / V;
        for (i64 c = lane; c < head; c += LANES) {
            float p = zero ? 0.0f : a * (__expf(D::ld(xr, c) - l) - (c == t ? 1.0f : 0.0f));
            D::st(dr, c, p);
        }
        const T* xb = xr + head;
        T* db = dr + head;
        for (i64 j = lane; j < nvec; j += LANES) {
            float v[V];
            xent_ld16<D>(xb + j * V, v);
            i64 c0 = head + j * V;
#pragma unroll
            for (int i = 0; i < V; ++i)
                v[i] = zero ? 0.0f : a * (__expf(v[i] - l) - (c0 + i == t ? 1.0f : 0.0f));
            xent_st16<D>(db + j * V, v);
        }
        for (i64 c = head + nvec * V + lane; c < k; c += LANES) {
            float p = zero ? 0.0f : a * (__expf(D::ld(xr, c) - l) - (c == t ? 1.0f : 0.0f));
            D::st(dr, c, p);
        }
    }
}

// The sum over the block of `v` (thread 0 holds it), in a fixed tree.
template <class A>
__device__ __forceinline__ A xent_block_sum(A v) {
    __shared__ A part[XENT_REDUCE_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int d = XENT_REDUCE_THREADS / 2; d > 0; d >>= 1) {
        if (threadIdx.x < d) part[threadIdx.x] += part[threadIdx.x + d];
        __syncthreads();
    }
    return part[0];
}

// The mean's denominator: `rows`, or with `counted` the rows whose target is not ignored.
__device__ double xent_denominator(const i64* targets, i64 t_stride, i64 rows, i64 k, XentIgnore ign, int counted) {
    if (!counted) return (double)rows;
    i64 n = 0;
    for (i64 r = threadIdx.x; r < rows; r += XENT_REDUCE_THREADS)
        n += xent_status(targets[r * t_stride], k, ign) != 1;
    return (double)xent_block_sum<i64>(n);
}

// out[0] (dtype code odt: 0 f32, 1 f16, 2 bf16) = sum(loss) / denominator. One block of
// XENT_REDUCE_THREADS threads.
KERNEL void xent_mean(const float* loss, const i64* targets, i64 t_stride, i64 rows, i64 k, XentIgnore ign,
                      int counted, void* out, int odt) {
    double acc = 0.0;
    for (i64 r = threadIdx.x; r < rows; r += XENT_REDUCE_THREADS) acc += (double)loss[r];
    double sum = xent_block_sum<double>(acc);
    __syncthreads();
    double den = xent_denominator(targets, t_stride, rows, k, ign, counted);
    if (threadIdx.x == 0) st_param(out, odt, 0, (float)(sum / den));
}

// scale[0] = g[0] (dtype code gdt) / denominator. One block of XENT_REDUCE_THREADS threads.
KERNEL void xent_scale(const void* g, int gdt, const i64* targets, i64 t_stride, i64 rows, i64 k, XentIgnore ign,
                       int counted, float* scale) {
    double den = xent_denominator(targets, t_stride, rows, k, ign, counted);
    if (threadIdx.x == 0) scale[0] = (float)((double)ld_param(g, gdt, 0) / den);
}

#define XENT_ENTRIES(DT, D)                                                                                         \
    KERNEL void xent_fwd_##DT(const D::T* x, const i64* targets, i64 t_stride, i64 rows, i64 k, XentIgnore ign,     \
                              float* loss, float* lse) {                                                           \
        xent_fwd<D, XENT_BLOCK_LANES, 1>(x, targets, t_stride, rows, k, ign, loss, lse);                          \
    }                                                                                                               \
    KERNEL void xent_fwd_warp_##DT(const D::T* x, const i64* targets, i64 t_stride, i64 rows, i64 k,                \
                                   XentIgnore ign, float* loss, float* lse) {                                      \
        xent_fwd<D, 32, XENT_WARP_ROWS>(x, targets, t_stride, rows, k, ign, loss, lse);                           \
    }                                                                                                               \
    KERNEL void xent_bwd_##DT(const D::T* x, const i64* targets, i64 t_stride, const float* lse,                   \
                              const float* scale, i64 rows, i64 k, XentIgnore ign, int vec, D::T* dx) {            \
        xent_bwd<D, XENT_BLOCK_LANES, 1>(x, targets, t_stride, lse, scale, rows, k, ign, vec, dx);                \
    }                                                                                                               \
    KERNEL void xent_bwd_warp_##DT(const D::T* x, const i64* targets, i64 t_stride, const float* lse,              \
                                   const float* scale, i64 rows, i64 k, XentIgnore ign, int vec, D::T* dx) {       \
        xent_bwd<D, 32, XENT_WARP_ROWS>(x, targets, t_stride, lse, scale, rows, k, ign, vec, dx);                 \
    }

XENT_ENTRIES(f32, DF32)
XENT_ENTRIES(f16, DF16)
XENT_ENTRIES(bf16, DBF16)
