// Elementwise kernels on strided views (see backend/core/src/kernels/elementwise.rs):
// fill, copy/cast, unary, binary, compare and where. `common.cuh` is prepended.
//
// Every kernel runs a grid-stride loop over the `n` items of the (coalesced, broadcast)
// output shape; each operand has its own `Layout` (0 strides for broadcast dims). One entry
// point per dtype family, the operation picked by an `int op` argument whose values match
// the Rust enums (`UnaryOp`, `BinaryOp`, `CompareOp`) in declaration order. f16/bf16 are
// computed in f32 and rounded on store; integers are computed in i64 (wrapping) and
// truncated to their width on store.

// Element offset of linear index `i`, with a fast path for the common rank <= 1 case
// (rank 0 has shape/strides zeroed by the host: offset only).
__device__ __forceinline__ i64 off(const Layout& l, i64 i) {
    return l.rank <= 1 ? l.offset + i * l.strides[0] : offset_of(l, i);
}

// Offsets of linear index `i` in several operands that share one (jointly coalesced) shape:
// the coordinates are computed once, from the last operand's shape, and dotted with each
// operand's strides (one division per dim instead of one per dim and operand; 32-bit when
// the view is small enough).
#define SHARED_COORDS(LAST, ACC)                                                               \
    if (LAST.index32) {                                                                        \
        unsigned int j = (unsigned int)i;                                                      \
        for (int d = LAST.rank - 1; d >= 0; --d) {                                             \
            unsigned int n = (unsigned int)LAST.shape[d];                                      \
            i64 c = (i64)(j % n);                                                              \
            j /= n;                                                                            \
            ACC                                                                                \
        }                                                                                      \
    } else {                                                                                   \
        i64 j = i;                                                                             \
        for (int d = LAST.rank - 1; d >= 0; --d) {                                             \
            i64 n = LAST.shape[d];                                                             \
            i64 c = j % n;                                                                     \
            j /= n;                                                                            \
            ACC                                                                                \
        }                                                                                      \
    }

__device__ __forceinline__ void off2(const Layout& l0, const Layout& l1, i64 i, i64& o0, i64& o1) {
    o0 = l0.offset;
    o1 = l1.offset;
    if (l1.rank <= 1) {
        o0 += i * l0.strides[0];
        o1 += i * l1.strides[0];
        return;
    }
    SHARED_COORDS(l1, o0 += c * l0.strides[d]; o1 += c * l1.strides[d];)
}

__device__ __forceinline__ void off3(const Layout& l0, const Layout& l1, const Layout& l2, i64 i, i64& o0,
                                     i64& o1, i64& o2) {
    o0 = l0.offset;
    o1 = l1.offset;
    o2 = l2.offset;
    if (l2.rank <= 1) {
        o0 += i * l0.strides[0];
        o1 += i * l1.strides[0];
        o2 += i * l2.strides[0];
        return;
    }
    SHARED_COORDS(l2, o0 += c * l0.strides[d]; o1 += c * l1.strides[d]; o2 += c * l2.strides[d];)
}

// Dtype codes of `cast` (match `dtype_code` in elementwise.rs).
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_F64 3
#define DT_I32 4
#define DT_I64 5
#define DT_U8 6
#define DT_I8 7
#define DT_BOOL 8

// ---------------------------------------------------------------------------------------
// fill / copy (bit patterns by element size)

#define FILL_COPY(B, T)                                                                        \
    KERNEL void fill_b##B(T* out, Layout lo, i64 n, u64 bits) {                                \
        T v = (T)bits;                                                                         \
        FOR_EACH(i, n) { out[off(lo, i)] = v; }                                                \
    }                                                                                          \
    KERNEL void copy_b##B(const T* src, T* dst, Layout ls, Layout ld, i64 n) {                 \
        FOR_EACH(i, n) {                                                                       \
            i64 so, dof;                                                                       \
            off2(ls, ld, i, so, dof);                                                          \
            dst[dof] = src[so];                                                                \
        }                                                                                      \
    }

