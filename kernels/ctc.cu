// CTC loss (see backend/core/src/kernels/ctc.rs): the log-space forward (alpha) and backward
// (beta) recursions over each sample's blank-extended target l' = [b, y1, b, y2, ..., b]
// (S' = 2S + 1 positions), the loss, and the gradient with respect to the log-probabilities.
// `common.cuh` is prepended. The host mirror is `ctc_loss` / `ctc_loss_backward` in the
// cudnn-backend-reference crate.
//
// Conventions (Burn's `ctc_loss`): an input length is clamped to [1, T] (an empty input reads
// the first step), a target length to [0, S]; a class outside [0, C) has probability 0.
// Everything after the loads runs in double whatever the dtype: log_alpha and log_beta grow
// like -T log C, and the posteriors exp(alpha + beta - lp + nll) cancel them back to O(1),
// so float recursions lose about |alpha| * 2^-24 of each posterior (1e-3 relative at
// T = 1000).
//
// log_probs [T, N, C] and the small operands take element strides; log_alpha / log_beta
// [T, N, S'] (double), nll [N] (double) and grad [T, N, C] (T) are packed row-major.
//
// alpha / beta: one block per sample, sequential in t, threads over s, a barrier per step.
// grad: one block per (t, n) row: zero the row, then for each class of l' the thread of its
// first position sums the posteriors of all its positions in order (no atomics:
// deterministic).

#define CTC_NEG_INF __longlong_as_double(0xfff0000000000000ll)

// log(exp(a) + exp(b)); -inf when both are.
__device__ __forceinline__ double ctc_log_add(double a, double b) {
    const double m = a > b ? a : b;
    if (m == CTC_NEG_INF) return m;
    const double d = a > b ? b - a : a - b;  // -|a - b|, -inf when one side is
    return m + log1p(exp(d));
}

// One sample's view of the problem.
struct CtcArgs {
    i64 steps, batch, classes;   // T, N, C
    i64 lp_st, lp_sn, lp_sc;     // log_probs strides
    i64 max_target;              // S
    i64 tg_sn, tg_ss;            // targets strides
    i64 il_s, tl_s;              // input_lengths / target_lengths strides
    i64 blank;
};

__device__ __forceinline__ i64 ctc_label(const i64* targets, const CtcArgs& a, i64 n, i64 s) {
    return (s & 1) ? targets[n * a.tg_sn + (s >> 1) * a.tg_ss] : a.blank;
}

// Input length clamped to [1, T], target length to [0, S].
__device__ __forceinline__ void ctc_lengths(const i64* il, const i64* tl, const CtcArgs& a, i64 n,
                                            i64& len, i64& tlen) {
    len = il[n * a.il_s];
    len = len < 1 ? 1 : (len > a.steps ? a.steps : len);
    tlen = tl[n * a.tl_s];
    tlen = tlen < 0 ? 0 : (tlen > a.max_target ? a.max_target : tlen);
}

// Whether a path may skip from s - 2 to s.
__device__ __forceinline__ bool ctc_may_skip(const i64* targets, const CtcArgs& a, i64 n, i64 s) {
    if (s < 2) return false;
    const i64 l = ctc_label(targets, a, n, s);
    return l != a.blank && l != ctc_label(targets, a, n, s - 2);
}

template <typename D>
__device__ __forceinline__ double ctc_lp(const typename D::T* lp, const CtcArgs& a, i64 t, i64 n,
                                         i64 c) {
    if (c < 0 || c >= a.classes) return CTC_NEG_INF;
    return (double)D::ld(lp, t * a.lp_st + n * a.lp_sn + c * a.lp_sc);
}

