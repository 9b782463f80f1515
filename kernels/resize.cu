// Resize kernels on strided [N, C, H, W] views (see backend/core/src/kernels/resize.rs):
// nearest, bilinear and bicubic interpolation with their backwards (scatter, or two gather
// passes in deterministic mode), and bilinear
// grid sampling with zeros padding. Index conventions follow burn-ndarray 0.21 (PyTorch):
// source coordinates are computed in f64, values accumulate in f32 for f16/bf16.
// `common.cuh` is prepended.
//
// Every kernel runs a grid-stride loop over the `n` elements of the tensor it iterates
// (row-major over that tensor's logical dims); every operand is a rank-4 `Layout`
// (offset 0: the pointer carries the offset).

// ---------------------------------------------------------------------------------------
// Source coordinates (mirrored by the host's unit-test helpers).

// Nearest: floor(o * (in / out)) in f64, kept inside the input.
__device__ __forceinline__ i64 nearest_src(i64 o, i64 in, i64 out) {
    const double ratio = (double)in / (double)out;
    const i64 s = (i64)floor(ratio * (double)o);
    return min(s, in - 1);
}

// Linear/cubic: align_corners maps the corner pixel centres onto each other
// (o * (in - 1) / max(out - 1, 1)); otherwise half-pixel centres ((o + 0.5) * in / out - 0.5,
// not clamped here: bilinear clamps to [0, in - 1], bicubic clamps its taps).
__device__ __forceinline__ double linear_src(i64 o, i64 in, i64 out, int align) {
    if (align) return ((double)(in - 1) / (double)max(out - 1, (i64)1)) * (double)o;
    return ((double)o + 0.5) * ((double)in / (double)out) - 0.5;
}

// Bilinear taps along one axis: i0, i1 = min(ceil, in - 1) and the weight of i1.
__device__ __forceinline__ void linear_taps(i64 o, i64 in, i64 out, int align, i64& i0, i64& i1, double& t) {
    double s = linear_src(o, in, out, align);
    if (!align) s = fmin(fmax(s, 0.0), (double)(in - 1));
    const double f = floor(s);
    i0 = (i64)f;
    i1 = min((i64)ceil(s), in - 1);
    t = s - f;
}

// Bicubic taps along one axis (A = -0.75): indices floor - 1 .. floor + 2 clamped to the
// input, and their weights.
__device__ __forceinline__ void cubic_taps(i64 o, i64 in, i64 out, int align, i64 idx[4], double w[4]) {
    const double s = linear_src(o, in, out, align);
    const double f = floor(s);
    const double t = s - f;
    const i64 base = (i64)f;
    const double A = -0.75;
    const double x0 = t + 1.0, x1 = t, x2 = 1.0 - t, x3 = 2.0 - t;
    w[0] = ((A * x0 - 5.0 * A) * x0 + 8.0 * A) * x0 - 4.0 * A;
    w[1] = ((A + 2.0) * x1 - (A + 3.0)) * x1 * x1 + 1.0;
    w[2] = ((A + 2.0) * x2 - (A + 3.0)) * x2 * x2 + 1.0;
    w[3] = ((A * x3 - 5.0 * A) * x3 + 8.0 * A) * x3 - 4.0 * A;
    for (int k = 0; k < 4; ++k) idx[k] = min(max(base - 1 + k, (i64)0), in - 1);
}

// ---------------------------------------------------------------------------------------
// Forward: gather per output element.

template <class D>
__device__ __forceinline__ void nearest_fwd(const typename D::T* x, typename D::T* out, const Layout& lx,
                                            const Layout& lo, int align, i64 n) {
    (void)align;
    const i64 H = lx.shape[2], W = lx.shape[3], OH = lo.shape[2], OW = lo.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow;
        coords4(lo, i, b, c, oh, ow);
        const i64 ih = nearest_src(oh, H, OH), iw = nearest_src(ow, W, OW);
        D::st(out, off4(lo, b, c, oh, ow), D::ld(x, off4(lx, b, c, ih, iw)));
    }
}