FILL_COPY(1, u8)
FILL_COPY(2, u16)
FILL_COPY(4, u32)
FILL_COPY(8, u64)

// A copy of 16-byte groups (four f32s, eight bf16s): the launch views both operands in
// groups when their innermost runs allow it.
KERNEL void copy_b16(const uint4* src, uint4* dst, Layout ls, Layout ld, i64 n) {
    FOR_EACH(i, n) {
        i64 so, dof;
        off2(ls, ld, i, so, dof);
        dst[dof] = src[so];
    }
}

// ---------------------------------------------------------------------------------------
// cast: one kernel, runtime switch on the dtype codes

__device__ __forceinline__ bool dt_is_float(int dt) { return dt <= DT_F64; }

__device__ __forceinline__ double load_f64(const void* p, int dt, i64 o) {
    switch (dt) {
        case DT_F32: return (double)((const float*)p)[o];
        case DT_F16: return (double)f16_to_f32(((const u16*)p)[o]);
        case DT_BF16: return (double)bf16_to_f32(((const u16*)p)[o]);
        case DT_F64: return ((const double*)p)[o];
        case DT_I32: return (double)((const i32*)p)[o];
        case DT_I64: return (double)((const i64*)p)[o];
        case DT_U8: return (double)((const u8*)p)[o];
        case DT_I8: return (double)((const i8*)p)[o];
        default: return ((const u8*)p)[o] != 0 ? 1.0 : 0.0;
    }
}

__device__ __forceinline__ i64 load_i64(const void* p, int dt, i64 o) {
    switch (dt) {
        case DT_I32: return (i64)((const i32*)p)[o];
        case DT_I64: return ((const i64*)p)[o];
        case DT_U8: return (i64)((const u8*)p)[o];
        case DT_I8: return (i64)((const i8*)p)[o];
        default: return ((const u8*)p)[o] != 0 ? 1 : 0;
    }
}

__device__ __forceinline__ void store_i64(void* p, int dt, i64 o, i64 v) {
    switch (dt) {
        case DT_I32: ((i32*)p)[o] = (i32)(u32)(u64)v; break;
        case DT_I64: ((i64*)p)[o] = v; break;
        case DT_U8: ((u8*)p)[o] = (u8)(u64)v; break;
        case DT_I8: ((i8*)p)[o] = (i8)(u8)(u64)v; break;
        default: ((u8*)p)[o] = v != 0 ? 1 : 0; break;
    }
}

// f64 -> f16 with a single rounding.
__device__ __forceinline__ u16 f64_to_f16(double v) {
    u16 h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(v));
    return h;
}

// f64 -> bf16 with a single rounding: round to f32 by round-to-odd (enough extra bits),
// then to bf16 to nearest even.
__device__ __forceinline__ u16 f64_to_bf16(double v) {
    float f = __double2float_rz(v);
    if ((double)f != v && f == f) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f32_to_bf16(f);
}

__device__ __forceinline__ void store_f64(void* p, int dt, i64 o, double v) {
    switch (dt) {
        case DT_F32: ((float*)p)[o] = (float)v; break;
        case DT_F16: ((u16*)p)[o] = f64_to_f16(v); break;
        case DT_BF16: ((u16*)p)[o] = f64_to_bf16(v); break;
        case DT_F64: ((double*)p)[o] = v; break;
        case DT_BOOL: ((u8*)p)[o] = v != 0.0 ? 1 : 0; break;  // NaN != 0
        default: {
            // float -> int: truncate toward zero (cvt.rzi saturates to i64), NaN -> 0,
            // then wrap to the destination width.
            i64 t = v != v ? 0 : (i64)v;
            store_i64(p, dt, o, t);
        }
    }
}

