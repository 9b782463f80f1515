// 2-D pooling kernels on strided [N, C, H, W] views (see backend/core/src/kernels/pool.rs):
// max pooling with flat indices and its scatter backward (a gather form in deterministic
// mode), average pooling (ceil_mode,
// count_include_pad) and adaptive average pooling with gather backwards. `common.cuh`
// is prepended.
//
// Every kernel runs a grid-stride loop over the `n` elements of the tensor it writes
// (row-major over that tensor's logical [N, C, H, W] dims); every operand is a rank-4
// `Layout` (offset 0: the pointer carries the offset). f16/bf16 accumulate in f32.

// Window geometry; matches `PoolWindow` on the host.
struct PoolWin {
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
};

// ---------------------------------------------------------------------------------------
// max pooling: values and flat indices `ih * W + iw` into the input plane. The first
// maximum in window order wins ties; a NaN wins over any number (the first NaN is kept).
// A window with no element inside the input writes -inf and index -1.

template <class D>
__device__ __forceinline__ void maxpool_fwd(const typename D::T* x, typename D::T* out, i64* idx,
                                            const Layout& lx, const Layout& lo, const Layout& li,
                                            const PoolWin& p, i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow;
        coords4(lo, i, b, c, oh, ow);
        const i64 h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
        const typename D::T* plane = x + b * lx.strides[0] + c * lx.strides[1];
        A best = (A)(-__int_as_float(0x7f800000));
        i64 best_i = -1;
        bool have = false, nan = false;
        for (i64 a = 0; a < p.kh && !nan; ++a) {
            i64 ih = h0 + a * p.dh;
            if (ih < 0 || ih >= H) continue;
            for (i64 e = 0; e < p.kw; ++e) {
                i64 iw = w0 + e * p.dw;
                if (iw < 0 || iw >= W) continue;
                A v = D::ld(plane, ih * lx.strides[2] + iw * lx.strides[3]);
                if (!have || v > best || v != v) {
                    best = v;
                    best_i = ih * W + iw;
                    have = true;
                    if (v != v) {
                        nan = true;
                        break;
                    }
                }
            }
        }
        D::st(out, off4(lo, b, c, oh, ow), best);
        idx[off4(li, b, c, oh, ow)] = best_i;
    }
}

// dx[plane of dy element][idx] += dy, skipping indices outside the plane (dx is zeroed
// beforehand by `pool_zero_b*`).
template <class D>
__device__ __forceinline__ void maxpool_bwd(const i64* idx, const typename D::T* dy, typename D::T* dx,
                                            const Layout& li, const Layout& ldy, const Layout& ldx,
                                            i64 n) {
    const i64 H = ldx.shape[2], W = ldx.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow;
        coords4(ldy, i, b, c, oh, ow);
        i64 k = idx[off4(li, b, c, oh, ow)];
        if (k < 0 || k >= H * W) continue;
        D::add(dx + off4(ldx, b, c, k / W, k % W), D::ld(dy, off4(ldy, b, c, oh, ow)));
    }
}

#define ZERO(B, T)                                                                            \
    KERNEL void pool_zero_b##B(T* p, Layout l, i64 n) {                                       \
        FOR_EACH(i, n) {                                                                      \
            i64 b, c, h, w;                                                                   \
            coords4(l, i, b, c, h, w);                                                        \
            p[off4(l, b, c, h, w)] = 0;                                                       \
        }                                                                                     \
    }

ZERO(2, u16)
ZERO(4, u32)
ZERO(8, u64)

// Deterministic gather form of the backward (no atomics, no zero pass): every dx element
// sums, in window order, the dy of the windows that contain it and chose it. Window
// (oh, ow) covers ih when ih = oh * sh - ph + a * dh for some tap a in [0, kh).
template <class D>
__device__ __forceinline__ void maxpool_bwd_gather(const i64* idx, const typename D::T* dy, typename D::T* dx,
                                                   const Layout& li, const Layout& ldy, const Layout& ldx,
                                                   const PoolWin& p, i64 n) {
    typedef typename D::A A;
    const i64 W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, ih, iw;
        coords4(ldx, i, b, c, ih, iw);
        const i64 pos = ih * W + iw;
        A sum = 0;
        for (i64 a = 0; a < p.kh; ++a) {
            const i64 th = ih + p.ph - a * p.dh;
            if (th < 0 || th % p.sh != 0 || th / p.sh >= OH) continue;
            const i64 oh = th / p.sh;
            for (i64 e = 0; e < p.kw; ++e) {
                const i64 tw = iw + p.pw - e * p.dw;
                if (tw < 0 || tw % p.sw != 0 || tw / p.sw >= OW) continue;
                const i64 ow = tw / p.sw;
                if (idx[off4(li, b, c, oh, ow)] == pos) sum += D::ld(dy, off4(ldy, b, c, oh, ow));
            }
        }
        D::st(dx, off4(ldx, b, c, ih, iw), sum);
    }
}