template <class D>
__device__ __forceinline__ void bilinear_fwd(const typename D::T* x, typename D::T* out, const Layout& lx,
                                             const Layout& lo, int align, i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3], OH = lo.shape[2], OW = lo.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow, h0, h1, w0, w1;
        double th, tw;
        coords4(lo, i, b, c, oh, ow);
        linear_taps(oh, H, OH, align, h0, h1, th);
        linear_taps(ow, W, OW, align, w0, w1, tw);
        const typename D::T* p = x + b * lx.strides[0] + c * lx.strides[1];
        const i64 sh = lx.strides[2], sw = lx.strides[3];
        const A yh = (A)th, yl = (A)(1.0 - th), xh = (A)tw, xl = (A)(1.0 - tw);
        A r = D::ld(p, h0 * sh + w0 * sw) * xl * yl + D::ld(p, h0 * sh + w1 * sw) * xh * yl +
              D::ld(p, h1 * sh + w0 * sw) * xl * yh + D::ld(p, h1 * sh + w1 * sw) * xh * yh;
        D::st(out, off4(lo, b, c, oh, ow), r);
    }
}

template <class D>
__device__ __forceinline__ void bicubic_fwd(const typename D::T* x, typename D::T* out, const Layout& lx,
                                            const Layout& lo, int align, i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3], OH = lo.shape[2], OW = lo.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow, hi[4], wi[4];
        double hw[4], ww[4];
        coords4(lo, i, b, c, oh, ow);
        cubic_taps(oh, H, OH, align, hi, hw);
        cubic_taps(ow, W, OW, align, wi, ww);
        const typename D::T* p = x + b * lx.strides[0] + c * lx.strides[1];
        A r = 0;
        for (int a = 0; a < 4; ++a) {
            A row = 0;
            for (int e = 0; e < 4; ++e) row += D::ld(p, hi[a] * lx.strides[2] + wi[e] * lx.strides[3]) * (A)ww[e];
            r += row * (A)hw[a];
        }
        D::st(out, off4(lo, b, c, oh, ow), r);
    }
}

// ---------------------------------------------------------------------------------------
// Backward. Nearest gathers (deterministic): dx[ih, iw] sums dy[oh, ow] over the outputs
// whose source is (ih, iw); the candidates bracket [ih * OH / H, (ih + 1) * OH / H) with
// one spare on each side and each is checked with `nearest_src` itself.

__device__ __forceinline__ void nearest_range(i64 i, i64 in, i64 out, i64& lo, i64& hi) {
    lo = max((i * out) / in - 1, (i64)0);
    hi = min(((i + 1) * out + in - 1) / in + 1, out);
}

template <class D>
__device__ __forceinline__ void nearest_bwd(const typename D::T* dy, typename D::T* dx, const Layout& ldy,
                                            const Layout& ldx, int align, i64 n) {
    (void)align;
    typedef typename D::A A;
    const i64 H = ldx.shape[2], W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, ih, iw, oh0, oh1, ow0, ow1;
        coords4(ldx, i, b, c, ih, iw);
        nearest_range(ih, H, OH, oh0, oh1);
        nearest_range(iw, W, OW, ow0, ow1);
        const typename D::T* p = dy + b * ldy.strides[0] + c * ldy.strides[1];
        A sum = 0;
        for (i64 oh = oh0; oh < oh1; ++oh) {
            if (nearest_src(oh, H, OH) != ih) continue;
            for (i64 ow = ow0; ow < ow1; ++ow) {
                if (nearest_src(ow, W, OW) != iw) continue;
                sum += D::ld(p, oh * ldy.strides[2] + ow * ldy.strides[3]);
            }
        }
        D::st(dx, off4(ldx, b, c, ih, iw), sum);
    }
}

