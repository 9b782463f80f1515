// Index kernels on strided views (see backend/core/src/kernels/index.rs): gather, index_select,
// scatter_add and index_add, plus gather_nd and scatter_nd (at the end of the file).
// `common.cuh` is prepended.
//
// Every kernel runs a grid-stride loop over the `n` items of one iteration shape (the
// indices' dims for gather/scatter_add, the output's or values' dims for index_select /
// index_add); the three operands each have a `Layout` over that shape. The indexed
// operand's layout has stride 0 on the indexed axis: its element is
// `offset_of(layout, i) + index * axis_stride`. index_select/index_add reuse the same
// kernels with the 1-D indices broadcast (stride 0 off the axis).
//
// Indices are i64 (`idx64 != 0`) or i32. An index outside `[0, axis_len)` skips its item:
// gather leaves that output element unwritten, the adds add nothing.

// Element offset of linear index `i`, with a fast path for rank <= 1 (rank 0 has
// shape/strides zeroed by the host: offset only).
__device__ __forceinline__ i64 loff(const Layout& l, i64 i) {
    return l.rank <= 1 ? l.offset + i * l.strides[0] : offset_of(l, i);
}

__device__ __forceinline__ i64 load_index(const void* idx, int idx64, i64 o) {
    return idx64 ? ((const i64*)idx)[o] : (i64)((const i32*)idx)[o];
}

// ---------------------------------------------------------------------------------------
// gather / index_select (bit copies by element size)

#define GATHER(B, T)                                                                          \
    KERNEL void gather_b##B(const T* x, const void* idx, int idx64, T* out,                   \
                                           Layout lx, Layout li, Layout lo, i64 axis_stride,  \
                                           i64 axis_len, i64 n) {                             \
        FOR_EACH(i, n) {                                                                      \
            i64 k = load_index(idx, idx64, loff(li, i));                                      \
            if (k < 0 || k >= axis_len) continue;                                             \
            out[loff(lo, i)] = x[loff(lx, i) + k * axis_stride];                              \
        }                                                                                     \
    }

GATHER(1, u8)
GATHER(2, u16)
GATHER(4, u32)
GATHER(8, u64)

// ---------------------------------------------------------------------------------------
// scatter_add / index_add (atomic adds; the `_seq` kernels below in deterministic mode)

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i32* p, i32 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);  // two's complement: wraps
}

#define SCATTER_ADD_BODY(ADD)                                                                 \
    FOR_EACH(i, n) {                                                                          \
        i64 k = load_index(idx, idx64, loff(li, i));                                          \
        if (k < 0 || k >= axis_len) continue;                                                 \
        ADD(&target[loff(lt, i) + k * axis_stride], values[loff(lv, i)]);                     \
    }

#define SCATTER_ADD_ARGS(T)                                                                   \
    (T * target, const void* idx, int idx64, const T* values, Layout lt, Layout li,           \
     Layout lv, i64 axis_stride, i64 axis_len, i64 n)

#define NATIVE_ADD(p, v) atomic_add(p, v)
#define F16_ADD(p, v) atomic_add_half_value<false>(p, v)
#define BF16_ADD(p, v) atomic_add_half_value<true>(p, v)

KERNEL void scatter_add_f32 SCATTER_ADD_ARGS(float) { SCATTER_ADD_BODY(NATIVE_ADD) }
KERNEL void scatter_add_f64 SCATTER_ADD_ARGS(double) { SCATTER_ADD_BODY(NATIVE_ADD) }
KERNEL void scatter_add_i32 SCATTER_ADD_ARGS(i32) { SCATTER_ADD_BODY(NATIVE_ADD) }
KERNEL void scatter_add_i64 SCATTER_ADD_ARGS(i64) { SCATTER_ADD_BODY(NATIVE_ADD) }
KERNEL void scatter_add_f16 SCATTER_ADD_ARGS(u16) { SCATTER_ADD_BODY(F16_ADD) }
KERNEL void scatter_add_bf16 SCATTER_ADD_ARGS(u16) { SCATTER_ADD_BODY(BF16_ADD) }

