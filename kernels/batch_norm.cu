// Batch normalization (training forward, inference forward, backward) over views of
// [N, C, S] (S = the product of the spatial dims; see backend/core/src/kernels/batch_norm.rs).
// `common.cuh` is prepended.
//
// Each pass is three launches: a partial reduction per (chunk of a channel's elements,
// channel), a per-channel finalize that combines the partials in a fixed order (so results
// are deterministic) and writes the statistics and the per-channel coefficients, and an
// elementwise apply. Statistics and coefficients are f32 for every data dtype.
//
// `order` picks how a linear index walks memory: 0 = (n, c, s) with s innermost (NCHW
// packed), 1 = (n, s, c) with c innermost (channels last). Reductions use the matching
// block shape so warps read consecutive addresses in both layouts.
//
// Parameter tensors (scale, bias, running statistics and their gradients) are f32 or the
// data dtype: `pdt` 0 = f32, 1 = f16, 2 = bf16.

#define BN_THREADS 256
#define BN_LANES 32  // channels per block in the channels-last reductions
#define BN_ROWS 8    // rows per block in the channels-last reductions

// Strides (elements) of the N, C and S axes.
struct BnView {
    i64 sn, sc, ss;
};

__device__ __forceinline__ i64 bn_off(const BnView& v, i64 n, i64 c, i64 s) { return n * v.sn + c * v.sc + s * v.ss; }

// ---- Welford accumulation (count, mean, sum of squared deviations) ----

struct Welford {
    float n, mean, m2;
};

__device__ __forceinline__ void welford_add(Welford& w, float x) {
    w.n += 1.0f;
    float d = x - w.mean;
    w.mean += d / w.n;
    w.m2 += d * (x - w.mean);
}

__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    float n = a.n + b.n;
    float d = b.mean - a.mean;
    float fb = b.n / n;
    Welford r;
    r.n = n;
    r.mean = a.mean + d * fb;
    r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
    return r;
}

__device__ __forceinline__ Welford welford_shfl_down(Welford w, int delta) {
    Welford o;
    o.n = __shfl_down_sync(0xffffffffu, w.n, delta);
    o.mean = __shfl_down_sync(0xffffffffu, w.mean, delta);
    o.m2 = __shfl_down_sync(0xffffffffu, w.m2, delta);
    return o;
}

// Two running sums (the backward pass: sum of dy, sum of dy * (x - mean)).
struct Sum2 {
    float a, b;
};

__device__ __forceinline__ Sum2 sum2_merge(Sum2 x, Sum2 y) {
    Sum2 r;
    r.a = x.a + y.a;
    r.b = x.b + y.b;
    return r;
}

__device__ __forceinline__ Sum2 sum2_shfl_down(Sum2 s, int delta) {
    Sum2 o;
    o.a = __shfl_down_sync(0xffffffffu, s.a, delta);
    o.b = __shfl_down_sync(0xffffffffu, s.b, delta);
    return o;
}

__device__ __forceinline__ Welford acc_merge(Welford a, Welford b) { return welford_merge(a, b); }
__device__ __forceinline__ Sum2 acc_merge(Sum2 a, Sum2 b) { return sum2_merge(a, b); }
__device__ __forceinline__ Welford acc_shfl_down(Welford a, int d) { return welford_shfl_down(a, d); }
__device__ __forceinline__ Sum2 acc_shfl_down(Sum2 a, int d) { return sum2_shfl_down(a, d); }

// Reduces one accumulator per thread of a 1-D block of BN_THREADS threads; thread 0 gets
// the block's result. The merge order is fixed, so the result is deterministic.
template <class A>
__device__ __forceinline__ A block_reduce_1d(A v) {
    __shared__ A warp_part[BN_THREADS / 32];
    for (int d = 16; d > 0; d >>= 1) v = acc_merge(v, acc_shfl_down(v, d));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_part[0];
        for (int k = 1; k < BN_THREADS / 32; ++k) v = acc_merge(v, warp_part[k]);
    }
    return v;
}

// Reduces over threadIdx.y of a (BN_LANES, BN_ROWS) block; threads with threadIdx.y == 0
// get their lane's result.
template <class A>
__device__ __forceinline__ A block_reduce_rows(A v) {
    __shared__ A rows[BN_ROWS][BN_LANES];
    rows[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0) {
        for (int k = 1; k < BN_ROWS; ++k) v = acc_merge(v, rows[k][threadIdx.x]);
    }
    return v;
}