KERNEL void cast(const void* src, int sdt, void* dst, int ddt, Layout ls, Layout ld, i64 n) {
    bool int_to_int = !dt_is_float(sdt) && !dt_is_float(ddt);
    FOR_EACH(i, n) {
        i64 so = off(ls, i), dof = off(ld, i);
        if (int_to_int) {
            store_i64(dst, ddt, dof, load_i64(src, sdt, so));
        } else if (ddt == DT_F32 && !dt_is_float(sdt)) {
            // int -> f32 with one rounding (not through f64).
            ((float*)dst)[dof] = (float)load_i64(src, sdt, so);
        } else {
            store_f64(dst, ddt, dof, load_f64(src, sdt, so));
        }
    }
}

// ---------------------------------------------------------------------------------------
// unary

// Op codes and unary math: kernels/elementwise_math.cuh (prepended to this file).

// Float-family unary: storage T, loaded to compute type CT with LOAD, stored with STORE.
#define UNARY_FLOAT(DT, T, CT, MATH, LOAD, STORE)                                              \
    KERNEL void unary_##DT(const T* x, T* y, Layout lx, Layout ly, i64 n,                      \
                                          int op, double p0, double p1) {                      \
        CT q0 = (CT)p0, q1 = (CT)p1;                                                           \
        FOR_EACH(i, n) {                                                                       \
            i64 ox, oy;                                                                        \
            off2(lx, ly, i, ox, oy);                                                           \
            y[oy] = STORE(MATH(op, LOAD(x[ox]), q0, q1));                                      \
        }                                                                                      \
    }

// Integer unary: scalars arrive as i64 (converted on the host).
#define UNARY_INT(DT, T)                                                                       \
    KERNEL void unary_##DT(const T* x, T* y, Layout lx, Layout ly, i64 n,                      \
                                          int op, i64 p0, i64 p1) {                            \
        FOR_EACH(i, n) {                                                                       \
            i64 ox, oy;                                                                        \
            off2(lx, ly, i, ox, oy);                                                           \
            y[oy] = (T)unary_math_int(op, (i64)x[ox], p0, p1);                                 \
        }                                                                                      \
    }

#define ID(v) (v)

UNARY_FLOAT(f32, float, float, unary_math_f32, ID, ID)
UNARY_FLOAT(f16, u16, float, unary_math_f32, f16_to_f32, f32_to_f16)
UNARY_FLOAT(bf16, u16, float, unary_math_f32, bf16_to_f32, f32_to_bf16)
UNARY_FLOAT(f64, double, double, unary_math_f64, ID, ID)
UNARY_INT(i64, i64)
UNARY_INT(i32, i32)
UNARY_INT(i8, i8)
UNARY_INT(u8, u8)

// ---------------------------------------------------------------------------------------
// binary

// Op codes and binary math: kernels/elementwise_math.cuh.

#define BINARY_FLOAT(DT, T, CT, MATH, LOAD, STORE)                                             \
    KERNEL void binary_##DT(const T* a, const T* b, T* out, Layout la,                         \
                                           Layout lb, Layout lo, i64 n, int op) {              \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, ob, oo;                                                                    \
            off3(la, lb, lo, i, oa, ob, oo);                                                   \
            out[oo] = STORE(MATH(op, LOAD(a[oa]), LOAD(b[ob])));                               \
        }                                                                                      \
    }

#define BINARY_INT(DT, T)                                                                      \
    KERNEL void binary_##DT(const T* a, const T* b, T* out, Layout la,                         \
                                           Layout lb, Layout lo, i64 n, int op) {              \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, ob, oo;                                                                    \
            off3(la, lb, lo, i, oa, ob, oo);                                                   \
            out[oo] = (T)binary_math_int(op, (i64)a[oa], (i64)b[ob]);                          \
        }                                                                                      \
    }

