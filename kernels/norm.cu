// Layer and RMS normalization over packed rows [rows, D] for training: a forward that
// writes the row statistics and the backward (see backend/core/src/ops/norm_train.rs).
// `common.cuh` is prepended. One warp per row (NORM_ROWS rows per block); the parameter
// gradients are column sums over chunks of rows, combined in chunk order (deterministic).
// `rms` = 1: RMS norm (no centring, no mean). Parameters are f32 or the data dtype (`pdt`
// 0 = f32, 1 = f16, 2 = bf16); statistics are f32.

#define NORM_ROWS 8
#define NORM_LANES 32

__device__ __forceinline__ float warp_sum(float v) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

// y = (x - mean) * invstd * gamma + beta per row (RMS: x * invstd * gamma + beta);
// writes mean (layer norm) and invstd per row when the pointers are set.
template <class D>
__device__ void norm_fwd(const typename D::T* x, typename D::T* y, i64 rows, i64 n, const void* gamma,
                         const void* beta, int pdt, float eps, int rms, float* mean_out, float* invstd_out) {
    i64 row = (i64)blockIdx.x * NORM_ROWS + threadIdx.y;
    if (row >= rows) return;
    const typename D::T* xr = x + row * n;
    typename D::T* yr = y + row * n;
    int lane = threadIdx.x;
    float mean = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (i64 c = lane; c < n; c += NORM_LANES) s += D::ld(xr, c);
        mean = warp_sum(s) / (float)n;
    }
    float ss = 0.0f;
    for (i64 c = lane; c < n; c += NORM_LANES) {
        float d = D::ld(xr, c) - mean;
        ss += d * d;
    }
    float invstd = 1.0f / sqrtf(warp_sum(ss) / (float)n + eps);
    for (i64 c = lane; c < n; c += NORM_LANES) {
        float v = (D::ld(xr, c) - mean) * invstd;
        if (gamma) v *= ld_param(gamma, pdt, c);
        if (beta) v += ld_param(beta, pdt, c);
        D::st(yr, c, v);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mean;
        if (invstd_out) invstd_out[row] = invstd;
    }
}

// dx = invstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma
// (RMS: without the mean(g) term).
template <class D>
__device__ void norm_bwd_dx(const typename D::T* x, const typename D::T* dy, typename D::T* dx, i64 rows, i64 n,
                            const void* gamma, int pdt, const float* mean, const float* invstd, int rms) {
    i64 row = (i64)blockIdx.x * NORM_ROWS + threadIdx.y;
    if (row >= rows) return;
    const typename D::T* xr = x + row * n;
    const typename D::T* dyr = dy + row * n;
    typename D::T* dxr = dx + row * n;
    int lane = threadIdx.x;
    float mu = rms ? 0.0f : mean[row];
    float is = invstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (i64 c = lane; c < n; c += NORM_LANES) {
        float g = D::ld(dyr, c) * (gamma ? ld_param(gamma, pdt, c) : 1.0f);
        sg += g;
        sgx += g * (D::ld(xr, c) - mu) * is;
    }
    float a = rms ? 0.0f : warp_sum(sg) / (float)n;
    float b = warp_sum(sgx) / (float)n;
    for (i64 c = lane; c < n; c += NORM_LANES) {
        float g = D::ld(dyr, c) * (gamma ? ld_param(gamma, pdt, c) : 1.0f);
        float xhat = (D::ld(xr, c) - mu) * is;
        D::st(dxr, c, is * (g - a - xhat * b));
    }
}

// Column partials over rows [k * chunk, (k + 1) * chunk): part[k][c] = (sum dy * xhat,
// sum dy). Grid: (ceil(n / NORM_LANES), chunks); block (NORM_LANES, NORM_ROWS).
template <class D>
__device__ void norm_bwd_params(const typename D::T* x, const typename D::T* dy, i64 rows, i64 n,
                                const float* mean, const float* invstd, int rms, i64 chunk, float* part) {
    __shared__ float acc[2][NORM_ROWS][NORM_LANES];
    i64 c = (i64)blockIdx.x * NORM_LANES + threadIdx.x;
    i64 r0 = (i64)blockIdx.y * chunk;
    i64 r1 = min(rows, r0 + chunk);
    float sgx = 0.0f, sg = 0.0f;
    if (c < n) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += NORM_ROWS) {
            float g = D::ld(dy, r * n + c);
            float mu = rms ? 0.0f : mean[r];
            sgx += g * (D::ld(x, r * n + c) - mu) * invstd[r];
            sg += g;
        }
    }
    acc[0][threadIdx.y][threadIdx.x] = sgx;
    acc[1][threadIdx.y][threadIdx.x] = sg;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        for (int k = 1; k < NORM_ROWS; ++k) {
            sgx += acc[0][k][threadIdx.x];
            sg += acc[1][k][threadIdx.x];
        }
        float* p = part + 2 * ((i64)blockIdx.y * n + c);
        p[0] = sgx;
        p[1] = sg;
    }
}

// dgamma[c] = sum_k part[k][c].0, dbeta[c] = sum_k part[k][c].1 (either may be null).
KERNEL void norm_bwd_params_finalize(const float* part, int chunks, i64 n, void* dgamma, void* dbeta, int pdt) {
    i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (c >= n) return;
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < chunks; ++k) {
        a += part[2 * ((i64)k * n + c)];
        b += part[2 * ((i64)k * n + c) + 1];
    }
    if (dgamma) st_param(dgamma, pdt, c, a);
    if (dbeta) st_param(dbeta, pdt, c, b);
}

#define NORM_ENTRIES(DT, D)                                                                                         \
    KERNEL void norm_fwd_##DT(const D::T* x, D::T* y, i64 rows, i64 n, const void* gamma, const void* beta,       \
                              int pdt, float eps, int rms, float* mean_out, float* invstd_out) {                    \
        norm_fwd<D>(x, y, rows, n, gamma, beta, pdt, eps, rms, mean_out, invstd_out);                              \
    }                                                                                                               \
    KERNEL void norm_bwd_dx_##DT(const D::T* x, const D::T* dy, D::T* dx, i64 rows, i64 n, const void* gamma,     \
                                 int pdt, const float* mean, const float* invstd, int rms) {                        \
        norm_bwd_dx<D>(x, dy, dx, rows, n, gamma, pdt, mean, invstd, rms);                                         \
    }                                                                                                               \
    KERNEL void norm_bwd_params_##DT(const D::T* x, const D::T* dy, i64 rows, i64 n, const float* mean,           \
                                     const float* invstd, int rms, i64 chunk, float* part) {                        \
        norm_bwd_params<D>(x, dy, rows, n, mean, invstd, rms, chunk, part);                                        \
    }

NORM_ENTRIES(f32, DF32)
NORM_ENTRIES(f16, DF16)
NORM_ENTRIES(bf16, DBF16)