// One chunk's partial accumulator, stored as 3 (Welford) or 2 (Sum2) consecutive floats.
__device__ __forceinline__ void bn_ld_part(const float* p, Welford& w) {
    w.n = p[0];
    w.mean = p[1];
    w.m2 = p[2];
}
__device__ __forceinline__ void bn_ld_part(const float* p, Sum2& s) {
    s.a = p[0];
    s.b = p[1];
}

// Combines channel `c`'s partials over `chunks` chunks (`part` is [chunk][C][floats of A]) on
// a (BN_LANES, BN_ROWS) block: row threadIdx.y merges chunks threadIdx.y, + BN_ROWS, ...,
// then the rows merge in row order, so the order is fixed and the result deterministic.
// Threads with threadIdx.y == 0 get the result; every thread of the block must call it.
template <class A>
__device__ __forceinline__ A bn_combine_chunks(const float* part, int chunks, i64 C, i64 c) {
    const int floats = (int)(sizeof(A) / sizeof(float));
    A acc;
    acc = A();
    if (c < C) {
#pragma unroll 4
        for (int k = threadIdx.y; k < chunks; k += BN_ROWS) {
            A b;
            bn_ld_part(part + floats * ((i64)k * C + c), b);
            acc = acc_merge(acc, b);
        }
    }
    return block_reduce_rows(acc);
}

// Walks the elements of channel `c` that chunk `k` owns and folds `visit(n, s)` into `acc`.
// Planes order (grid: chunks x C, 1-D blocks): the chunk is a range of the channel's N*S
// elements. Channels-last order (grid: chunks x ceil(C / BN_LANES), (BN_LANES, BN_ROWS)
// blocks): the chunk is a range of the N*S rows, each lane one channel.
template <class A, class F>
__device__ __forceinline__ A bn_walk(i64 N, i64 C, i64 S, int order, i64 chunk_len, i64& c_out, F visit) {
    A acc;
    acc = A();
    i64 total = N * S;
    i64 j0 = (i64)blockIdx.x * chunk_len;
    i64 j1 = min(total, j0 + chunk_len);
    if (order == 0) {
        i64 c = blockIdx.y;
        c_out = c;
        if (total < 2147483647LL && S < 2147483647LL) {
            unsigned int us = (unsigned int)S;
            for (unsigned int j = (unsigned int)j0 + threadIdx.x; j < (unsigned int)j1; j += BN_THREADS) {
                unsigned int n = j / us;
                visit(acc, (i64)n, c, (i64)(j - n * us));
            }
        } else {
            for (i64 j = j0 + threadIdx.x; j < j1; j += BN_THREADS) {
                i64 n = j / S;
                visit(acc, n, c, j - n * S);
            }
        }
        return block_reduce_1d(acc);
    }
    i64 c = (i64)blockIdx.y * BN_LANES + threadIdx.x;
    c_out = c;
    if (c < C) {
        for (i64 r = j0 + threadIdx.y; r < j1; r += BN_ROWS) {
            i64 n = r / S;
            visit(acc, n, c, r - n * S);
        }
    }
    return block_reduce_rows(acc);
}

__device__ __forceinline__ bool bn_is_writer(int order) { return order == 0 ? threadIdx.x == 0 : threadIdx.y == 0; }

// ---------------------------------------------------------------------------------------
// Forward statistics: partials [chunks][C] of (count, mean, m2).

template <class D>
__device__ void bn_stats(const typename D::T* x, BnView vx, i64 N, i64 C, i64 S, int order, i64 chunk_len,
                         float* part) {
    i64 c;
    Welford w = bn_walk<Welford>(N, C, S, order, chunk_len, c, [&](Welford& acc, i64 n, i64 ch, i64 s) {
        welford_add(acc, D::ld(x, bn_off(vx, n, ch, s)));
    });
    if (bn_is_writer(order) && c < C) {
        float* p = part + 3 * ((i64)blockIdx.x * C + c);
        p[0] = w.n;
        p[1] = w.mean;
        p[2] = w.m2;
    }
}

