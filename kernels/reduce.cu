// Reductions and scans along one axis (see backend/core/src/kernels/reduce.rs).
//
// The host views every problem as `n_out` rows of `len` elements: the input `Layout` has
// the reduced axis moved LAST, so row `o`, element `k` is at `offset_of(xl, o * len + k)`;
// the output `Layout` enumerates the `n_out` rows (reductions) or the same `n_out * len`
// elements as the input (scans).
//
// Reductions: each row is handled by a group of `group` threads (1, 32 or 256) of a
// 256-thread block; lane `t` accumulates elements t, t + group, ... sequentially, then the
// group combines its partials with a fixed shared-memory tree. The order depends only on
// (len, group), so results are bitwise reproducible run to run.
//
// Accumulators: f32/f16/bf16 in float, f64 in double, integers and bool in i64 (sums and
// products wrap, stored truncated to the output type). Max/Min propagate NaN.
//
// Two more reduction paths, picked by the host planner (reduce.rs):
// * split rows (few long rows): `reduce_split_*` reduces chunk c of row o with one block and
//   writes the partial to an accumulator-typed scratch buffer at [c * n_out + o];
//   `reduce_finish_*` combines the partials of each row in a fixed order and stores.
// * columns (reduced axis not innermost): `reduce_cols_*` maps consecutive threads to
//   consecutive outputs, so a warp reads contiguous memory; long axes are split across
//   blockIdx.y into the same scratch layout, then `reduce_finish_*`.
// Mean partials are plain sums (the finish divides by the full length); any/all partials are
// 0/1. Every order depends only on the plan (shapes and strides), never on timing.

#define RED_THREADS 256

#define OP_SUM 0
#define OP_PROD 1
#define OP_MEAN 2
#define OP_MAX 3
#define OP_MIN 4
#define OP_ANY 5
#define OP_ALL 6

#define SCAN_SUM 0
#define SCAN_PROD 1
#define SCAN_MAX 2
#define SCAN_MIN 3

// ---- loads / stores per storage type -------------------------------------------------

__device__ __forceinline__ float ld_acc(const float* p, i64 o) { return p[o]; }
__device__ __forceinline__ double ld_acc(const double* p, i64 o) { return p[o]; }
__device__ __forceinline__ i64 ld_acc(const i64* p, i64 o) { return p[o]; }
__device__ __forceinline__ i64 ld_acc(const i32* p, i64 o) { return (i64)p[o]; }
__device__ __forceinline__ i64 ld_acc(const i8* p, i64 o) { return (i64)p[o]; }
__device__ __forceinline__ i64 ld_acc(const u8* p, i64 o) { return (i64)p[o]; }

__device__ __forceinline__ void st_acc(float* p, i64 o, float v) { p[o] = v; }
__device__ __forceinline__ void st_acc(double* p, i64 o, double v) { p[o] = v; }
__device__ __forceinline__ void st_acc(i64* p, i64 o, i64 v) { p[o] = v; }
__device__ __forceinline__ void st_acc(i32* p, i64 o, i64 v) { p[o] = (i32)(u32)(u64)v; }
__device__ __forceinline__ void st_acc(i8* p, i64 o, i64 v) { p[o] = (i8)(u8)(u64)v; }
__device__ __forceinline__ void st_acc(u8* p, i64 o, i64 v) { p[o] = (u8)(u64)v; }

// f16 and bf16 are both stored as u16: a tag type picks the conversion.
struct half_t { u16 b; };
struct bhalf_t { u16 b; };
__device__ __forceinline__ float ld_acc(const half_t* p, i64 o) { return f16_to_f32(p[o].b); }
__device__ __forceinline__ float ld_acc(const bhalf_t* p, i64 o) { return bf16_to_f32(p[o].b); }
__device__ __forceinline__ void st_acc(half_t* p, i64 o, float v) { p[o].b = f32_to_f16(v); }
__device__ __forceinline__ void st_acc(bhalf_t* p, i64 o, float v) { p[o].b = f32_to_bf16(v); }

// ---- accumulator arithmetic -------------------------------------------------------------

__device__ __forceinline__ bool is_nan(float v) { return v != v; }
__device__ __forceinline__ bool is_nan(double v) { return v != v; }
__device__ __forceinline__ bool is_nan(i64) { return false; }