BINARY_FLOAT(f32, float, float, binary_math_f32, ID, ID)
BINARY_FLOAT(f16, u16, float, binary_math_f32, f16_to_f32, f32_to_f16)
BINARY_FLOAT(bf16, u16, float, binary_math_f32, bf16_to_f32, f32_to_bf16)
BINARY_FLOAT(f64, double, double, binary_math_f64, ID, ID)
BINARY_INT(i64, i64)
BINARY_INT(i32, i32)
BINARY_INT(i8, i8)
BINARY_INT(u8, u8)

// binary with a scalar right operand passed by value (rounded to the dtype by the host):
// float kernels take a double, integer kernels a long long.

#define BINARY_SCALAR_FLOAT(DT, T, CT, MATH, LOAD, STORE)                                      \
    KERNEL void binary_scalar_##DT(const T* a, T* out, Layout la, Layout lo,    \
                                                  i64 n, int op, double s) {                   \
        CT b = (CT)s;                                                                          \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, oo;                                                                        \
            off2(la, lo, i, oa, oo);                                                           \
            out[oo] = STORE(MATH(op, LOAD(a[oa]), b));                                         \
        }                                                                                      \
    }

#define BINARY_SCALAR_INT(DT, T)                                                               \
    KERNEL void binary_scalar_##DT(const T* a, T* out, Layout la, Layout lo,    \
                                                  i64 n, int op, i64 s) {                      \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, oo;                                                                        \
            off2(la, lo, i, oa, oo);                                                           \
            out[oo] = (T)binary_math_int(op, (i64)a[oa], s);                                   \
        }                                                                                      \
    }

BINARY_SCALAR_FLOAT(f32, float, float, binary_math_f32, ID, ID)
BINARY_SCALAR_FLOAT(f16, u16, float, binary_math_f32, f16_to_f32, f32_to_f16)
BINARY_SCALAR_FLOAT(bf16, u16, float, binary_math_f32, bf16_to_f32, f32_to_bf16)
BINARY_SCALAR_FLOAT(f64, double, double, binary_math_f64, ID, ID)
BINARY_SCALAR_INT(i64, i64)
BINARY_SCALAR_INT(i32, i32)
BINARY_SCALAR_INT(i8, i8)
BINARY_SCALAR_INT(u8, u8)

// ---------------------------------------------------------------------------------------
// Vectorized unary / binary / binary_scalar for the float dtypes
//
// Entries `unary_vec_<dt>`, `binary_vec_<dt>` and `binary_scalar_vec_<dt>` take the arguments
// of their scalar kernels plus `int vec`, the elements each thread moves per grid-stride step
// (V: 2, 4 or 8 for f16/bf16, 2 or 4 for f32, 2 for f64; at most 16 bytes). The host picks
// them only where every operand's innermost stride is 1 (one aligned vector access of V
// elements) or 0 (one scalar load per group, broadcast), the innermost dim is a multiple of V
// and every vector-accessed operand is aligned to V elements. The layouts they receive are
// *group* layouts (innermost dim divided by V, innermost stride multiplied by V), so the
// offset helpers above give each group's first element, and `n` counts groups.
//
// Per element the math is the scalar kernels' (LOAD, then MATH in the compute type, then
// STORE), so results are bit-identical. The op switch runs once per group. At the dtype's
// widest V the common ops are instantiated with a compile-time op (their switch folds away,
// the V elements unroll); the other ops, and every op at the narrower widths (taken only for
// less aligned views), share one runtime-op loop, so the large math (pow, sin, ...) is not
// copied V times.

template <int B> struct VecRaw;
template <> struct VecRaw<4> { typedef u32 T; };
template <> struct VecRaw<8> { typedef uint2 T; };
template <> struct VecRaw<16> { typedef uint4 T; };