// Per channel: combines the partials in chunk order; writes the saved mean and inverse
// standard deviation, the coefficients y = x * coef[c] + coef[C + c], and (when the output
// pointers are set) the running statistics updated with `momentum` (the variance unbiased
// when `unbiased` is 1). The running inputs and outputs may be the same buffers.
KERNEL void bn_finalize(const float* part, int chunks, i64 C, float eps, float momentum, int unbiased,
                                       const void* scale, const void* bias, int pdt, const void* rmean_in,
                                       const void* rvar_in, void* rmean_out, void* rvar_out, float* save_mean,
                                       float* save_invstd, float* coef) {
    const i64 c = blockIdx.x * (i64)BN_LANES + threadIdx.x;
    const Welford w = bn_combine_chunks<Welford>(part, chunks, C, c);
    if (c >= C || threadIdx.y != 0) return;
    float var = w.m2 / w.n;
    float invstd = 1.0f / sqrtf(var + eps);
    if (save_mean) save_mean[c] = w.mean;
    if (save_invstd) save_invstd[c] = invstd;
    float g = scale ? ld_param(scale, pdt, c) : 1.0f;
    float b = bias ? ld_param(bias, pdt, c) : 0.0f;
    coef[c] = g * invstd;
    coef[C + c] = b - w.mean * g * invstd;
    if (rmean_out) {
        float rm = ld_param(rmean_in, pdt, c);
        st_param(rmean_out, pdt, c, (1.0f - momentum) * rm + momentum * w.mean);
    }
    if (rvar_out) {
        float rv = ld_param(rvar_in, pdt, c);
        float v = unbiased ? w.m2 / fmaxf(w.n - 1.0f, 1.0f) : var;
        st_param(rvar_out, pdt, c, (1.0f - momentum) * rv + momentum * v);
    }
}

// Inference coefficients from the running statistics.
KERNEL void bn_inference_coef(i64 C, float eps, const void* scale, const void* bias, int pdt,
                                             const void* rmean, const void* rvar, float* coef) {
    i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (c >= C) return;
    float invstd = 1.0f / sqrtf(ld_param(rvar, pdt, c) + eps);
    float g = scale ? ld_param(scale, pdt, c) : 1.0f;
    float b = bias ? ld_param(bias, pdt, c) : 0.0f;
    coef[c] = g * invstd;
    coef[C + c] = b - ld_param(rmean, pdt, c) * g * invstd;
}

// Decomposes linear index `i` (in the walk order) into n, c, s.
__device__ __forceinline__ void bn_coords(i64 i, i64 C, i64 S, int order, bool small, i64& n, i64& c, i64& s) {
    if (small) {
        unsigned int j = (unsigned int)i;
        if (order == 0) {
            unsigned int q = j / (unsigned int)S;
            s = j - q * (unsigned int)S;
            n = q / (unsigned int)C;
            c = q - (unsigned int)n * (unsigned int)C;
        } else {
            unsigned int q = j / (unsigned int)C;
            c = j - q * (unsigned int)C;
            n = q / (unsigned int)S;
            s = q - (unsigned int)n * (unsigned int)S;
        }
        return;
    }
    if (order == 0) {
        i64 q = i / S;
        s = i - q * S;
        n = q / C;
        c = q - n * C;
    } else {
        i64 q = i / C;
        c = i - q * C;
        n = q / S;
        s = q - n * S;
    }
}

// y = x * coef[c] + coef[C + c] (+ z) (then ReLU when `relu`; NaN stays NaN).
template <class D>
__device__ void bn_apply(const typename D::T* x, BnView vx, const typename D::T* z, BnView vz, typename D::T* y,
                         BnView vy, i64 N, i64 C, i64 S, int order, const float* coef, int relu) {
    i64 total = N * C * S;
    bool small = total < 2147483647LL;
    FOR_EACH(i, total) {
        i64 n, c, s;
        bn_coords(i, C, S, order, small, n, c, s);
        float v = D::ld(x, bn_off(vx, n, c, s)) * coef[c] + coef[C + c];
        if (z) v += D::ld(z, bn_off(vz, n, c, s));
        if (relu && v < 0.0f) v = 0.0f;
        D::st(y, bn_off(vy, n, c, s), v);
    }
}

// ---------------------------------------------------------------------------------------
// Backward: partials [chunks][C] of (sum dy', sum dy' * (x - mean)) where dy' is dy masked
// by y > 0 when the forward applied ReLU (y given), else dy.

template <class D>
__device__ void bn_grad_stats(const typename D::T* x, BnView vx, const typename D::T* y, BnView vy,
                              const typename D::T* dy, BnView vdy, i64 N, i64 C, i64 S, int order, i64 chunk_len,
                              const float* mean, float* part) {
    i64 c;
    Sum2 r = bn_walk<Sum2>(N, C, S, order, chunk_len, c, [&](Sum2& acc, i64 n, i64 ch, i64 s) {
        float g = D::ld(dy, bn_off(vdy, n, ch, s));
        if (y && !(D::ld(y, bn_off(vy, n, ch, s)) > 0.0f)) g = 0.0f;
        acc.a += g;
        acc.b += g * (D::ld(x, bn_off(vx, n, ch, s)) - mean[ch]);
    });
    if (bn_is_writer(order) && c < C) {
        float* p = part + 2 * ((i64)blockIdx.x * C + c);
        p[0] = r.a;
        p[1] = r.b;
    }
}