__device__ __forceinline__ float add_acc(float a, float b) { return a + b; }
__device__ __forceinline__ double add_acc(double a, double b) { return a + b; }
__device__ __forceinline__ i64 add_acc(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ float mul_acc(float a, float b) { return a * b; }
__device__ __forceinline__ double mul_acc(double a, double b) { return a * b; }
__device__ __forceinline__ i64 mul_acc(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

template <typename A> __device__ __forceinline__ A lowest();
template <> __device__ __forceinline__ float lowest<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double lowest<double>() { return -__longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ __forceinline__ i64 lowest<i64>() { return (i64)0x8000000000000000ULL; }
template <typename A> __device__ __forceinline__ A highest();
template <> __device__ __forceinline__ float highest<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double highest<double>() { return __longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ __forceinline__ i64 highest<i64>() { return 0x7fffffffffffffffLL; }

// NaN-propagating max / min (a NaN anywhere wins, whatever the order).
template <typename A> __device__ __forceinline__ A max_acc(A a, A b) {
    if (is_nan(a)) return a;
    return (is_nan(b) || b > a) ? b : a;
}
template <typename A> __device__ __forceinline__ A min_acc(A a, A b) {
    if (is_nan(a)) return a;
    return (is_nan(b) || b < a) ? b : a;
}

template <typename A> __device__ __forceinline__ A red_identity(int op) {
    switch (op) {
    case OP_PROD: return (A)1;
    case OP_MAX: return lowest<A>();
    case OP_MIN: return highest<A>();
    case OP_ALL: return (A)1;
    default: return (A)0;  // sum, mean, any
    }
}

// Maps a loaded value into the accumulator domain of `op` (truth value for any/all).
template <typename A> __device__ __forceinline__ A red_lift(int op, A v) {
    if (op == OP_ANY || op == OP_ALL) return (v != (A)0) ? (A)1 : (A)0;
    return v;
}

template <typename A> __device__ __forceinline__ A red_combine(int op, A a, A b) {
    switch (op) {
    case OP_SUM:
    case OP_MEAN: return add_acc(a, b);
    case OP_PROD: return mul_acc(a, b);
    case OP_MAX:
    case OP_ANY: return max_acc(a, b);
    default: return min_acc(a, b);  // min, all
    }
}

// ---- reductions ---------------------------------------------------------------------------

// Stores a finished accumulator at out[oo]: 0/1 bytes for any/all, the mean divided by
// `mean_len`, everything else converted to the output type `T`.
template <typename T, typename A>
__device__ __forceinline__ void red_store(void* out, i64 oo, int op, A acc, i64 mean_len) {
    if (op == OP_ANY || op == OP_ALL) {
        ((u8*)out)[oo] = acc != (A)0 ? 1 : 0;
    } else {
        if (op == OP_MEAN) acc = acc / (A)mean_len;
        st_acc((T*)out, oo, acc);
    }
}

// Whether row o's element k sits at offset_of(l, o * len) + k * row_step(l): true when the
// layout's last dim holds whole rows (its extent is a multiple of len), which is always the
// case for `reduce` (the axis is the last dim before merging) and for a packed `reduce_all`.
__device__ __forceinline__ bool rows_are_linear(const Layout& l, i64 len) {
    return len > 0 && (l.rank == 0 || l.shape[l.rank - 1] % len == 0);
}
__device__ __forceinline__ i64 row_step(const Layout& l) { return l.rank == 0 ? 0 : l.strides[l.rank - 1]; }

// Folds elements [k0, k1) of row o, lane-strided from k0 + lane by `step_k`, into `acc`.
template <typename T, typename A>
__device__ __forceinline__ A red_row_range(const T* __restrict__ x, const Layout& xl, bool linear, i64 o, i64 len,
                                           i64 k0, i64 k1, int step_k, int op, A acc) {
    if (linear) {
        const T* p = x + offset_of(xl, o * len);
        const i64 s = row_step(xl);
#pragma unroll 8
        for (i64 k = k0; k < k1; k += step_k) acc = red_combine<A>(op, acc, red_lift<A>(op, ld_acc(p, k * s)));
    } else {
        for (i64 k = k0; k < k1; k += step_k)
            acc = red_combine<A>(op, acc, red_lift<A>(op, ld_acc(x, offset_of(xl, o * len + k))));
    }
    return acc;
}

// The largest accumulator/pair is 16 bytes; one slot per thread.
template <typename T, typename A>
__device__ void reduce_impl(const T* __restrict__ x, Layout xl, void* __restrict__ out, Layout ol,
                            i64 n_out, i64 len, int op, int group) {
    __shared__ A sh[RED_THREADS];
    const int tid = threadIdx.x;
    const int lane = tid % group;
    const int slot = tid / group;
    const i64 per_block = blockDim.x / group;
    const bool linear = rows_are_linear(xl, len);
    for (i64 base = blockIdx.x * per_block; base < n_out; base += (i64)gridDim.x * per_block) {
        const i64 o = base + slot;
        A acc = red_identity<A>(op);
        if (o < n_out) acc = red_row_range<T, A>(x, xl, linear, o, len, lane, len, group, op, acc);
        if (group > 1) {
            sh[tid] = acc;
            __syncthreads();
            for (int s = group >> 1; s > 0; s >>= 1) {
                if (lane < s) sh[tid] = red_combine<A>(op, sh[tid], sh[tid + s]);
                __syncthreads();
            }
            acc = sh[tid];
            __syncthreads();
        }
        if (lane == 0 && o < n_out) red_store<T, A>(out, offset_of(ol, o), op, acc, len);
    }
}

// Split rows, pass 1: block b (grid-stride) reduces chunk c = b % parts of row o = b / parts,
// elements [c * chunk, min(len, (c + 1) * chunk)), thread t taking k = c * chunk + t,
// + blockDim.x, ...; a fixed block tree combines them and thread 0 writes
// partial[c * n_out + o] (not divided for mean; 0/1 for any/all).
template <typename T, typename A>
__device__ void reduce_split_impl(const T* __restrict__ x, Layout xl, A* __restrict__ partial, i64 n_out, i64 len,
                                  i64 chunk, i64 parts, int op) {
    __shared__ A sh[RED_THREADS];
    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    const bool linear = rows_are_linear(xl, len);
    for (i64 b = blockIdx.x; b < n_out * parts; b += gridDim.x) {
        const i64 o = b / parts;
        const i64 c = b - o * parts;
        const i64 k0 = c * chunk;
        const i64 k1 = k0 + chunk < len ? k0 + chunk : len;
        A acc = red_row_range<T, A>(x, xl, linear, o, len, k0 + tid, k1, nt, op, red_identity<A>(op));
        sh[tid] = acc;
        __syncthreads();
        for (int s = nt >> 1; s > 0; s >>= 1) {
            if (tid < s) sh[tid] = red_combine<A>(op, sh[tid], sh[tid + s]);
            __syncthreads();
        }
        if (tid == 0) partial[c * n_out + o] = sh[0];
        __syncthreads();
    }
}

// Columns: the input is (outer, len, inner) with element strides (so, sl, 1), and output
// o = i * inner + j reduces x[i * so + k * sl + j] over k. A block of blockDim.x = tx * ty
// threads (tx a power of two <= 32) covers tx consecutive j of one i (tile blockIdx.x,
// grid-stride) and the chunk [c * chunk, min(len, (c + 1) * chunk)) of k, c = blockIdx.y:
// thread (lx, ly) = (tid % tx, tid / tx) takes k = c * chunk + ly, + ty, ...; a fixed tree over
// ly combines them. Without `partial` (one chunk) the result is stored at offset_of(ol, o)
// (mean divided by mean_len); with it, at partial[c * n_out + o], n_out = outer * inner.
// `reduce_finish_*` is this kernel over the partials viewed as (1, parts, n_out).
template <typename In, typename T, typename A>
__device__ void reduce_cols_impl(const In* __restrict__ x, i64 outer, i64 len, i64 inner, i64 so, i64 sl,
                                 void* __restrict__ out, Layout ol, A* __restrict__ partial, i64 chunk,
                                 i64 mean_len, int op, int tx) {
    __shared__ A sh[RED_THREADS];
    const int tid = threadIdx.x;
    const int lx = tid % tx;
    const int ly = tid / tx;
    const int ty = blockDim.x / tx;
    const i64 tiles_per_outer = (inner + tx - 1) / tx;
    const i64 n_tiles = outer * tiles_per_outer;
    const i64 n_out = outer * inner;
    const i64 c = blockIdx.y;
    const i64 k0 = c * chunk;
    const i64 k1 = k0 + chunk < len ? k0 + chunk : len;
    for (i64 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const i64 i = t / tiles_per_outer;
        const i64 j = (t - i * tiles_per_outer) * tx + lx;
        A acc = red_identity<A>(op);
        if (j < inner) {
            const In* p = x + i * so + j;
#pragma unroll 8
            for (i64 k = k0 + ly; k < k1; k += ty) acc = red_combine<A>(op, acc, red_lift<A>(op, ld_acc(p, k * sl)));
        }
        sh[tid] = acc;
        __syncthreads();
        for (int s = ty >> 1; s > 0; s >>= 1) {
            if (ly < s) sh[tid] = red_combine<A>(op, sh[tid], sh[tid + s * tx]);
            __syncthreads();
        }
        if (ly == 0 && j < inner) {
            const i64 o = i * inner + j;
            if (partial != nullptr) {
                partial[c * n_out + o] = sh[tid];
            } else {
                red_store<T, A>(out, offset_of(ol, o), op, sh[tid], mean_len);
            }
        }
        __syncthreads();
    }
}

// ---- arg-reductions -------------------------------------------------------------------------

// Sequential reference semantics: best = x[0]; for k >= 1, take x[k] when strictly better.
// So a NaN is chosen only at k = 0 (then it sticks); ties keep the smaller index. Partials
// are (value, index) with index -1 for "nothing yet"; combining is associative and
// commutative, so any fixed tree gives the sequential answer.
template <typename A>
__device__ __forceinline__ void arg_combine(bool is_max, A& av, i64& ai, A bv, i64 bi) {
    if (bi < 0) return;
    if (ai < 0) { av = bv; ai = bi; return; }
    if (is_nan(av)) return;  // only index 0 can hold a NaN
    if (is_nan(bv)) { av = bv; ai = bi; return; }
    const bool better = is_max ? (bv > av) : (bv < av);
    if (better || (bv == av && bi < ai)) { av = bv; ai = bi; }
}

template <typename T, typename A>
__device__ void argreduce_impl(const T* __restrict__ x, Layout xl, i64* __restrict__ out, Layout ol,
                               i64 n_out, i64 len, int op, int group) {
    __shared__ A shv[RED_THREADS];
    __shared__ i64 shi[RED_THREADS];
    const bool is_max = op == 0;
    const int tid = threadIdx.x;
    const int lane = tid % group;
    const int slot = tid / group;
    const i64 per_block = blockDim.x / group;
    for (i64 base = blockIdx.x * per_block; base < n_out; base += (i64)gridDim.x * per_block) {
        const i64 o = base + slot;
        A bv = (A)0;
        i64 bi = -1;
        if (o < n_out) {
            for (i64 k = lane; k < len; k += group) {
                A v = ld_acc(x, offset_of(xl, o * len + k));
                if (k != 0 && is_nan(v)) continue;
                arg_combine<A>(is_max, bv, bi, v, k);
            }
        }
        if (group > 1) {
            shv[tid] = bv;
            shi[tid] = bi;
            __syncthreads();
            for (int s = group >> 1; s > 0; s >>= 1) {
                if (lane < s) {
                    A v = shv[tid];
                    i64 i = shi[tid];
                    arg_combine<A>(is_max, v, i, shv[tid + s], shi[tid + s]);
                    shv[tid] = v;
                    shi[tid] = i;
                }
                __syncthreads();
            }
            bi = shi[tid];
            __syncthreads();
        }
        if (lane == 0 && o < n_out) out[offset_of(ol, o)] = bi < 0 ? 0 : bi;
    }
}

// ---- scans ----------------------------------------------------------------------------------

template <typename A> __device__ __forceinline__ A scan_identity(int op) {
    switch (op) {
    case SCAN_PROD: return (A)1;
    case SCAN_MAX: return lowest<A>();
    case SCAN_MIN: return highest<A>();
    default: return (A)0;
    }
}

template <typename A> __device__ __forceinline__ A scan_combine(int op, A a, A b) {
    switch (op) {
    case SCAN_SUM: return add_acc(a, b);
    case SCAN_PROD: return mul_acc(a, b);
    case SCAN_MAX: return max_acc(a, b);
    default: return min_acc(a, b);
    }
}

// group == 1: one thread per row, sequential. group == blockDim.x: one block per row, a
// Hillis-Steele block scan per chunk of blockDim elements plus the running prefix of the
// earlier chunks (sequential over chunks). `ol` enumerates the same n_out * len elements.
template <typename T, typename A>
__device__ void scan_impl(const T* __restrict__ x, Layout xl, T* __restrict__ out, Layout ol,
                          i64 n_out, i64 len, int op, int group) {
    __shared__ A sh[RED_THREADS];
    if (group == 1) {
        FOR_EACH(o, n_out) {
            A acc = scan_identity<A>(op);
            for (i64 k = 0; k < len; ++k) {
                const i64 i = o * len + k;
                acc = k == 0 ? ld_acc(x, offset_of(xl, i)) : scan_combine<A>(op, acc, ld_acc(x, offset_of(xl, i)));
                st_acc(out, offset_of(ol, i), acc);
            }
        }
        return;
    }
    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        A carry = scan_identity<A>(op);
        bool have_carry = false;
        for (i64 c0 = 0; c0 < len; c0 += nt) {
            const i64 k = c0 + tid;
            A v = k < len ? ld_acc(x, offset_of(xl, o * len + k)) : scan_identity<A>(op);
            sh[tid] = v;
            __syncthreads();
            for (int s = 1; s < nt; s <<= 1) {
                A other = tid >= s ? sh[tid - s] : v;
                __syncthreads();
                if (tid >= s) {
                    v = scan_combine<A>(op, other, v);
                    sh[tid] = v;
                }
                __syncthreads();
            }
            const A r = have_carry ? scan_combine<A>(op, carry, v) : v;
            if (k < len) st_acc(out, offset_of(ol, o * len + k), r);
            const A last = sh[nt - 1];
            carry = have_carry ? scan_combine<A>(op, carry, last) : last;
            have_carry = true;
            __syncthreads();
        }
    }
}

// ---- entry points -----------------------------------------------------------------------------

#define REDUCE_ENTRIES(NAME, T, A)                                                                   \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        reduce_##NAME(const T* x, Layout xl, void* out, Layout ol, i64 n_out, i64 len, int op,       \
                      int group) {                                                                   \
        reduce_impl<T, A>(x, xl, out, ol, n_out, len, op, group);                                    \
    }                                                                                                \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        reduce_split_##NAME(const T* x, Layout xl, A* partial, i64 n_out, i64 len, i64 chunk, i64 parts, \
                            int op) {                                                                \
        reduce_split_impl<T, A>(x, xl, partial, n_out, len, chunk, parts, op);                       \
    }                                                                                                \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        reduce_cols_##NAME(const T* x, i64 outer, i64 len, i64 inner, i64 so, i64 sl, void* out,      \
                           Layout ol, A* partial, i64 chunk, i64 mean_len, int op, int tx) {         \
        reduce_cols_impl<T, T, A>(x, outer, len, inner, so, sl, out, ol, partial, chunk, mean_len, op, tx); \
    }                                                                                                \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        reduce_finish_##NAME(const A* x, i64 outer, i64 len, i64 inner, i64 so, i64 sl, void* out,    \
                             Layout ol, A* partial, i64 chunk, i64 mean_len, int op, int tx) {       \
        reduce_cols_impl<A, T, A>(x, outer, len, inner, so, sl, out, ol, partial, chunk, mean_len, op, tx); \
    }                                                                                                \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        argreduce_##NAME(const T* x, Layout xl, i64* out, Layout ol, i64 n_out, i64 len, int op,     \
                         int group) {                                                                \
        argreduce_impl<T, A>(x, xl, out, ol, n_out, len, op, group);                                 \
    }                                                                                                \
    KERNEL void __launch_bounds__(RED_THREADS)                                                       \
        scan_##NAME(const T* x, Layout xl, T* out, Layout ol, i64 n_out, i64 len, int op,            \
                    int group) {                                                                     \
        scan_impl<T, A>(x, xl, out, ol, n_out, len, op, group);                                      \
    }

REDUCE_ENTRIES(f32, float, float)
REDUCE_ENTRIES(f16, half_t, float)
REDUCE_ENTRIES(bf16, bhalf_t, float)
REDUCE_ENTRIES(f64, double, double)
REDUCE_ENTRIES(i64, i64, i64)
REDUCE_ENTRIES(i32, i32, i64)
REDUCE_ENTRIES(i8, i8, i64)
REDUCE_ENTRIES(u8, u8, i64)