// ---------------------------------------------------------------------------------------
// average pooling (PyTorch rules): the window [h0, h0 + kh) is clipped to the padded
// bounds [-ph, H + ph) for the count_include_pad divisor (so a ceil_mode extension past
// the padding is not counted), then to the input for the sum and the other divisor.
// A window with no element inside the input writes 0.

__device__ __forceinline__ i64 avg_divisor(const PoolWin& p, i64 H, i64 W, i64 oh, i64 ow, int cip,
                                           i64& hs, i64& he, i64& ws, i64& we) {
    hs = oh * p.sh - p.ph;
    ws = ow * p.sw - p.pw;
    he = min(hs + p.kh, H + p.ph);
    we = min(ws + p.kw, W + p.pw);
    const i64 padded = (he - hs) * (we - ws);
    hs = max(hs, (i64)0);
    ws = max(ws, (i64)0);
    he = min(he, H);
    we = min(we, W);
    return cip ? padded : (he - hs) * (we - ws);
}

template <class D>
__device__ __forceinline__ void avgpool_fwd(const typename D::T* x, typename D::T* out, const Layout& lx,
                                            const Layout& lo, const PoolWin& p, int cip, i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow, hs, he, ws, we;
        coords4(lo, i, b, c, oh, ow);
        const i64 div = avg_divisor(p, H, W, oh, ow, cip, hs, he, ws, we);
        A r = 0;
        if (hs < he && ws < we) {
            const typename D::T* plane = x + b * lx.strides[0] + c * lx.strides[1];
            A sum = 0;
            for (i64 ih = hs; ih < he; ++ih)
                for (i64 iw = ws; iw < we; ++iw) sum += D::ld(plane, ih * lx.strides[2] + iw * lx.strides[3]);
            r = sum / (A)div;
        }
        D::st(out, off4(lo, b, c, oh, ow), r);
    }
}

// Gather backward: every dx element sums dy / divisor over the windows that contain it.
template <class D>
__device__ __forceinline__ void avgpool_bwd(const typename D::T* dy, typename D::T* dx, const Layout& ldy,
                                            const Layout& ldx, const PoolWin& p, int cip, i64 n) {
    typedef typename D::A A;
    const i64 H = ldx.shape[2], W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, ih, iw;
        coords4(ldx, i, b, c, ih, iw);
        // Windows oh with oh * sh - ph <= ih < oh * sh - ph + kh.
        const i64 oh0 = ih + p.ph < p.kh ? 0 : (ih + p.ph - p.kh) / p.sh + 1;
        const i64 oh1 = min((ih + p.ph) / p.sh + 1, OH);
        const i64 ow0 = iw + p.pw < p.kw ? 0 : (iw + p.pw - p.kw) / p.sw + 1;
        const i64 ow1 = min((iw + p.pw) / p.sw + 1, OW);
        const typename D::T* plane = dy + b * ldy.strides[0] + c * ldy.strides[1];
        A sum = 0;
        for (i64 oh = oh0; oh < oh1; ++oh)
            for (i64 ow = ow0; ow < ow1; ++ow) {
                i64 hs, he, ws, we;
                const i64 div = avg_divisor(p, H, W, oh, ow, cip, hs, he, ws, we);
                sum += D::ld(plane, oh * ldy.strides[2] + ow * ldy.strides[3]) / (A)div;
            }
        D::st(dx, off4(ldx, b, c, ih, iw), sum);
    }
}

// ---------------------------------------------------------------------------------------
// adaptive average pooling: output i of O over an input of L averages
// [floor(i * L / O), ceil((i + 1) * L / O)).

// Adaptive window bounds; 32-bit division (several times cheaper than 64-bit) whenever the
// operands are below 2^15, so the products and sums fit in 32 bits.
__device__ __forceinline__ bool ad_small(i64 i, i64 L, i64 O) { return (i | L | O) < (1 << 15); }
__device__ __forceinline__ i64 ad_start(i64 i, i64 L, i64 O) {
    if (ad_small(i, L, O)) return (i64)((unsigned)i * (unsigned)L / (unsigned)O);
    return (i * L) / O;
}
__device__ __forceinline__ i64 ad_end(i64 i, i64 L, i64 O) {
    if (ad_small(i, L, O)) return (i64)((((unsigned)i + 1u) * (unsigned)L + (unsigned)O - 1u) / (unsigned)O);
    return ((i + 1) * L + O - 1) / O;
}