// Per channel: dbias = sum dy', dscale = invstd * sum dy' (x - mean) (either pointer may be
// null), and the coefficients dx = k0 * dy' + k1 * x + k2 in coef[0..3C].
KERNEL void bn_grad_finalize(const float* part, int chunks, i64 C, float count, const void* scale,
                                            int pdt, const float* mean, const float* invstd, void* dscale,
                                            void* dbias, float* coef) {
    const i64 c = blockIdx.x * (i64)BN_LANES + threadIdx.x;
    const Sum2 sums = bn_combine_chunks<Sum2>(part, chunks, C, c);
    if (c >= C || threadIdx.y != 0) return;
    const float sdy = sums.a, sdyx = sums.b;
    float is = invstd[c];
    if (dbias) st_param(dbias, pdt, c, sdy);
    if (dscale) st_param(dscale, pdt, c, sdyx * is);
    float g = scale ? ld_param(scale, pdt, c) : 1.0f;
    float a = g * is;
    float d = -a * is * is * sdyx / count;
    coef[c] = a;
    coef[C + c] = d;
    coef[2 * C + c] = -a * sdy / count - d * mean[c];
}

// dx = coef[c] * dy' + coef[C + c] * x + coef[2C + c]; dz = dy' when `dz` is set.
template <class D>
__device__ void bn_grad_apply(const typename D::T* x, BnView vx, const typename D::T* y, BnView vy,
                              const typename D::T* dy, BnView vdy, typename D::T* dx, BnView vdx,
                              typename D::T* dz, BnView vdz, i64 N, i64 C, i64 S, int order, const float* coef) {
    i64 total = N * C * S;
    bool small = total < 2147483647LL;
    FOR_EACH(i, total) {
        i64 n, c, s;
        bn_coords(i, C, S, order, small, n, c, s);
        float g = D::ld(dy, bn_off(vdy, n, c, s));
        if (y && !(D::ld(y, bn_off(vy, n, c, s)) > 0.0f)) g = 0.0f;
        if (dx) D::st(dx, bn_off(vdx, n, c, s), coef[c] * g + coef[C + c] * D::ld(x, bn_off(vx, n, c, s)) + coef[2 * C + c]);
        if (dz) D::st(dz, bn_off(vdz, n, c, s), g);
    }
}

// ---------------------------------------------------------------------------------------
// Packed channels-last path: every data operand packed as [rows, C] (rows = N * S, channels
// innermost), C a multiple of V = 16 bytes / element and 16-byte-aligned addresses. A thread
// moves one 16-byte vector (V consecutive channels of one row) per step, so a warp reads
// whole rows with 16-byte accesses and the channel index costs one 32-bit remainder per
// vector. The reductions run on (lanes, BN_THREADS / lanes) blocks: lanes take consecutive
// vectors of a row, the block's rows stride over the chunk's rows, and the rows' partials
// merge in row order (deterministic). Partials and coefficients are those of the strided
// kernels above, so `bn_finalize` and `bn_grad_finalize` serve both.

template <class D>
struct BnVec {
    static const int V = 16 / sizeof(typename D::T);
};

template <class D>
__device__ __forceinline__ void bn_ld_vec(const typename D::T* p, i64 o, float* v) {
    uint4 raw = *reinterpret_cast<const uint4*>(p + o);
    const typename D::T* e = reinterpret_cast<const typename D::T*>(&raw);
#pragma unroll
    for (int k = 0; k < BnVec<D>::V; ++k) v[k] = D::ld(e, k);
}

template <class D>
__device__ __forceinline__ void bn_st_vec(typename D::T* p, i64 o, const float* v) {
    uint4 raw;
    typename D::T* e = reinterpret_cast<typename D::T*>(&raw);
#pragma unroll
    for (int k = 0; k < BnVec<D>::V; ++k) D::st(e, k, v[k]);
    *reinterpret_cast<uint4*>(p + o) = raw;
}

// dy' at element offset `o`, one vector: dy, zeroed where the forward's ReLU output `y` (when
// given) is not positive.
template <class D>
__device__ __forceinline__ void bn_ld_grad_vec(const typename D::T* dy, const typename D::T* y, i64 o, float* g) {
    bn_ld_vec<D>(dy, o, g);
    if (y) {
        float yv[BnVec<D>::V];
        bn_ld_vec<D>(y, o, yv);
#pragma unroll
        for (int k = 0; k < BnVec<D>::V; ++k)
            if (!(yv[k] > 0.0f)) g[k] = 0.0f;
    }
}