// V elements of `p` at element offset `o`, converted to the compute type: one vector load,
// or (a broadcast operand) one scalar load used V times.
template <typename D, int V>
__device__ __forceinline__ void vec_load(const typename D::T* p, i64 o, bool broadcast, typename D::C (&x)[V]) {
    typedef typename D::T S;
    if (broadcast) {
        const typename D::C b = D::load(p[o]);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = b;
    } else {
        typedef typename VecRaw<sizeof(S) * V>::T R;
        union { R r; S s[V]; } u;
        u.r = *(const R*)(p + o);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = D::load(u.s[v]);
    }
}

// V compute-type values rounded to the storage type and stored at `p + o` with one vector
// store.
template <typename D, int V>
__device__ __forceinline__ void vec_store(typename D::T* p, i64 o, const typename D::C (&x)[V]) {
    typedef typename D::T S;
    typedef typename VecRaw<sizeof(S) * V>::T R;
    union { R r; S s[V]; } u;
#pragma unroll
    for (int v = 0; v < V; ++v) u.s[v] = D::store(x[v]);
    *(R*)(p + o) = u.r;
}

// Whether an operand's group layout broadcasts its innermost dim (one load per group).
__device__ __forceinline__ bool vec_broadcast(const Layout& l) { return l.strides[l.rank - 1] == 0; }

// A float dtype for the vector kernels: storage T, compute type C, the widest V (16 bytes),
// and the scalar kernels' conversions and math.
#define VEC_DTYPE(NAME, T_, C_, UMATH, BMATH, LOAD, STORE)                                     \
    struct NAME {                                                                              \
        typedef T_ T;                                                                          \
        typedef C_ C;                                                                          \
        enum { MAXV = 16 / sizeof(T_) };                                                       \
        static __device__ __forceinline__ C load(T v) { return LOAD(v); }                      \
        static __device__ __forceinline__ T store(C v) { return STORE(v); }                    \
        static __device__ __forceinline__ C unary(int op, C x, C p0, C p1) {                   \
            return UMATH(op, x, p0, p1);                                                       \
        }                                                                                      \
        static __device__ __forceinline__ C binary(int op, C a, C b) { return BMATH(op, a, b); } \
    };

VEC_DTYPE(VecF32, float, float, unary_math_f32, binary_math_f32, ID, ID)
VEC_DTYPE(VecF16, u16, float, unary_math_f32, binary_math_f32, f16_to_f32, f32_to_f16)
VEC_DTYPE(VecBF16, u16, float, unary_math_f32, binary_math_f32, bf16_to_f32, f32_to_bf16)
VEC_DTYPE(VecF64, double, double, unary_math_f64, binary_math_f64, ID, ID)

// x[v] = unary(OP, x[v]) for a compile-time OP.
template <typename D, int V, int OP>
__device__ __forceinline__ void unary_fixed(typename D::C (&x)[V], typename D::C p0, typename D::C p1) {
#pragma unroll
    for (int v = 0; v < V; ++v) x[v] = D::unary(OP, x[v], p0, p1);
}

// x[v] = unary(op, x[v]) for a runtime op, one element per (not unrolled) iteration: take
// x[0], shift the rest down, append the result; after V steps x holds the results in order.
template <typename D, int V>
__device__ __forceinline__ void unary_any(int op, typename D::C (&x)[V], typename D::C p0, typename D::C p1) {
#pragma unroll 1
    for (int step = 0; step < V; ++step) {
        const typename D::C r = D::unary(op, x[0], p0, p1);
#pragma unroll
        for (int v = 0; v + 1 < V; ++v) x[v] = x[v + 1];
        x[V - 1] = r;
    }
}