// index_add of whole rows along axis 0 through sorted indices (an embedding's gradient): the
// target is `[axis_len, d]` rows `ts` elements apart, the values `[m, d]` rows `vs` apart,
// `sorted` the m indices in ascending order and `perm` the values row of each. A block takes
// IAR_CHUNK consecutive sorted positions and a tile of columns (one per thread), sums each run
// of equal indices in the accumulator type and adds the sum to its target row once. Many
// indices on one row (padding or mask tokens) then cost one atomic add per chunk instead of one
// per index, and halfs round once per chunk.
#define IAR_CHUNK 32

__device__ __forceinline__ void row_flush(DF32, float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void row_flush(DF64, double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void row_flush(DF16, u16* p, float v) { atomic_add_half_value<false>(p, f32_to_f16(v)); }
__device__ __forceinline__ void row_flush(DBF16, u16* p, float v) { atomic_add_half_value<true>(p, f32_to_bf16(v)); }

template <typename D>
__device__ __forceinline__ void index_add_rows(typename D::T* target, const void* sorted, int idx64,
                                               const i64* perm, const typename D::T* values, i64 ts, i64 vs,
                                               i64 d, i64 axis_len, i64 m) {
    __shared__ i64 key[IAR_CHUNK];
    __shared__ i64 row[IAR_CHUNK];
    const i64 c0 = (i64)blockIdx.x * IAR_CHUNK;
    const int len = (int)min((i64)IAR_CHUNK, m - c0);
    if ((int)threadIdx.x < len) {
        key[threadIdx.x] = load_index(sorted, idx64, c0 + threadIdx.x);
        row[threadIdx.x] = perm[c0 + threadIdx.x];
    }
    __syncthreads();
    const i64 col = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= d) return;
    typename D::A acc = 0;
    i64 cur = key[0];
    for (int j = 0; j < len; ++j) {
        const i64 k = key[j];
        if (k != cur) {
            if (cur >= 0 && cur < axis_len) row_flush(D(), target + cur * ts + col, acc);
            acc = 0;
            cur = k;
        }
        acc += D::ld(values, row[j] * vs + col);
    }
    if (cur >= 0 && cur < axis_len) row_flush(D(), target + cur * ts + col, acc);
}

#define INDEX_ADD_ROWS(DT, D)                                                                 \
    KERNEL void index_add_rows_##DT(D::T* target, const void* sorted, int idx64, const i64* perm, \
                                    const D::T* values, i64 ts, i64 vs, i64 d, i64 axis_len,  \
                                    i64 m) {                                                  \
        index_add_rows<D>(target, sorted, idx64, perm, values, ts, vs, d, axis_len, m);       \
    }

INDEX_ADD_ROWS(f32, DF32)
INDEX_ADD_ROWS(f64, DF64)
INDEX_ADD_ROWS(f16, DF16)
INDEX_ADD_ROWS(bf16, DBF16)

// scatter_add / index_add for deterministic mode: the host orders the iteration shape with
// the axis last, so item `l * len + a` is step `a` of line `l`; one thread per line adds its
// steps in axis order with plain loads and stores (lines never share a target element), so
// results do not depend on scheduling. Halfs round after each add, as the atomic version.

__device__ __forceinline__ float seq_add(float a, float b) { return a + b; }
__device__ __forceinline__ double seq_add(double a, double b) { return a + b; }
__device__ __forceinline__ i32 seq_add(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
__device__ __forceinline__ i64 seq_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ u16 seq_add_f16(u16 a, u16 b) { return f32_to_f16(f16_to_f32(a) + f16_to_f32(b)); }
__device__ __forceinline__ u16 seq_add_bf16(u16 a, u16 b) {
    return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b));
}

#define SCATTER_ADD_SEQ(DT, T, ADD)                                                           \
    KERNEL void scatter_add_seq_##DT(T* target, const void* idx, int idx64, const T* values,  \
                                     Layout lt, Layout li, Layout lv, i64 axis_stride,        \
                                     i64 axis_len, i64 lines, i64 len) {                      \
        FOR_EACH(l, lines) {                                                                  \
            for (i64 a = 0; a < len; ++a) {                                                   \
                const i64 i = l * len + a;                                                    \
                const i64 k = load_index(idx, idx64, loff(li, i));                            \
                if (k < 0 || k >= axis_len) continue;                                         \
                T* p = &target[loff(lt, i) + k * axis_stride];                                \
                *p = ADD(*p, values[loff(lv, i)]);                                            \
            }                                                                                 \
        }                                                                                     \
    }