template <class D>
__device__ __forceinline__ void adaptive_fwd(const typename D::T* x, typename D::T* out, const Layout& lx,
                                             const Layout& lo, i64 n) {
    typedef typename D::A A;
    const i64 H = lx.shape[2], W = lx.shape[3], OH = lo.shape[2], OW = lo.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, oh, ow;
        coords4(lo, i, b, c, oh, ow);
        const i64 hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);
        const i64 ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);
        const typename D::T* plane = x + b * lx.strides[0] + c * lx.strides[1];
        A sum = 0;
        for (i64 ih = hs; ih < he; ++ih)
            for (i64 iw = ws; iw < we; ++iw) sum += D::ld(plane, ih * lx.strides[2] + iw * lx.strides[3]);
        D::st(out, off4(lo, b, c, oh, ow), sum / (A)((he - hs) * (we - ws)));
    }
}

// Gather backward: the windows containing ih are exactly oh in
// [floor(ih * OH / H), ceil((ih + 1) * OH / H)) (same for w); checked anyway.
template <class D>
__device__ __forceinline__ void adaptive_bwd(const typename D::T* dy, typename D::T* dx, const Layout& ldy,
                                             const Layout& ldx, i64 n) {
    typedef typename D::A A;
    const i64 H = ldx.shape[2], W = ldx.shape[3], OH = ldy.shape[2], OW = ldy.shape[3];
    FOR_EACH(i, n) {
        i64 b, c, ih, iw;
        coords4(ldx, i, b, c, ih, iw);
        const i64 oh0 = ad_start(ih, OH, H), oh1 = min(ad_end(ih, OH, H), OH);
        const i64 ow0 = ad_start(iw, OW, W), ow1 = min(ad_end(iw, OW, W), OW);
        const typename D::T* plane = dy + b * ldy.strides[0] + c * ldy.strides[1];
        A sum = 0;
        for (i64 oh = oh0; oh < oh1; ++oh) {
            const i64 hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);
            if (ih < hs || ih >= he) continue;
            for (i64 ow = ow0; ow < ow1; ++ow) {
                const i64 ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);
                if (iw < ws || iw >= we) continue;
                sum += D::ld(plane, oh * ldy.strides[2] + ow * ldy.strides[3]) / (A)((he - hs) * (we - ws));
            }
        }
        D::st(dx, off4(ldx, b, c, ih, iw), sum);
    }
}

// ---------------------------------------------------------------------------------------
// Entry points per dtype.

#define POOL_ENTRIES(S, D)                                                                    \
    KERNEL void maxpool2d_fwd_##S(const D::T* x, D::T* out, i64* idx, Layout lx,                \
                                                 Layout lo, Layout li, PoolWin p, i64 n) {    \
        maxpool_fwd<D>(x, out, idx, lx, lo, li, p, n);                                        \
    }                                                                                         \
    KERNEL void maxpool2d_bwd_##S(const i64* idx, const D::T* dy, D::T* dx,                   \
                                                 Layout li, Layout ldy, Layout ldx, i64 n) {  \
        maxpool_bwd<D>(idx, dy, dx, li, ldy, ldx, n);                                         \
    }                                                                                         \
    KERNEL void maxpool2d_bwd_gather_##S(const i64* idx, const D::T* dy, D::T* dx, Layout li,   \
                                         Layout ldy, Layout ldx, PoolWin p, i64 n) {          \
        maxpool_bwd_gather<D>(idx, dy, dx, li, ldy, ldx, p, n);                               \
    }                                                                                         \
    KERNEL void avgpool2d_fwd_##S(const D::T* x, D::T* out, Layout lx,                        \
                                                 Layout lo, PoolWin p, int cip, i64 n) {      \
        avgpool_fwd<D>(x, out, lx, lo, p, cip, n);                                            \
    }                                                                                         \
    KERNEL void avgpool2d_bwd_##S(const D::T* dy, D::T* dx, Layout ldy,                       \
                                                 Layout ldx, PoolWin p, int cip, i64 n) {     \
        avgpool_bwd<D>(dy, dx, ldy, ldx, p, cip, n);                                          \
    }                                                                                         \
    KERNEL void adaptive_avgpool2d_fwd_##S(const D::T* x, D::T* out, Layout lx,                \
                                                          Layout lo, i64 n) {                 \
        adaptive_fwd<D>(x, out, lx, lo, n);                                                   \
    }                                                                                         \
    KERNEL void adaptive_avgpool2d_bwd_##S(const D::T* dy, D::T* dx,                          \
                                                          Layout ldy, Layout ldx, i64 n) {    \
        adaptive_bwd<D>(dy, dx, ldy, ldx, n);                                                 \
    }

POOL_ENTRIES(f32, DF32)
POOL_ENTRIES(f64, DF64)
POOL_ENTRIES(f16, DF16)
POOL_ENTRIES(bf16, DBF16)