// x[v] = unary(op, x[v], p0, p1): one switch per group.
template <typename D, int V>
__device__ __forceinline__ void unary_group(int op, typename D::C (&x)[V], typename D::C p0, typename D::C p1) {
    if (V < D::MAXV) {
        unary_any<D, V>(op, x, p0, p1);
        return;
    }
#define UNARY_FIXED_CASE(OP)                                                                   \
    case OP: unary_fixed<D, V, OP>(x, p0, p1); return;
    switch (op) {
        UNARY_FIXED_CASE(U_NEG)
        UNARY_FIXED_CASE(U_ABS)
        UNARY_FIXED_CASE(U_EXP)
        UNARY_FIXED_CASE(U_LOG)
        UNARY_FIXED_CASE(U_SQRT)
        UNARY_FIXED_CASE(U_RSQRT)
        UNARY_FIXED_CASE(U_RECIP)
        UNARY_FIXED_CASE(U_TANH)
        UNARY_FIXED_CASE(U_SIGMOID)
        UNARY_FIXED_CASE(U_RELU)
        UNARY_FIXED_CASE(U_GELU)
        UNARY_FIXED_CASE(U_SQUARE)
        UNARY_FIXED_CASE(U_ADD_SCALAR)
        UNARY_FIXED_CASE(U_MUL_SCALAR)
        UNARY_FIXED_CASE(U_CLAMP)
        UNARY_FIXED_CASE(U_LEAKY_RELU)
        default: unary_any<D, V>(op, x, p0, p1);
    }
#undef UNARY_FIXED_CASE
}

// x[v] = binary(OP, x[v], y[v]) for a compile-time OP.
template <typename D, int V, int OP>
__device__ __forceinline__ void binary_fixed(typename D::C (&x)[V], const typename D::C (&y)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) x[v] = D::binary(OP, x[v], y[v]);
}

// x[v] = binary(op, x[v], y[v]) for a runtime op, rotating like `unary_any`.
template <typename D, int V>
__device__ __forceinline__ void binary_any(int op, typename D::C (&x)[V], typename D::C (&y)[V]) {
#pragma unroll 1
    for (int step = 0; step < V; ++step) {
        const typename D::C r = D::binary(op, x[0], y[0]);
        const typename D::C y0 = y[0];
#pragma unroll
        for (int v = 0; v + 1 < V; ++v) {
            x[v] = x[v + 1];
            y[v] = y[v + 1];
        }
        x[V - 1] = r;
        y[V - 1] = y0;
    }
}

// x[v] = binary(op, x[v], y[v]): one switch per group.
template <typename D, int V>
__device__ __forceinline__ void binary_group(int op, typename D::C (&x)[V], typename D::C (&y)[V]) {
    if (V < D::MAXV) {
        binary_any<D, V>(op, x, y);
        return;
    }
#define BINARY_FIXED_CASE(OP)                                                                  \
    case OP: binary_fixed<D, V, OP>(x, y); return;
    switch (op) {
        BINARY_FIXED_CASE(B_ADD)
        BINARY_FIXED_CASE(B_SUB)
        BINARY_FIXED_CASE(B_MUL)
        BINARY_FIXED_CASE(B_DIV)
        BINARY_FIXED_CASE(B_MAX)
        BINARY_FIXED_CASE(B_MIN)
        BINARY_FIXED_CASE(B_RELU_BWD)
        BINARY_FIXED_CASE(B_GELU_BWD)
        default: binary_any<D, V>(op, x, y);
    }
#undef BINARY_FIXED_CASE
}

template <typename D, int V>
__device__ __forceinline__ void unary_vec_run(const typename D::T* x, typename D::T* y, const Layout& lx,
                                              const Layout& ly, i64 n, int op, typename D::C p0,
                                              typename D::C p1) {
    const bool bx = vec_broadcast(lx);
    FOR_EACH(g, n) {
        i64 ox, oy;
        off2(lx, ly, g, ox, oy);
        typename D::C v[V];
        vec_load<D, V>(x, ox, bx, v);
        unary_group<D, V>(op, v, p0, p1);
        vec_store<D, V>(y, oy, v);
    }
}