// V consecutive floats of a 16-byte-aligned f32 array.
template <int V>
__device__ __forceinline__ void bn_ld_f32(const float* p, float* v) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
        float4 q = *reinterpret_cast<const float4*>(p + k);
        v[k] = q.x;
        v[k + 1] = q.y;
        v[k + 2] = q.z;
        v[k + 3] = q.w;
    }
}

// Floats of one thread's partials in the reductions' shared memory: the largest V (8) times
// two accumulators, plus a count.
#define BN_VEC_SLOTS 17

// Forward statistics, partials [chunks][C] of (count, mean, m2) as `bn_stats` writes them.
template <class D>
__device__ void bn_stats_vec(const typename D::T* x, i64 rows, i64 C, i64 chunk_len, float* part) {
    const int V = BnVec<D>::V;
    __shared__ float sh[BN_THREADS * BN_VEC_SLOTS];
    const i64 cv = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    const bool live = cv * V < C;
    float n = 0.0f, mean[V], m2[V];
#pragma unroll
    for (int k = 0; k < V; ++k) mean[k] = m2[k] = 0.0f;
    if (live) {
        const i64 r0 = (i64)blockIdx.x * chunk_len, r1 = min(rows, r0 + chunk_len);
#pragma unroll 2
        for (i64 r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            float v[V];
            bn_ld_vec<D>(x, r * C + cv * V, v);
            n += 1.0f;
            const float inv = 1.0f / n;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                float d = v[k] - mean[k];
                mean[k] += d * inv;
                m2[k] += d * (v[k] - mean[k]);
            }
        }
    }
    float* mine = sh + (threadIdx.y * blockDim.x + threadIdx.x) * BN_VEC_SLOTS;
    mine[0] = n;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        mine[1 + k] = mean[k];
        mine[1 + V + k] = m2[k];
    }
    __syncthreads();
    if (threadIdx.y != 0 || !live) return;
    for (unsigned int row = 1; row < blockDim.y; ++row) {
        const float* o = sh + (row * blockDim.x + threadIdx.x) * BN_VEC_SLOTS;
        const float nb = o[0];
        if (nb == 0.0f) continue;
        const float tot = n + nb, fb = nb / tot;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            float d = o[1 + k] - mean[k];
            mean[k] += d * fb;
            m2[k] += o[1 + V + k] + d * d * n * fb;
        }
        n = tot;
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
        float* p = part + 3 * ((i64)blockIdx.x * C + cv * V + k);
        p[0] = n;
        p[1] = mean[k];
        p[2] = m2[k];
    }
}

// y = x * coef[c] + coef[C + c] (+ z) (then ReLU when `relu`), over `vecs` vectors.
template <class D>
__device__ void bn_apply_vec(const typename D::T* x, const typename D::T* z, typename D::T* y, i64 vecs, i64 C,
                             const float* coef, int relu) {
    const int V = BnVec<D>::V;
    const i64 cvs = C / V;
    const bool small = vecs < 2147483647LL;
    FOR_EACH(i, vecs) {
        const i64 c0 = (small ? (i64)((unsigned int)i % (unsigned int)cvs) : i % cvs) * V;
        float v[V], a[V], b[V];
        bn_ld_vec<D>(x, i * V, v);
        bn_ld_f32<V>(coef + c0, a);
        bn_ld_f32<V>(coef + C + c0, b);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = v[k] * a[k] + b[k];
        if (z) {
            float w[V];
            bn_ld_vec<D>(z, i * V, w);
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] += w[k];
        }
        if (relu) {
#pragma unroll
            for (int k = 0; k < V; ++k)
                if (v[k] < 0.0f) v[k] = 0.0f;
        }
        bn_st_vec<D>(y, i * V, v);
    }
}