// Bilinear / bicubic scatter: every dy element adds weight * dy at its taps (dx is zeroed
// beforehand by `resize_zero_b*`).
template <class D>
__device__ __forceinline__ void bilinear_bwd(const typename D::T* dy, typename D::T* dx, const Layout& ldy,
                                             const Layout& ldx, int align, i64 n) {
    typedef typename D::A A;
    const i64 H = ldx.shape[2], W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow, h0, h1, w0, w1;
        double th, tw;
        coords4(ldy, i, b, c, oh, ow);
        linear_taps(oh, H, OH, align, h0, h1, th);
        linear_taps(ow, W, OW, align, w0, w1, tw);
        const A g = D::ld(dy, off4(ldy, b, c, oh, ow));
        typename D::T* p = dx + b * ldx.strides[0] + c * ldx.strides[1];
        const i64 sh = ldx.strides[2], sw = ldx.strides[3];
        const A yh = (A)th, yl = (A)(1.0 - th), xh = (A)tw, xl = (A)(1.0 - tw);
        D::add(p + h0 * sh + w0 * sw, g * xl * yl);
        D::add(p + h0 * sh + w1 * sw, g * xh * yl);
        D::add(p + h1 * sh + w0 * sw, g * xl * yh);
        D::add(p + h1 * sh + w1 * sw, g * xh * yh);
    }
}

template <class D>
__device__ __forceinline__ void bicubic_bwd(const typename D::T* dy, typename D::T* dx, const Layout& ldy,
                                            const Layout& ldx, int align, i64 n) {
    typedef typename D::A A;
    const i64 H = ldx.shape[2], W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow, hi[4], wi[4];
        double hw[4], ww[4];
        coords4(ldy, i, b, c, oh, ow);
        cubic_taps(oh, H, OH, align, hi, hw);
        cubic_taps(ow, W, OW, align, wi, ww);
        const A g = D::ld(dy, off4(ldy, b, c, oh, ow));
        typename D::T* p = dx + b * ldx.strides[0] + c * ldx.strides[1];
        for (int a = 0; a < 4; ++a) {
            const A ga = g * (A)hw[a];
            for (int e = 0; e < 4; ++e) D::add(p + hi[a] * ldx.strides[2] + wi[e] * ldx.strides[3], ga * (A)ww[e]);
        }
    }
}

// Deterministic bilinear / bicubic backward (no atomics): two gather passes over the
// separable weights. Pass W: tmp[b, c, oh, iw] = sum over ow of dy[b, c, oh, ow] * w(ow, iw)
// (tmp packed [N, C, OH, W] in the accumulator type); pass H: dx[b, c, ih, iw] = sum over
// oh of w(oh, ih) * tmp[b, c, oh, iw]. Every tap counts, zero weights included, so a
// non-finite dy spreads as in the scatter form.

// Outputs whose taps may reach input `i`, [lo, hi) (each is checked exactly): the source
// coordinate s(o) = o * r + c rises with o, a tap of o is floor(s) - 1 .. floor(s) + 2
// (bilinear: floor(s), ceil(s)), so it reaches i only when i - 2 <= s < i + 2; taps clamped
// to the borders come from outputs with s below 2 or above in - 3, inside the same bounds
// since every s lies in [-1, in). A zero r (one input) reaches every output.
__device__ __forceinline__ void tap_range(i64 i, i64 in, i64 out, int align, i64& lo, i64& hi) {
    double r, c;
    if (align) {
        r = (double)(in - 1) / (double)max(out - 1, (i64)1);
        c = 0.0;
    } else {
        r = (double)in / (double)out;
        c = 0.5 * r - 0.5;
    }
    if (r <= 0.0) {
        lo = 0;
        hi = out;
        return;
    }
    lo = max((i64)floor(((double)i - 2.0 - c) / r) - 1, (i64)0);
    hi = min((i64)ceil(((double)i + 2.0 - c) / r) + 2, out);
}