template <typename D, int V>
__device__ __forceinline__ void binary_vec_run(const typename D::T* a, const typename D::T* b, typename D::T* out,
                                               const Layout& la, const Layout& lb, const Layout& lo, i64 n,
                                               int op) {
    const bool ba = vec_broadcast(la), bb = vec_broadcast(lb);
    FOR_EACH(g, n) {
        i64 oa, ob, oo;
        off3(la, lb, lo, g, oa, ob, oo);
        typename D::C x[V], y[V];
        vec_load<D, V>(a, oa, ba, x);
        vec_load<D, V>(b, ob, bb, y);
        binary_group<D, V>(op, x, y);
        vec_store<D, V>(out, oo, x);
    }
}

template <typename D, int V>
__device__ __forceinline__ void binary_scalar_vec_run(const typename D::T* a, typename D::T* out, const Layout& la,
                                                      const Layout& lo, i64 n, int op, typename D::C s) {
    const bool ba = vec_broadcast(la);
    FOR_EACH(g, n) {
        i64 oa, oo;
        off2(la, lo, g, oa, oo);
        typename D::C x[V], y[V];
        vec_load<D, V>(a, oa, ba, x);
#pragma unroll
        for (int v = 0; v < V; ++v) y[v] = s;
        binary_group<D, V>(op, x, y);
        vec_store<D, V>(out, oo, x);
    }
}

#define VMIN(A, B) ((A) < (B) ? (A) : (B))

// Calls RUN<D, V>(ARGS) for the host's `vec` (2, 4 or 8), V at most D::MAXV: the host never
// asks for more, and the branches of wider V fold away at compile time.
#define VEC_DISPATCH(RUN, D, ARGS)                                                             \
    if (D::MAXV >= 8 && vec == 8) {                                                            \
        RUN<D, VMIN(8, D::MAXV)> ARGS;                                                         \
    } else if (D::MAXV >= 4 && vec == 4) {                                                     \
        RUN<D, VMIN(4, D::MAXV)> ARGS;                                                         \
    } else {                                                                                   \
        RUN<D, 2> ARGS;                                                                        \
    }

#define FLOAT_VEC(DT, D)                                                                 \
    KERNEL void unary_vec_##DT(const D::T* x, D::T* y, Layout lx, Layout ly, i64 n, int op,    \
                               double p0, double p1, int vec) {                                \
        const D::C q0 = (D::C)p0, q1 = (D::C)p1;                                               \
        VEC_DISPATCH(unary_vec_run, D, (x, y, lx, ly, n, op, q0, q1))                    \
    }                                                                                          \
    KERNEL void binary_vec_##DT(const D::T* a, const D::T* b, D::T* out, Layout la,            \
                                Layout lb, Layout lo, i64 n, int op, int vec) {                \
        VEC_DISPATCH(binary_vec_run, D, (a, b, out, la, lb, lo, n, op))                  \
    }                                                                                          \
    KERNEL void binary_scalar_vec_##DT(const D::T* a, D::T* out, Layout la, Layout lo, i64 n,  \
                                       int op, double s, int vec) {                            \
        const D::C b = (D::C)s;                                                                \
        VEC_DISPATCH(binary_scalar_vec_run, D, (a, out, la, lo, n, op, b))               \
    }

FLOAT_VEC(f32, VecF32)
FLOAT_VEC(f16, VecF16)
FLOAT_VEC(bf16, VecBF16)
FLOAT_VEC(f64, VecF64)

// ---------------------------------------------------------------------------------------
// compare (output one byte 0/1; NaN compares false except Ne)

#define C_EQ 0
#define C_NE 1
#define C_LT 2
#define C_LE 3
#define C_GT 4
#define C_GE 5