// Backward partials [chunks][C] of (sum dy', sum dy' * (x - mean)) as `bn_grad_stats`.
template <class D>
__device__ void bn_grad_stats_vec(const typename D::T* x, const typename D::T* y, const typename D::T* dy, i64 rows,
                                  i64 C, i64 chunk_len, const float* mean, float* part) {
    const int V = BnVec<D>::V;
    __shared__ float sh[BN_THREADS * BN_VEC_SLOTS];
    const i64 cv = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    const bool live = cv * V < C;
    float sa[V], sb[V], mu[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sa[k] = sb[k] = mu[k] = 0.0f;
    if (live) {
        bn_ld_f32<V>(mean + cv * V, mu);
        const i64 r0 = (i64)blockIdx.x * chunk_len, r1 = min(rows, r0 + chunk_len);
#pragma unroll 2
        for (i64 r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            const i64 o = r * C + cv * V;
            float g[V], xv[V];
            bn_ld_grad_vec<D>(dy, y, o, g);
            bn_ld_vec<D>(x, o, xv);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                sa[k] += g[k];
                sb[k] += g[k] * (xv[k] - mu[k]);
            }
        }
    }
    float* mine = sh + (threadIdx.y * blockDim.x + threadIdx.x) * BN_VEC_SLOTS;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        mine[k] = sa[k];
        mine[V + k] = sb[k];
    }
    __syncthreads();
    if (threadIdx.y != 0 || !live) return;
    for (unsigned int row = 1; row < blockDim.y; ++row) {
        const float* o = sh + (row * blockDim.x + threadIdx.x) * BN_VEC_SLOTS;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            sa[k] += o[k];
            sb[k] += o[V + k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
        float* p = part + 2 * ((i64)blockIdx.x * C + cv * V + k);
        p[0] = sa[k];
        p[1] = sb[k];
    }
}

// dx = coef[c] * dy' + coef[C + c] * x + coef[2C + c]; dz = dy' when `dz` is set.
template <class D>
__device__ void bn_grad_apply_vec(const typename D::T* x, const typename D::T* y, const typename D::T* dy,
                                  typename D::T* dx, typename D::T* dz, i64 vecs, i64 C, const float* coef) {
    const int V = BnVec<D>::V;
    const i64 cvs = C / V;
    const bool small = vecs < 2147483647LL;
    FOR_EACH(i, vecs) {
        const i64 c0 = (small ? (i64)((unsigned int)i % (unsigned int)cvs) : i % cvs) * V;
        float g[V];
        bn_ld_grad_vec<D>(dy, y, i * V, g);
        if (dx) {
            float xv[V], k0[V], k1[V], k2[V];
            bn_ld_vec<D>(x, i * V, xv);
            bn_ld_f32<V>(coef + c0, k0);
            bn_ld_f32<V>(coef + C + c0, k1);
            bn_ld_f32<V>(coef + 2 * C + c0, k2);
#pragma unroll
            for (int k = 0; k < V; ++k) xv[k] = k0[k] * g[k] + k1[k] * xv[k] + k2[k];
            bn_st_vec<D>(dx, i * V, xv);
        }
        if (dz) bn_st_vec<D>(dz, i * V, g);
    }
}

// ---------------------------------------------------------------------------------------
// Packed planes path: every data operand packed [N, C, S] (S innermost, as NCHW), S a
// multiple of V = 16 bytes / element and 16-byte-aligned addresses. A thread moves one
// 16-byte vector of one (n, c) plane, so the channel costs one 32-bit division per vector
// and a warp reads 512 consecutive bytes. The reductions keep the strided kernels' grid
// (chunks x C, 1-D blocks of BN_THREADS), a chunk being a range of one channel's
// N * S / V vectors, and write the strided kernels' partials.

// The channel of vector `i` (plane_vecs vectors per plane).
__device__ __forceinline__ i64 bn_plane_channel(i64 i, i64 plane_vecs, i64 C, bool small) {
    if (small) return (i64)(((unsigned int)i / (unsigned int)plane_vecs) % (unsigned int)C);
    return (i / plane_vecs) % C;
}

// Folds `visit(acc, element offset of a vector)` over the vectors of channel blockIdx.y
// that chunk blockIdx.x owns, then reduces the block (thread 0 gets the result).
template <class A, int V, class F>
__device__ __forceinline__ A bn_walk_planes(i64 N, i64 C, i64 plane_vecs, i64 chunk_len, F visit) {
    A acc;
    acc = A();
    const i64 c = blockIdx.y;
    const i64 total = N * plane_vecs;
    const i64 j0 = (i64)blockIdx.x * chunk_len, j1 = min(total, j0 + chunk_len);
    if (total < 2147483647LL) {
        const unsigned int pv = (unsigned int)plane_vecs;
        for (unsigned int j = (unsigned int)j0 + threadIdx.x; j < (unsigned int)j1; j += BN_THREADS) {
            const unsigned int n = j / pv;
            visit(acc, (((i64)n * C + c) * plane_vecs + (i64)(j - n * pv)) * V);
        }
    } else {
        for (i64 j = j0 + threadIdx.x; j < j1; j += BN_THREADS) {
            const i64 n = j / plane_vecs;
            visit(acc, ((n * C + c) * plane_vecs + (j - n * plane_vecs)) * V);
        }
    }
    return block_reduce_1d(acc);
}