// The summed weight of output o's taps at input i along one axis; false when none is i.
template <int MODE>
__device__ __forceinline__ bool tap_weight(i64 o, i64 i, i64 in, i64 out, int align, double& w) {
    w = 0.0;
    bool hit = false;
    if (MODE == 1) {
        i64 i0, i1;
        double t;
        linear_taps(o, in, out, align, i0, i1, t);
        if (i0 == i) { w += 1.0 - t; hit = true; }
        if (i1 == i) { w += t; hit = true; }
    } else {
        i64 idx[4];
        double wt[4];
        cubic_taps(o, in, out, align, idx, wt);
        for (int k = 0; k < 4; ++k)
            if (idx[k] == i) { w += wt[k]; hit = true; }
    }
    return hit;
}

template <class D, int MODE>
__device__ __forceinline__ void interp_bwd_w(const typename D::T* dy, typename D::A* tmp, const Layout& ldy,
                                             const Layout& lt, int align, i64 n) {
    typedef typename D::A A;
    const i64 W = lt.shape[3], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, iw, lo, hi;
        coords4(lt, i, b, c, oh, iw);
        tap_range(iw, W, OW, align, lo, hi);
        A sum = 0;
        for (i64 ow = lo; ow < hi; ++ow) {
            double w;
            if (tap_weight<MODE>(ow, iw, W, OW, align, w)) sum += D::ld(dy, off4(ldy, b, c, oh, ow)) * (A)w;
        }
        tmp[off4(lt, b, c, oh, iw)] = sum;
    }
}

template <class D, int MODE>
__device__ __forceinline__ void interp_bwd_h(const typename D::A* tmp, typename D::T* dx, const Layout& lt,
                                             const Layout& ldx, int align, i64 n) {
    typedef typename D::A A;
    const i64 H = ldx.shape[2], OH = lt.shape[2];
    FOR_EACH(i, n) {
        i64 b, c, ih, iw, lo, hi;
        coords4(ldx, i, b, c, ih, iw);
        tap_range(ih, H, OH, align, lo, hi);
        A sum = 0;
        for (i64 oh = lo; oh < hi; ++oh) {
            double w;
            if (tap_weight<MODE>(oh, ih, H, OH, align, w)) sum += tmp[off4(lt, b, c, oh, iw)] * (A)w;
        }
        D::st(dx, off4(ldx, b, c, ih, iw), sum);
    }
}

#define ZERO(B, T)                                                                            \
    KERNEL void resize_zero_b##B(T* p, Layout l, i64 n) {                                     \
        FOR_EACH(i, n) {                                                                      \
            i64 b, c, h, w;                                                                   \
            coords4(l, i, b, c, h, w);                                                        \
            p[off4(l, b, c, h, w)] = 0;                                                       \
        }                                                                                     \
    }

ZERO(2, u16)
ZERO(4, u32)
ZERO(8, u64)

// ---------------------------------------------------------------------------------------
// Grid sampling, bilinear with zeros padding (burn-ndarray's `grid_sample_2d`): grid
// [N, OH, OW, 2] holds (x, y) in [-1, 1]; align_corners maps -1 / 1 to the corner pixel
// centres ((g + 1) * (size - 1) / 2), otherwise to their outer edges
// ((g + 1) * size / 2 - 0.5). Taps outside the input read 0; a non-finite coordinate
// gives 0.

__device__ __forceinline__ double grid_src(double g, i64 size, int align) {
    if (align) return (g + 1.0) * (double)(size - 1) / 2.0;
    return (g + 1.0) * (double)size / 2.0 - 0.5;
}