#define COMPARE(DT, T, CT, LOAD)                                                               \
    KERNEL void compare_##DT(const T* a, const T* b, u8* out, Layout la,                       \
                                            Layout lb, Layout lo, i64 n, int op) {             \
        FOR_EACH(i, n) {                                                                       \
            CT x = (CT)LOAD(a[off(la, i)]);                                                    \
            CT y = (CT)LOAD(b[off(lb, i)]);                                                    \
            bool r;                                                                            \
            switch (op) {                                                                      \
                case C_EQ: r = x == y; break;                                                  \
                case C_NE: r = x != y; break;                                                  \
                case C_LT: r = x < y; break;                                                   \
                case C_LE: r = x <= y; break;                                                  \
                case C_GT: r = x > y; break;                                                   \
                default: r = x >= y; break;                                                    \
            }                                                                                  \
            out[off(lo, i)] = r ? 1 : 0;                                                       \
        }                                                                                      \
    }

COMPARE(f32, float, float, ID)
COMPARE(f16, u16, float, f16_to_f32)
COMPARE(bf16, u16, float, bf16_to_f32)
COMPARE(f64, double, double, ID)
COMPARE(i64, i64, i64, ID)
COMPARE(i32, i32, i64, ID)
COMPARE(i8, i8, i64, ID)
COMPARE(u8, u8, i64, ID)

// compare against a scalar passed by value (double for floats, long long for integers)

__device__ __forceinline__ bool compare_values(int op, double x, double y) {
    switch (op) {
        case C_EQ: return x == y;
        case C_NE: return x != y;
        case C_LT: return x < y;
        case C_LE: return x <= y;
        case C_GT: return x > y;
        default: return x >= y;
    }
}

__device__ __forceinline__ bool compare_values_int(int op, i64 x, i64 y) {
    switch (op) {
        case C_EQ: return x == y;
        case C_NE: return x != y;
        case C_LT: return x < y;
        case C_LE: return x <= y;
        case C_GT: return x > y;
        default: return x >= y;
    }
}

#define COMPARE_SCALAR_FLOAT(DT, T, CT, LOAD)                                                  \
    KERNEL void compare_scalar_##DT(const T* a, u8* out, Layout la, Layout lo,  \
                                                   i64 n, int op, double s) {                  \
        CT y = (CT)s;                                                                          \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, oo;                                                                        \
            off2(la, lo, i, oa, oo);                                                           \
            CT x = (CT)LOAD(a[oa]);                                                            \
            out[oo] = compare_values(op, (double)x, (double)y) ? 1 : 0;                        \
        }                                                                                      \
    }

#define COMPARE_SCALAR_INT(DT, T)                                                              \
    KERNEL void compare_scalar_##DT(const T* a, u8* out, Layout la, Layout lo,  \
                                                   i64 n, int op, i64 s) {                     \
        FOR_EACH(i, n) {                                                                       \
            i64 oa, oo;                                                                        \
            off2(la, lo, i, oa, oo);                                                           \
            out[oo] = compare_values_int(op, (i64)a[oa], s) ? 1 : 0;                           \
        }                                                                                      \
    }

COMPARE_SCALAR_FLOAT(f32, float, float, ID)
COMPARE_SCALAR_FLOAT(f16, u16, float, f16_to_f32)
COMPARE_SCALAR_FLOAT(bf16, u16, float, bf16_to_f32)
COMPARE_SCALAR_FLOAT(f64, double, double, ID)
COMPARE_SCALAR_INT(i64, i64)
COMPARE_SCALAR_INT(i32, i32)
COMPARE_SCALAR_INT(i8, i8)
COMPARE_SCALAR_INT(u8, u8)

// ---------------------------------------------------------------------------------------
// where (out = cond != 0 ? a : b), by element size

#define WHERE(B, T)                                                                            \
    KERNEL void where_b##B(const u8* cond, const T* a, const T* b, T* out,                     \
                                          Layout lc, Layout la, Layout lb, Layout lo, i64 n) { \
        FOR_EACH(i, n) {                                                                       \
            out[off(lo, i)] = cond[off(lc, i)] != 0 ? a[off(la, i)] : b[off(lb, i)];           \
        }                                                                                      \
    }

WHERE(1, u8)
WHERE(2, u16)
WHERE(4, u32)
WHERE(8, u64)