// Forward statistics, partials [chunks][C] of (count, mean, m2) as `bn_stats` writes them.
template <class D>
__device__ void bn_stats_planes(const typename D::T* x, i64 N, i64 C, i64 plane_vecs, i64 chunk_len, float* part) {
    Welford w = bn_walk_planes<Welford, BnVec<D>::V>(N, C, plane_vecs, chunk_len, [&](Welford& acc, i64 o) {
        float v[BnVec<D>::V];
        bn_ld_vec<D>(x, o, v);
#pragma unroll
        for (int k = 0; k < BnVec<D>::V; ++k) welford_add(acc, v[k]);
    });
    if (threadIdx.x == 0) {
        float* p = part + 3 * ((i64)blockIdx.x * C + blockIdx.y);
        p[0] = w.n;
        p[1] = w.mean;
        p[2] = w.m2;
    }
}

// y = x * coef[c] + coef[C + c] (+ z) (then ReLU when `relu`; NaN stays NaN).
template <class D>
__device__ void bn_apply_planes(const typename D::T* x, const typename D::T* z, typename D::T* y, i64 vecs,
                                i64 plane_vecs, i64 C, const float* coef, int relu) {
    const int V = BnVec<D>::V;
    const bool small = vecs < 2147483647LL;
    FOR_EACH(i, vecs) {
        const i64 c = bn_plane_channel(i, plane_vecs, C, small);
        const float a = coef[c], b = coef[C + c];
        float v[V];
        bn_ld_vec<D>(x, i * V, v);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = v[k] * a + b;
        if (z) {
            float w[V];
            bn_ld_vec<D>(z, i * V, w);
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] += w[k];
        }
        if (relu) {
#pragma unroll
            for (int k = 0; k < V; ++k)
                if (v[k] < 0.0f) v[k] = 0.0f;
        }
        bn_st_vec<D>(y, i * V, v);
    }
}

// Backward partials [chunks][C] of (sum dy', sum dy' * (x - mean)) as `bn_grad_stats`.
template <class D>
__device__ void bn_grad_stats_planes(const typename D::T* x, const typename D::T* y, const typename D::T* dy, i64 N,
                                     i64 C, i64 plane_vecs, i64 chunk_len, const float* mean, float* part) {
    const float mu = mean[blockIdx.y];
    Sum2 r = bn_walk_planes<Sum2, BnVec<D>::V>(N, C, plane_vecs, chunk_len, [&](Sum2& acc, i64 o) {
        float g[BnVec<D>::V], xv[BnVec<D>::V];
        bn_ld_grad_vec<D>(dy, y, o, g);
        bn_ld_vec<D>(x, o, xv);
#pragma unroll
        for (int k = 0; k < BnVec<D>::V; ++k) {
            acc.a += g[k];
            acc.b += g[k] * (xv[k] - mu);
        }
    });
    if (threadIdx.x == 0) {
        float* p = part + 2 * ((i64)blockIdx.x * C + blockIdx.y);
        p[0] = r.a;
        p[1] = r.b;
    }
}

// dx = coef[c] * dy' + coef[C + c] * x + coef[2C + c]; dz = dy' when `dz` is set.
template <class D>
__device__ void bn_grad_apply_planes(const typename D::T* x, const typename D::T* y, const typename D::T* dy,
                                     typename D::T* dx, typename D::T* dz, i64 vecs, i64 plane_vecs, i64 C,
                                     const float* coef) {
    const int V = BnVec<D>::V;
    const bool small = vecs < 2147483647LL;
    FOR_EACH(i, vecs) {
        const i64 c = bn_plane_channel(i, plane_vecs, C, small);
        float g[V];
        bn_ld_grad_vec<D>(dy, y, i * V, g);
        if (dx) {
            const float k0 = coef[c], k1 = coef[C + c], k2 = coef[2 * C + c];
            float xv[V];
            bn_ld_vec<D>(x, i * V, xv);
#pragma unroll
            for (int k = 0; k < V; ++k) xv[k] = k0 * g[k] + k1 * xv[k] + k2;
            bn_st_vec<D>(dx, i * V, xv);
        }
        if (dz) bn_st_vec<D>(dz, i * V, g);
    }
}

