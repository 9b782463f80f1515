// Direct convolution (cross-correlation, cuDNN's CROSS_CORRELATION mode) forward, backward
// data and backward filter on strided views, 1 to 3 spatial dims, with padding, stride,
// dilation and groups (see backend/core/src/kernels/conv.rs). `common.cuh` is prepended.
//
// The host pads 1-D and 2-D problems to 3 spatial dims (leading size-1 dims, kernel 1,
// stride 1, dilation 1, padding 0), so every kernel sees
//   x [N, C, I0, I1, I2], w [K, C/groups, R0, R1, R2], y [N, K, O0, O1, O2]
// as element strides `xs`, `ws`, `ys` (dx, dw and dy use the same slots in the backwards).
// f16/bf16 accumulate in f32, f32 in f32 and f64 in f64, with one rounding at the store.
//
// No atomics anywhere: every output element is written exactly once, by one thread
// (forward, backward data) or one block (backward filter, a fixed-shape tree reduction),
// so results are bit-reproducible for the same shapes.

// Geometry and strides; matches `ConvShape` on the host (backend/core/src/ffi/launch_conv.rs).
struct ConvShape {
    i64 n, c, k, cg, kg;        // batch, input channels, output channels, per group
    i64 in[3], ker[3], out[3];  // spatial sizes
    i64 pre[3], stride[3], dil[3];
    i64 xs[5], ws[5], ys[5];    // element strides of x / dx, w / dw, y / dy
    // The walk over the written tensor's items follows its memory order: logical dim d of
    // item i is (i / div[d]) % dims[d] (consecutive threads write neighbouring elements).
    i64 div[5];
    int index32;  // 1: the written tensor has fewer than 2^31 elements (32-bit decoding)
    int pad_;
};

// Coordinate `d` (size `size`) of item `i` of the written tensor.
__device__ __forceinline__ i64 conv_coord(const ConvShape& s, i64 i, int d, i64 size) {
    if (s.index32) return (i64)(((u32)i / (u32)s.div[d]) % (u32)size);
    return (i / s.div[d]) % size;
}

// The steps r in [lo, hi) of `0 <= base + r * step < len`, r < count (an empty range has
// lo == hi).
__device__ __forceinline__ void conv_range(i64 base, i64 step, i64 len, i64 count, i64& lo, i64& hi) {
    lo = base >= 0 ? 0 : (-base + step - 1) / step;
    const i64 top = len - 1 - base;
    hi = top < 0 ? 0 : min(count, top / step + 1);
    if (hi < lo) hi = lo;
}

// ---------------------------------------------------------------------------------------
// forward: one thread per y element, summing over the taps of its window that fall inside
// the input (padding contributes nothing) and its group's input channels, in the order
// (r0, r1, r2, channel).

template <class D>
__device__ __forceinline__ void conv_fwd(const typename D::T* x, const typename D::T* w, typename D::T* y,
                                         const ConvShape& s, i64 n) {
    typedef typename D::A A;
    FOR_EACH(i, n) {
        const i64 b = conv_coord(s, i, 0, s.n), k = conv_coord(s, i, 1, s.k);
        i64 o[3], lo[3], hi[3], base[3];
#pragma unroll
        for (int d = 0; d < 3; ++d) {
            o[d] = conv_coord(s, i, 2 + d, s.out[d]);
            base[d] = o[d] * s.stride[d] - s.pre[d];
            conv_range(base[d], s.dil[d], s.in[d], s.ker[d], lo[d], hi[d]);
        }
        const i64 g = k / s.kg;
        const i64 xb = b * s.xs[0] + g * s.cg * s.xs[1];
        const i64 wb = k * s.ws[0];
        A acc = 0;
        for (i64 r0 = lo[0]; r0 < hi[0]; ++r0) {
            const i64 x0 = xb + (base[0] + r0 * s.dil[0]) * s.xs[2], w0 = wb + r0 * s.ws[2];
            for (i64 r1 = lo[1]; r1 < hi[1]; ++r1) {
                const i64 x1 = x0 + (base[1] + r1 * s.dil[1]) * s.xs[3], w1 = w0 + r1 * s.ws[3];
                for (i64 r2 = lo[2]; r2 < hi[2]; ++r2) {
                    const i64 x2 = x1 + (base[2] + r2 * s.dil[2]) * s.xs[4], w2 = w1 + r2 * s.ws[4];
                    for (i64 cc = 0; cc < s.cg; ++cc) {
                        acc += D::ld(x, x2 + cc * s.xs[1]) * D::ld(w, w2 + cc * s.ws[1]);
                    }
                }
            }
        }
        D::st(y, b * s.ys[0] + k * s.ys[1] + o[0] * s.ys[2] + o[1] * s.ys[3] + o[2] * s.ys[4], acc);
    }
}