SCATTER_ADD_SEQ(f32, float, seq_add)
SCATTER_ADD_SEQ(f64, double, seq_add)
SCATTER_ADD_SEQ(i32, i32, seq_add)
SCATTER_ADD_SEQ(i64, i64, seq_add)
SCATTER_ADD_SEQ(f16, u16, seq_add_f16)
SCATTER_ADD_SEQ(bf16, u16, seq_add_bf16)

// ---------------------------------------------------------------------------------------
// gather_nd / scatter_nd
//
// Index tuples of K coordinates address the first K dims of the indexed operand (`data`);
// each tuple selects a slice `data[c_0, .., c_{K-1}, ...]`. The kernels run a grid-stride
// loop over the `n` items of the joint shape `tuple dims ++ slice dims`, with a `Layout`
// over it for: the indexed operand (stride 0 on the tuple dims), the indices (pointing at
// a tuple's first coordinate; stride 0 on the slice dims) and out/values. `lk` describes
// the K indexed dims (rank K, their lengths and strides in data); coordinate j of a tuple
// lies `j * kstride` after its first one. A tuple with a coordinate outside
// `[0, lk.shape[j])` (negative included) is skipped: gather_nd writes zeros for it,
// scatter_nd leaves the target unchanged.

// Adds the offset of the tuple whose first coordinate is at `oi` to `off`; false when a
// coordinate is out of range.
__device__ __forceinline__ bool nd_offset(const void* idx, int idx64, i64 oi, i64 kstride, const Layout& lk,
                                          i64& off) {
    for (int j = 0; j < lk.rank; ++j) {
        i64 c = load_index(idx, idx64, oi + j * kstride);
        if (c < 0 || c >= lk.shape[j]) return false;
        off += c * lk.strides[j];
    }
    return true;
}

// gather_nd_b{1,2,4,8}(const T* x, const void* idx, int idx64, T* out, Layout lx,
//                      Layout li, Layout lo, Layout lk, i64 kstride, i64 n): bit copies.
#define GATHER_ND(B, T)                                                                       \
    KERNEL void gather_nd_b##B(const T* x, const void* idx, int idx64, T* out,                \
                                              Layout lx, Layout li, Layout lo, Layout lk,     \
                                              i64 kstride, i64 n) {                           \
        FOR_EACH(i, n) {                                                                      \
            i64 ox = loff(lx, i);                                                             \
            T v = 0;                                                                          \
            if (nd_offset(idx, idx64, loff(li, i), kstride, lk, ox)) v = x[ox];               \
            out[loff(lo, i)] = v;                                                             \
        }                                                                                     \
    }

GATHER_ND(1, u8)
GATHER_ND(2, u16)
GATHER_ND(4, u32)
GATHER_ND(8, u64)

// scatter_nd update ops (the `op` argument; `ScatterNdOp` on the host).
#define ND_ASSIGN 0
#define ND_ADD 1
#define ND_MUL 2
#define ND_MIN 3
#define ND_MAX 4

