// Index kernels on strided views (see backend/src/kernels/index.rs): gather, index_select,
// scatter_add and index_add. `common.cuh` is prepended.
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
    extern "C" __global__ void gather_b##B(const T* x, const void* idx, int idx64, T* out,    \
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
// scatter_add / index_add (atomic adds)

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
#define F16_ADD(p, v) atomic_add_half<false>(p, f16_to_f32(v))
#define BF16_ADD(p, v) atomic_add_half<true>(p, bf16_to_f32(v))

extern "C" __global__ void scatter_add_f32 SCATTER_ADD_ARGS(float) { SCATTER_ADD_BODY(NATIVE_ADD) }
extern "C" __global__ void scatter_add_f64 SCATTER_ADD_ARGS(double) { SCATTER_ADD_BODY(NATIVE_ADD) }
extern "C" __global__ void scatter_add_i32 SCATTER_ADD_ARGS(i32) { SCATTER_ADD_BODY(NATIVE_ADD) }
extern "C" __global__ void scatter_add_i64 SCATTER_ADD_ARGS(i64) { SCATTER_ADD_BODY(NATIVE_ADD) }
extern "C" __global__ void scatter_add_f16 SCATTER_ADD_ARGS(u16) { SCATTER_ADD_BODY(F16_ADD) }
extern "C" __global__ void scatter_add_bf16 SCATTER_ADD_ARGS(u16) { SCATTER_ADD_BODY(BF16_ADD) }