// ---------------------------------------------------------------------------------------
// backward data: one thread per dx element, gathering dy * w over the output positions
// whose window covers it (tap r reaches input i from output o = (i + pre - r * dil) / stride
// when that division is exact and o is in range) and its group's output channels, in the
// order (r0, r1, r2, output channel).

template <class D>
__device__ __forceinline__ void conv_bwd_data(const typename D::T* dy, const typename D::T* w, typename D::T* dx,
                                              const ConvShape& s, i64 n) {
    typedef typename D::A A;
    FOR_EACH(i, n) {
        const i64 b = conv_coord(s, i, 0, s.n), c = conv_coord(s, i, 1, s.c);
        const i64 i0 = conv_coord(s, i, 2, s.in[0]), i1 = conv_coord(s, i, 3, s.in[1]),
                  i2 = conv_coord(s, i, 4, s.in[2]);
        const i64 g = c / s.cg, cc = c - g * s.cg;
        const i64 yb = b * s.ys[0] + g * s.kg * s.ys[1];
        const i64 wb = g * s.kg * s.ws[0] + cc * s.ws[1];
        A acc = 0;
        for (i64 r0 = 0; r0 < s.ker[0]; ++r0) {
            const i64 t0 = i0 + s.pre[0] - r0 * s.dil[0];
            if (t0 < 0) break;  // t0 only decreases with r0
            if (t0 % s.stride[0] != 0 || t0 / s.stride[0] >= s.out[0]) continue;
            const i64 y0 = yb + (t0 / s.stride[0]) * s.ys[2], w0 = wb + r0 * s.ws[2];
            for (i64 r1 = 0; r1 < s.ker[1]; ++r1) {
                const i64 t1 = i1 + s.pre[1] - r1 * s.dil[1];
                if (t1 < 0) break;
                if (t1 % s.stride[1] != 0 || t1 / s.stride[1] >= s.out[1]) continue;
                const i64 y1 = y0 + (t1 / s.stride[1]) * s.ys[3], w1 = w0 + r1 * s.ws[3];
                for (i64 r2 = 0; r2 < s.ker[2]; ++r2) {
                    const i64 t2 = i2 + s.pre[2] - r2 * s.dil[2];
                    if (t2 < 0) break;
                    if (t2 % s.stride[2] != 0 || t2 / s.stride[2] >= s.out[2]) continue;
                    const i64 y2 = y1 + (t2 / s.stride[2]) * s.ys[4], w2 = w1 + r2 * s.ws[4];
                    for (i64 kk = 0; kk < s.kg; ++kk) {
                        acc += D::ld(dy, y2 + kk * s.ys[1]) * D::ld(w, w2 + kk * s.ws[0]);
                    }
                }
            }
        }
        D::st(dx, b * s.xs[0] + c * s.xs[1] + i0 * s.xs[2] + i1 * s.xs[3] + i2 * s.xs[4], acc);
    }
}

// ---------------------------------------------------------------------------------------
// backward filter: one block per dw element (grid-stride over blocks). For tap r the
// output positions o whose input o * stride - pre + r * dil lies inside x form one box
// [lo, lo + len) per dim; thread t sums the items t, t + blockDim, ... of the row-major
// walk over (n, box), then a fixed tree (blockDim a power of two, at most
// CONV_RED_THREADS) adds the per-thread sums: the same shapes and block size always give
// the same bits.

#define CONV_RED_THREADS 256