// Element types of scatter_nd: storage `T`, compute type `C` (f32 for halfs, i64 for every
// int: the result is truncated to the width of `T`, so ints wrap), the conversions, and the
// raw bits of `T` for compare-and-swap.
struct NdF32 {
    typedef float T;
    typedef float C;
    static __device__ __forceinline__ C get(T v) { return v; }
    static __device__ __forceinline__ T put(C v) { return v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)__float_as_uint(v); }
    static __device__ __forceinline__ T unbits(u64 b) { return __uint_as_float((u32)b); }
};
struct NdF64 {
    typedef double T;
    typedef double C;
    static __device__ __forceinline__ C get(T v) { return v; }
    static __device__ __forceinline__ T put(C v) { return v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)__double_as_longlong(v); }
    static __device__ __forceinline__ T unbits(u64 b) { return __longlong_as_double((i64)b); }
};
struct NdF16 {
    typedef u16 T;
    typedef float C;
    static __device__ __forceinline__ C get(T v) { return f16_to_f32(v); }
    static __device__ __forceinline__ T put(C v) { return f32_to_f16(v); }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (u16)b; }
};
struct NdBF16 {
    typedef u16 T;
    typedef float C;
    static __device__ __forceinline__ C get(T v) { return bf16_to_f32(v); }
    static __device__ __forceinline__ T put(C v) { return f32_to_bf16(v); }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (u16)b; }
};
struct NdI32 {
    typedef i32 T;
    typedef i64 C;
    static __device__ __forceinline__ C get(T v) { return (C)v; }
    static __device__ __forceinline__ T put(C v) { return (T)(u32)(u64)v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)(u32)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (T)(u32)b; }
};
struct NdI64 {
    typedef i64 T;
    typedef i64 C;
    static __device__ __forceinline__ C get(T v) { return v; }
    static __device__ __forceinline__ T put(C v) { return v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (T)b; }
};
struct NdI8 {
    typedef i8 T;
    typedef i64 C;
    static __device__ __forceinline__ C get(T v) { return (C)v; }
    static __device__ __forceinline__ T put(C v) { return (T)(u8)(u64)v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)(u8)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (T)(u8)b; }
};
struct NdU8 {
    typedef u8 T;
    typedef i64 C;
    static __device__ __forceinline__ C get(T v) { return (C)v; }
    static __device__ __forceinline__ T put(C v) { return (T)(u64)v; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (T)b; }
};
// Bool (0 or 1 in a byte): any non-zero result is true, so Add is a logical or, Mul and
// Min a logical and, Max a logical or.
struct NdBool {
    typedef u8 T;
    typedef i64 C;
    static __device__ __forceinline__ C get(T v) { return (C)v; }
    static __device__ __forceinline__ T put(C v) { return v != 0 ? 1 : 0; }
    static __device__ __forceinline__ u64 bits(T v) { return (u64)v; }
    static __device__ __forceinline__ T unbits(u64 b) { return (T)b; }
};

__device__ __forceinline__ float nd_add(float a, float b) { return a + b; }
__device__ __forceinline__ double nd_add(double a, double b) { return a + b; }
__device__ __forceinline__ i64 nd_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ float nd_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double nd_mul(double a, double b) { return a * b; }
__device__ __forceinline__ i64 nd_mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }

// The updated element from the current one and the value, as burn-ndarray computes it:
// Min/Max replace only when the value compares strictly less/greater, so a NaN value never
// replaces and a NaN element stays.
template <int OP, typename C>
__device__ __forceinline__ C nd_combine(C cur, C v) {
    if (OP == ND_ADD) return nd_add(cur, v);
    if (OP == ND_MUL) return nd_mul(cur, v);
    if (OP == ND_MIN) return v < cur ? v : cur;
    return v > cur ? v : cur;
}

// Atomic read-modify-write of one element by compare-and-swap: on the element itself for
// 2-, 4- and 8-byte types, on the aligned 32-bit word that holds it for 1-byte types (the
// other bytes of the word are preserved; a concurrent change to them retries; such buffers
// must be allocated in whole 4-byte words, as the backend's storage is).
// Returns at once when the update would not change the element.
template <typename D, int OP>
__device__ __forceinline__ void nd_cas(typename D::T* p, typename D::C v) {
    typedef typename D::T T;
    if (sizeof(T) == 8) {
        u64* w = (u64*)p;
        u64 old = *(volatile u64*)w, assumed;
        do {
            assumed = old;
            u64 next = D::bits(D::put(nd_combine<OP>(D::get(D::unbits(assumed)), v)));
            if (next == assumed) return;
            old = atomicCAS(w, assumed, next);
        } while (old != assumed);
    } else if (sizeof(T) == 4) {
        u32* w = (u32*)p;
        u32 old = *(volatile u32*)w, assumed;
        do {
            assumed = old;
            u32 next = (u32)D::bits(D::put(nd_combine<OP>(D::get(D::unbits(assumed)), v)));
            if (next == assumed) return;
            old = atomicCAS(w, assumed, next);
        } while (old != assumed);
    } else if (sizeof(T) == 2) {
        u16* w = (u16*)p;
        u16 old = *(volatile u16*)w, assumed;
        do {
            assumed = old;
            u16 next = (u16)D::bits(D::put(nd_combine<OP>(D::get(D::unbits((u64)assumed)), v)));
            if (next == assumed) return;
            old = atomicCAS(w, assumed, next);
        } while (old != assumed);
    } else {
        u32* w = (u32*)((u64)p & ~(u64)3);
        u32 shift = (u32)((u64)p & 3) * 8u;
        u32 mask = 0xffu << shift;
        u32 old = *(volatile u32*)w, assumed;
        do {
            assumed = old;
            T cur = D::unbits((u64)((assumed & mask) >> shift));
            u32 r = (u32)D::bits(D::put(nd_combine<OP>(D::get(cur), v)));
            u32 next = (assumed & ~mask) | ((r << shift) & mask);
            if (next == assumed) return;
            old = atomicCAS(w, assumed, next);
        } while (old != assumed);
    }
}