template <typename D>
__device__ void ctc_alpha_impl(const typename D::T* lp, const i64* targets, const i64* il,
                               const i64* tl, CtcArgs a, double* alpha, double* nll) {
    typedef double A;
    const A ninf = CTC_NEG_INF;
    const i64 width = 2 * a.max_target + 1;
    for (i64 n = blockIdx.x; n < a.batch; n += gridDim.x) {
        i64 len, tlen;
        ctc_lengths(il, tl, a, n, len, tlen);
        const i64 valid = 2 * tlen + 1;
        for (i64 s = threadIdx.x; s < width; s += blockDim.x) {
            A v = ninf;
            if (s < valid && s < 2) v = ctc_lp<D>(lp, a, 0, n, ctc_label(targets, a, n, s));
            alpha[n * width + s] = v;
        }
        __syncthreads();
        for (i64 t = 1; t < a.steps; ++t) {
            const A* prev = alpha + ((t - 1) * a.batch + n) * width;
            A* row = alpha + (t * a.batch + n) * width;
            for (i64 s = threadIdx.x; s < width; s += blockDim.x) {
                A v = prev[s];
                if (t < len && s < valid) {
                    if (s >= 1) v = ctc_log_add(v, prev[s - 1]);
                    if (ctc_may_skip(targets, a, n, s)) v = ctc_log_add(v, prev[s - 2]);
                    v += ctc_lp<D>(lp, a, t, n, ctc_label(targets, a, n, s));
                }
                row[s] = v;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            const A* last = alpha + ((len - 1) * a.batch + n) * width;
            A ll = last[2 * tlen];
            if (tlen > 0) ll = ctc_log_add(ll, last[2 * tlen - 1]);
            nll[n] = -ll;
        }
    }
}

template <typename D>
__device__ void ctc_beta_impl(const typename D::T* lp, const i64* targets, const i64* il,
                              const i64* tl, CtcArgs a, double* beta) {
    typedef double A;
    const A ninf = CTC_NEG_INF;
    const i64 width = 2 * a.max_target + 1;
    for (i64 n = blockIdx.x; n < a.batch; n += gridDim.x) {
        i64 len, tlen;
        ctc_lengths(il, tl, a, n, len, tlen);
        const i64 valid = 2 * tlen + 1;
        // Rows from the input length on are never read; they hold -inf.
        for (i64 t = len; t < a.steps; ++t) {
            for (i64 s = threadIdx.x; s < width; s += blockDim.x) beta[(t * a.batch + n) * width + s] = ninf;
        }
        {
            A* row = beta + ((len - 1) * a.batch + n) * width;
            for (i64 s = threadIdx.x; s < width; s += blockDim.x) {
                A v = ninf;
                if (s < valid && s >= valid - 2) v = ctc_lp<D>(lp, a, len - 1, n, ctc_label(targets, a, n, s));
                row[s] = v;
            }
        }
        __syncthreads();
        for (i64 t = len - 2; t >= 0; --t) {
            const A* next = beta + ((t + 1) * a.batch + n) * width;
            A* row = beta + (t * a.batch + n) * width;
            for (i64 s = threadIdx.x; s < width; s += blockDim.x) {
                A v = ninf;
                if (s < valid) {
                    v = next[s];
                    if (s + 1 < valid) v = ctc_log_add(v, next[s + 1]);
                    if (s + 2 < valid && ctc_may_skip(targets, a, n, s + 2)) v = ctc_log_add(v, next[s + 2]);
                    v += ctc_lp<D>(lp, a, t, n, ctc_label(targets, a, n, s));
                }
                row[s] = v;
            }
            __syncthreads();
        }
    }
}

template <typename D>
__device__ void ctc_grad_impl(const typename D::T* lp, const i64* targets, const i64* il,
                              const i64* tl, CtcArgs a, const double* alpha, const double* beta,
                              const double* nll, const typename D::T* grad_loss, i64 gl_s,
                              typename D::T* grad) {
    typedef double A;
    const A ninf = CTC_NEG_INF;
    const A pinf = -ninf;
    const i64 width = 2 * a.max_target + 1;
    const i64 rows = a.steps * a.batch;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 t = r / a.batch, n = r % a.batch;
        i64 len, tlen;
        ctc_lengths(il, tl, a, n, len, tlen);
        const i64 valid = 2 * tlen + 1;
        const A loss = nll[n];
        typename D::T* out = grad + r * a.classes;
        for (i64 c = threadIdx.x; c < a.classes; c += blockDim.x) D::st(out, c, 0);
        __syncthreads();
        if (t < len && loss != pinf) {
            const A g = (A)D::ld(grad_loss, n * gl_s);
            const A* ar = alpha + r * width;
            const A* br = beta + r * width;
            for (i64 s = threadIdx.x; s < valid; s += blockDim.x) {
                const i64 c = ctc_label(targets, a, n, s);
                if (c < 0 || c >= a.classes) continue;
                bool first = true;
                for (i64 j = 0; j < s && first; ++j) first = ctc_label(targets, a, n, j) != c;
                if (!first) continue;
                const A lpc = ctc_lp<D>(lp, a, t, n, c);
                A sum = (A)0;
                for (i64 j = s; j < valid; ++j) {
                    if (ctc_label(targets, a, n, j) != c) continue;
                    const A x = ar[j], y = br[j];
                    if (x == ninf || y == ninf) continue;
                    sum += exp(x + y - lpc + loss);
                }
                D::st(out, c, (typename D::A)(-g * sum));
            }
        }
        __syncthreads();
    }
}

#define CTC_KERNELS(DT, D)                                                                        \
    KERNEL void ctc_alpha_##DT(const D::T* lp, const i64* targets, const i64* il, const i64* tl,  \
                               CtcArgs a, double* alpha, double* nll) {                           \
        ctc_alpha_impl<D>(lp, targets, il, tl, a, alpha, nll);                                    \
    }                                                                                             \
    KERNEL void ctc_beta_##DT(const D::T* lp, const i64* targets, const i64* il, const i64* tl,   \
                              CtcArgs a, double* beta) {                                          \
        ctc_beta_impl<D>(lp, targets, il, tl, a, beta);                                           \
    }                                                                                             \
    KERNEL void ctc_grad_##DT(const D::T* lp, const i64* targets, const i64* il, const i64* tl,   \
                              CtcArgs a, const double* alpha, const double* beta,                \
                              const double* nll,                                                  \
                              const D::T* grad_loss, i64 gl_s, D::T* grad) {                      \
        ctc_grad_impl<D>(lp, targets, il, tl, a, alpha, beta, nll, grad_loss, gl_s, grad);        \
    }

CTC_KERNELS(f32, DF32)
CTC_KERNELS(f64, DF64)
CTC_KERNELS(f16, DF16)
CTC_KERNELS(bf16, DBF16)