template <class D>
__device__ __forceinline__ void grid_sample(const typename D::T* x, const typename D::T* grid, typename D::T* out,
                                            const Layout& lx, const Layout& lg, const Layout& lo, int align,
                                            i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow;
        coords4(lo, i, b, c, oh, ow);
        const i64 g = b * lg.strides[0] + oh * lg.strides[1] + ow * lg.strides[2];
        const double px = grid_src((double)D::ld(grid, g), W, align);
        const double py = grid_src((double)D::ld(grid, g + lg.strides[3]), H, align);
        A r = 0;
        if (isfinite(px) && isfinite(py)) {
            // Clamping far-away points keeps the integer taps in range without changing
            // which taps fall inside the input.
            const double cx = fmin(fmax(px, -2.0), (double)W + 1.0);
            const double cy = fmin(fmax(py, -2.0), (double)H + 1.0);
            const double fx = floor(cx), fy = floor(cy);
            const i64 x0 = (i64)fx, y0 = (i64)fy;
            const A tx = (A)(cx - fx), ty = (A)(cy - fy);
            const typename D::T* p = x + b * lx.strides[0] + c * lx.strides[1];
            for (int a = 0; a < 2; ++a) {
                const i64 yy = y0 + a;
                if (yy < 0 || yy >= H) continue;
                const A wy = a ? ty : (A)1 - ty;
                for (int e = 0; e < 2; ++e) {
                    const i64 xx = x0 + e;
                    if (xx < 0 || xx >= W) continue;
                    const A wx = e ? tx : (A)1 - tx;
                    r += D::ld(p, yy * lx.strides[2] + xx * lx.strides[3]) * wx * wy;
                }
            }
        }
        D::st(out, off4(lo, b, c, oh, ow), r);
    }
}

// ---------------------------------------------------------------------------------------
// Entry points per dtype.

#define INTERP_ENTRY(NAME, S, D, F)                                                           \
    KERNEL void NAME##_##S(const D::T* src, D::T* dst, Layout ls, Layout ld,                  \
                                          int align, i64 n) {                                 \
        F<D>(src, dst, ls, ld, align, n);                                                     \
    }

#define RESIZE_ENTRIES(S, D)                                                                  \
    INTERP_ENTRY(interp_nearest_fwd, S, D, nearest_fwd)                                       \
    INTERP_ENTRY(interp_bilinear_fwd, S, D, bilinear_fwd)                                     \
    INTERP_ENTRY(interp_bicubic_fwd, S, D, bicubic_fwd)                                       \
    INTERP_ENTRY(interp_nearest_bwd, S, D, nearest_bwd)                                       \
    INTERP_ENTRY(interp_bilinear_bwd, S, D, bilinear_bwd)                                     \
    INTERP_ENTRY(interp_bicubic_bwd, S, D, bicubic_bwd)                                       \
    KERNEL void interp_bilinear_bwd_w_##S(const D::T* dy, D::A* tmp, Layout ldy, Layout lt,     \
                                          int align, i64 n) {                                 \
        interp_bwd_w<D, 1>(dy, tmp, ldy, lt, align, n);                                       \
    }                                                                                         \
    KERNEL void interp_bilinear_bwd_h_##S(const D::A* tmp, D::T* dx, Layout lt, Layout ldx,     \
                                          int align, i64 n) {                                 \
        interp_bwd_h<D, 1>(tmp, dx, lt, ldx, align, n);                                       \
    }                                                                                         \
    KERNEL void interp_bicubic_bwd_w_##S(const D::T* dy, D::A* tmp, Layout ldy, Layout lt,      \
                                         int align, i64 n) {                                  \
        interp_bwd_w<D, 2>(dy, tmp, ldy, lt, align, n);                                       \
    }                                                                                         \
    KERNEL void interp_bicubic_bwd_h_##S(const D::A* tmp, D::T* dx, Layout lt, Layout ldx,      \
                                         int align, i64 n) {                                  \
        interp_bwd_h<D, 2>(tmp, dx, lt, ldx, align, n);                                       \
    }                                                                                         \
    KERNEL void grid_sample_##S(const D::T* x, const D::T* grid, D::T* out,                   \
                                               Layout lx, Layout lg, Layout lo, int align,    \
                                               i64 n) {                                       \
        grid_sample<D>(x, grid, out, lx, lg, lo, align, n);                                   \
    }

RESIZE_ENTRIES(f32, DF32)
RESIZE_ENTRIES(f64, DF64)
RESIZE_ENTRIES(f16, DF16)
RESIZE_ENTRIES(bf16, DBF16)