// One atomic update; native atomics where the hardware has them, else `nd_cas`.
template <typename D, int OP>
__device__ __forceinline__ void nd_update(typename D::T* p, typename D::T v) {
    nd_cas<D, OP>(p, D::get(v));
}
template <>
__device__ __forceinline__ void nd_update<NdF32, ND_ADD>(float* p, float v) { atomicAdd(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdF64, ND_ADD>(double* p, double v) { atomicAdd(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI32, ND_ADD>(i32* p, i32 v) { atomicAdd(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI32, ND_MIN>(i32* p, i32 v) { atomicMin(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI32, ND_MAX>(i32* p, i32 v) { atomicMax(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI64, ND_ADD>(i64* p, i64 v) { atomic_add(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI64, ND_MIN>(i64* p, i64 v) { atomicMin(p, v); }
template <>
__device__ __forceinline__ void nd_update<NdI64, ND_MAX>(i64* p, i64 v) { atomicMax(p, v); }

// Assign is a plain store: with duplicate tuples each element ends up holding one of its
// candidates (unspecified which, like PyTorch's `index_put_` without accumulate). The
// other ops are order-independent (up to float rounding for Add and Mul).
template <typename D>
__device__ __forceinline__ void scatter_nd_body(typename D::T* target, const void* idx, int idx64,
                                                const typename D::T* values, const Layout& lt, const Layout& li,
                                                const Layout& lv, const Layout& lk, i64 kstride, int op, i64 n) {
    FOR_EACH(i, n) {
        i64 ot = loff(lt, i);
        if (!nd_offset(idx, idx64, loff(li, i), kstride, lk, ot)) continue;
        typename D::T v = values[loff(lv, i)];
        typename D::T* p = target + ot;
        switch (op) {
            case ND_ASSIGN: *p = v; break;
            case ND_ADD: nd_update<D, ND_ADD>(p, v); break;
            case ND_MUL: nd_update<D, ND_MUL>(p, v); break;
            case ND_MIN: nd_update<D, ND_MIN>(p, v); break;
            default: nd_update<D, ND_MAX>(p, v); break;
        }
    }
}

// scatter_nd_<dt>(T* target, const void* idx, int idx64, const T* values, Layout lt,
//                 Layout li, Layout lv, Layout lk, i64 kstride, int op, i64 n)
#define SCATTER_ND(NAME, D)                                                                   \
    KERNEL void scatter_nd_##NAME(D::T* target, const void* idx, int idx64,                   \
                                                 const D::T* values, Layout lt, Layout li,    \
                                                 Layout lv, Layout lk, i64 kstride, int op,   \
                                                 i64 n) {                                     \
        scatter_nd_body<D>(target, idx, idx64, values, lt, li, lv, lk, kstride, op, n);       \
    }

SCATTER_ND(f32, NdF32)
SCATTER_ND(f64, NdF64)
SCATTER_ND(f16, NdF16)
SCATTER_ND(bf16, NdBF16)
SCATTER_ND(i32, NdI32)
SCATTER_ND(i64, NdI64)
SCATTER_ND(i8, NdI8)
SCATTER_ND(u8, NdU8)
SCATTER_ND(bool, NdBool)

// ---------------------------------------------------------------------------------------
// scatter_nd without atomics (the engine's deterministic mode; `scatter_nd_ordered` on
// the host): `scatter_nd_keys` gives every tuple the row-major index of the element it
// addresses over the K indexed dims, the host sorts the keys stably (kernels/sort.cu), and
// `scatter_nd_ordered_<dt>` lets one thread per (run of equal keys, slice element) combine
// the run's values in tuple order with plain loads and one store. Results do not depend
// on scheduling.

// Key of a tuple with a coordinate out of range: sorts after every real key (which are
// below the target's element count) and is skipped.
#define ND_NO_KEY 0x7fffffffffffffffLL

// scatter_nd_keys(const void* idx, int idx64, i64* keys, Layout li, Layout lk,
//                 i64 kstride, i64 slice, i64 m): `keys[t]` for the `m` tuples; tuple t's
// first coordinate is item `t * slice` of `li` (the joint-shape layout of the indices).
KERNEL void scatter_nd_keys(const void* idx, int idx64, i64* keys, Layout li, Layout lk, i64 kstride,
                            i64 slice, i64 m) {
    FOR_EACH(t, m) {
        const i64 oi = loff(li, t * slice);
        i64 key = 0;
        for (int j = 0; j < lk.rank; ++j) {
            const i64 c = load_index(idx, idx64, oi + j * kstride);
            if (c < 0 || c >= lk.shape[j]) {
                key = ND_NO_KEY;
                break;
            }
            key = key * lk.shape[j] + c;
        }
        keys[t] = key;
    }
}

// Item `i = p * slice + e` of the sorted tuples; only the first position `p` of each run of
// equal keys works: it walks the run in sorted order (= tuple order: the sort is stable)
// and updates target element `e` of the addressed slice once. Assign copies the last
// value of the run bit for bit; the other ops combine in the compute type `D::C` from the
// current element and round once at the end (halfs: f32, ints: i64, wrapping like the
// atomic kernels).
template <typename D>
__device__ __forceinline__ void scatter_nd_ordered_body(typename D::T* target, const i64* keys, const i64* perm,
                                                        const typename D::T* values, const Layout& lt,
                                                        const Layout& lv, const Layout& lk, i64 slice, int op,
                                                        i64 n) {
    typedef typename D::C C;
    const i64 m = n / slice;
    FOR_EACH(i, n) {
        const i64 p = i / slice;
        const i64 e = i - p * slice;
        const i64 key = keys[p];
        if (key == ND_NO_KEY || (p > 0 && keys[p - 1] == key)) continue;
        i64 ot = loff(lt, e);
        i64 rest = key;
        for (int j = lk.rank - 1; j >= 0; --j) {
            ot += (rest % lk.shape[j]) * lk.strides[j];
            rest /= lk.shape[j];
        }
        i64 q = p;
        if (op == ND_ASSIGN) {
            while (q + 1 < m && keys[q + 1] == key) ++q;
            target[ot] = values[loff(lv, perm[q] * slice + e)];
            continue;
        }
        C acc = D::get(target[ot]);
        for (; q < m && keys[q] == key; ++q) {
            const C v = D::get(values[loff(lv, perm[q] * slice + e)]);
            switch (op) {
                case ND_ADD: acc = nd_combine<ND_ADD>(acc, v); break;
                case ND_MUL: acc = nd_combine<ND_MUL>(acc, v); break;
                case ND_MIN: acc = nd_combine<ND_MIN>(acc, v); break;
                default: acc = nd_combine<ND_MAX>(acc, v); break;
            }
        }
        target[ot] = D::put(acc);
    }
}

// scatter_nd_ordered_<dt>(T* target, const i64* keys, const i64* perm, const T* values,
//                         Layout lt, Layout lv, Layout lk, i64 slice, int op, i64 n):
// `keys` sorted ascending, `perm[p]` the tuple of sorted position p, `n = m * slice`.
#define SCATTER_ND_ORDERED(NAME, D)                                                           \
    KERNEL void scatter_nd_ordered_##NAME(D::T* target, const i64* keys, const i64* perm,     \
                                          const D::T* values, Layout lt, Layout lv,           \
                                          Layout lk, i64 slice, int op, i64 n) {              \
        scatter_nd_ordered_body<D>(target, keys, perm, values, lt, lv, lk, slice, op, n);     \
    }

SCATTER_ND_ORDERED(f32, NdF32)
SCATTER_ND_ORDERED(f64, NdF64)
SCATTER_ND_ORDERED(f16, NdF16)
SCATTER_ND_ORDERED(bf16, NdBF16)
SCATTER_ND_ORDERED(i32, NdI32)
SCATTER_ND_ORDERED(i64, NdI64)
SCATTER_ND_ORDERED(i8, NdI8)
SCATTER_ND_ORDERED(u8, NdU8)
SCATTER_ND_ORDERED(bool, NdBool)