template <class D>
__device__ __forceinline__ void conv_bwd_filter(const typename D::T* x, const typename D::T* dy,
                                                typename D::T* dw, const ConvShape& s, i64 n) {
    typedef typename D::A A;
    __shared__ A red[CONV_RED_THREADS];
    const unsigned t = threadIdx.x;
    for (i64 e = blockIdx.x; e < n; e += gridDim.x) {
        const i64 k = conv_coord(s, e, 0, s.k), cc = conv_coord(s, e, 1, s.cg);
        i64 r[3], lo[3], len[3];
        i64 xb = 0, yb = 0;
#pragma unroll
        for (int d = 0; d < 3; ++d) {
            r[d] = conv_coord(s, e, 2 + d, s.ker[d]);
            const i64 shift = r[d] * s.dil[d] - s.pre[d];
            i64 hi;
            conv_range(shift, s.stride[d], s.in[d], s.out[d], lo[d], hi);
            len[d] = hi - lo[d];
            xb += (lo[d] * s.stride[d] + shift) * s.xs[2 + d];
            yb += lo[d] * s.ys[2 + d];
        }
        const i64 g = k / s.kg;
        xb += (g * s.cg + cc) * s.xs[1];
        yb += k * s.ys[1];
        const i64 sx0 = s.stride[0] * s.xs[2], sx1 = s.stride[1] * s.xs[3], sx2 = s.stride[2] * s.xs[4];
        const i64 l12 = len[1] * len[2], per = len[0] * l12, total = s.n * per;
        A acc = 0;
        if (total < ((i64)1 << 31)) {
            const u32 uper = (u32)per, ul12 = (u32)l12, ul2 = (u32)len[2];
            for (u32 j = t; j < (u32)total; j += blockDim.x) {
                const u32 bn = j / uper, rem = j - bn * uper, a0 = rem / ul12, rem2 = rem - a0 * ul12;
                const u32 a1 = rem2 / ul2, a2 = rem2 - a1 * ul2;
                acc += D::ld(x, xb + bn * s.xs[0] + a0 * sx0 + a1 * sx1 + a2 * sx2) *
                       D::ld(dy, yb + bn * s.ys[0] + a0 * s.ys[2] + a1 * s.ys[3] + a2 * s.ys[4]);
            }
        } else {
            for (i64 j = t; j < total; j += blockDim.x) {
                const i64 bn = j / per, rem = j - bn * per, a0 = rem / l12, rem2 = rem - a0 * l12;
                const i64 a1 = rem2 / len[2], a2 = rem2 - a1 * len[2];
                acc += D::ld(x, xb + bn * s.xs[0] + a0 * sx0 + a1 * sx1 + a2 * sx2) *
                       D::ld(dy, yb + bn * s.ys[0] + a0 * s.ys[2] + a1 * s.ys[3] + a2 * s.ys[4]);
            }
        }
        red[t] = acc;
        __syncthreads();
        for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
            if (t < h) red[t] += red[t + h];
            __syncthreads();
        }
        if (t == 0)
            D::st(dw, k * s.ws[0] + cc * s.ws[1] + r[0] * s.ws[2] + r[1] * s.ws[3] + r[2] * s.ws[4], red[0]);
        __syncthreads();  // red[0] is read before the next element overwrites it
    }
}

// ---------------------------------------------------------------------------------------
// entry points

#define CONV_ENTRIES(S, D)                                                                    \
    KERNEL void conv_fwd_##S(const D::T* x, const D::T* w, D::T* y, ConvShape s, i64 n) {     \
        conv_fwd<D>(x, w, y, s, n);                                                           \
    }                                                                                         \
    KERNEL void conv_bwd_data_##S(const D::T* dy, const D::T* w, D::T* dx, ConvShape s,       \
                                  i64 n) {                                                    \
        conv_bwd_data<D>(dy, w, dx, s, n);                                                    \
    }                                                                                         \
    KERNEL void __launch_bounds__(CONV_RED_THREADS)                                           \
        conv_bwd_filter_##S(const D::T* x, const D::T* dy, D::T* dw, ConvShape s, i64 n) {    \
        conv_bwd_filter<D>(x, dy, dw, s, n);                                                  \
    }

CONV_ENTRIES(f32, DF32)
CONV_ENTRIES(f16, DF16)
CONV_ENTRIES(bf16, DBF16)
CONV_ENTRIES(f64, DF64)