#define BN_ENTRIES(DT, D)                                                                                         \
    KERNEL void bn_stats_##DT(const D::T* x, BnView vx, i64 N, i64 C, i64 S, int order,          \
                                             i64 chunk_len, float* part) {                                        \
        bn_stats<D>(x, vx, N, C, S, order, chunk_len, part);                                                      \
    }                                                                                                             \
    KERNEL void bn_apply_##DT(const D::T* x, BnView vx, const D::T* z, BnView vz, D::T* y,        \
                                             BnView vy, i64 N, i64 C, i64 S, int order, const float* coef,        \
                                             int relu) {                                                          \
        bn_apply<D>(x, vx, z, vz, y, vy, N, C, S, order, coef, relu);                                             \
    }                                                                                                             \
    KERNEL void bn_grad_stats_##DT(const D::T* x, BnView vx, const D::T* y, BnView vy,            \
                                                  const D::T* dy, BnView vdy, i64 N, i64 C, i64 S, int order,    \
                                                  i64 chunk_len, const float* mean, float* part) {                \
        bn_grad_stats<D>(x, vx, y, vy, dy, vdy, N, C, S, order, chunk_len, mean, part);                          \
    }                                                                                                             \
    KERNEL void bn_grad_apply_##DT(const D::T* x, BnView vx, const D::T* y, BnView vy,            \
                                                  const D::T* dy, BnView vdy, D::T* dx, BnView vdx, D::T* dz,    \
                                                  BnView vdz, i64 N, i64 C, i64 S, int order, const float* coef) { \
        bn_grad_apply<D>(x, vx, y, vy, dy, vdy, dx, vdx, dz, vdz, N, C, S, order, coef);                        \
    }                                                                                                             \
    KERNEL void __launch_bounds__(BN_THREADS) bn_stats_vec_##DT(const D::T* x, i64 rows, i64 C, i64 chunk_len,    \
                                                               float* part) {                                    \
        bn_stats_vec<D>(x, rows, C, chunk_len, part);                                                             \
    }                                                                                                             \
    KERNEL void bn_apply_vec_##DT(const D::T* x, const D::T* z, D::T* y, i64 vecs, i64 C, const float* coef,      \
                                  int relu) {                                                                     \
        bn_apply_vec<D>(x, z, y, vecs, C, coef, relu);                                                            \
    }                                                                                                             \
    KERNEL void __launch_bounds__(BN_THREADS) bn_grad_stats_vec_##DT(const D::T* x, const D::T* y,                \
                                                                    const D::T* dy, i64 rows, i64 C,             \
                                                                    i64 chunk_len, const float* mean,            \
                                                                    float* part) {                               \
        bn_grad_stats_vec<D>(x, y, dy, rows, C, chunk_len, mean, part);                                           \
    }                                                                                                             \
    KERNEL void bn_grad_apply_vec_##DT(const D::T* x, const D::T* y, const D::T* dy, D::T* dx, D::T* dz,          \
                                       i64 vecs, i64 C, const float* coef) {                                      \
        bn_grad_apply_vec<D>(x, y, dy, dx, dz, vecs, C, coef);                                                    \
    }                                                                                                             \
    KERNEL void __launch_bounds__(BN_THREADS) bn_stats_planes_##DT(const D::T* x, i64 N, i64 C, i64 plane_vecs,   \
                                                                  i64 chunk_len, float* part) {                  \
        bn_stats_planes<D>(x, N, C, plane_vecs, chunk_len, part);                                                 \
    }                                                                                                             \
    KERNEL void bn_apply_planes_##DT(const D::T* x, const D::T* z, D::T* y, i64 vecs, i64 plane_vecs, i64 C,      \
                                     const float* coef, int relu) {                                               \
        bn_apply_planes<D>(x, z, y, vecs, plane_vecs, C, coef, relu);                                             \
    }                                                                                                             \
    KERNEL void __launch_bounds__(BN_THREADS) bn_grad_stats_planes_##DT(const D::T* x, const D::T* y,             \
                                                                       const D::T* dy, i64 N, i64 C,             \
                                                                       i64 plane_vecs, i64 chunk_len,            \
                                                                       const float* mean, float* part) {         \
        bn_grad_stats_planes<D>(x, y, dy, N, C, plane_vecs, chunk_len, mean, part);                               \
    }                                                                                                             \
    KERNEL void bn_grad_apply_planes_##DT(const D::T* x, const D::T* y, const D::T* dy, D::T* dx, D::T* dz,       \
                                          i64 vecs, i64 plane_vecs, i64 C, const float* coef) {                   \
        bn_grad_apply_planes<D>(x, y, dy, dx, dz, vecs, plane_vecs, C, coef);                                     \
    }

BN_ENTRIES(f32, DF32)
BN_ENTRIES(f16, DF16)
BN_ENTRIES(bf16, DBF16)
