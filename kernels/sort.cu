// Sort kernels on strided views (see backend/src/kernels/sort.rs): a stable sort of every
// row along one axis, writing the sorted values and/or the original indices (i64).
// `common.cuh` is prepended.
//
// One block per row (grid-stride over rows). The row's `len <= 4096` elements are loaded
// into shared memory as (key, index) pairs, padded to the power of two `padded` with
// sentinels (key UINT64_MAX, index >= len), and bitonic-sorted on (key, index)
// lexicographically. Indices are unique, so the order is strict and the result is the
// stable sort. Keys are u64 with the order of the element:
//   floats (f16/bf16 via f32, f32, f64) as double: -0.0 and +0.0 are one key, every NaN is
//   one key above +inf; bits mapped so that unsigned order is numeric order;
//   ints (bool/u8/i8/i32/i64) as i64 with the sign bit flipped.
// Descending sorts the complemented keys (indices stay ascending: ties keep their order,
// NaN comes first). Values are written back from the original element (bit exact).
//
// The three operands have a `Layout` over the row shape (every dim but the axis); row r
// starts at `offset_of(layout, r)` and its element k lies `k * axis_stride` further.

__device__ __forceinline__ u64 float_key(double d) {
    u64 bits;
    if (d != d) {
        bits = 0x7ff8000000000000ull;  // every NaN: one key above +inf
    } else if (d == 0.0) {
        bits = 0;  // -0.0 == +0.0
    } else {
        bits = (u64)__double_as_longlong(d);
    }
    return (bits >> 63) ? ~bits : (bits | 0x8000000000000000ull);
}

__device__ __forceinline__ u64 int_key(i64 v) { return (u64)v ^ 0x8000000000000000ull; }

// (ka, ia) > (kb, ib) lexicographically.
__device__ __forceinline__ bool pair_gt(u64 ka, int ia, u64 kb, int ib) {
    return ka > kb || (ka == kb && ia > ib);
}

// Bitonic sort of `n` (a power of two) pairs in shared memory, ascending.
__device__ void bitonic(u64* keys, int* idx, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int p = i ^ j;
                if (p > i) {
                    bool up = (i & k) == 0;
                    if (pair_gt(keys[i], idx[i], keys[p], idx[p]) == up) {
                        u64 tk = keys[i];
                        keys[i] = keys[p];
                        keys[p] = tk;
                        int ti = idx[i];
                        idx[i] = idx[p];
                        idx[p] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
}

#define F32_KEY(v) float_key((double)(v))
#define F64_KEY(v) float_key(v)
#define F16_KEY(v) float_key((double)f16_to_f32(v))
#define BF16_KEY(v) float_key((double)bf16_to_f32(v))
#define INT_KEY(v) int_key((i64)(v))

// sort_rows_<dt>(const T* x, T* values, i64* indices, int write_values, int write_indices,
//                Layout lx, Layout lv, Layout li, i64 sx, i64 sv, i64 si, i64 len,
//                i64 padded, int descending, i64 rows); dynamic shared memory:
// padded * (8 + 4) bytes.
#define SORT_ROWS(NAME, T, KEY)                                                               \
    extern "C" __global__ void sort_rows_##NAME(                                              \
        const T* x, T* values, i64* indices, int write_values, int write_indices, Layout lx,  \
        Layout lv, Layout li, i64 sx, i64 sv, i64 si, i64 len, i64 padded, int descending,    \
        i64 rows) {                                                                           \
        extern __shared__ u64 smem[];                                                         \
        u64* keys = smem;                                                                     \
        int* idx = (int*)(smem + padded);                                                     \
        int n = (int)padded;                                                                  \
        int m = (int)len;                                                                     \
        for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {                                  \
            i64 ox = offset_of(lx, r);                                                        \
            for (int k = threadIdx.x; k < n; k += blockDim.x) {                               \
                u64 key = 0xffffffffffffffffull;                                              \
                if (k < m) {                                                                  \
                    key = KEY(x[ox + k * sx]);                                                \
                    if (descending) key = ~key;                                               \
                }                                                                             \
                keys[k] = key;                                                                \
                idx[k] = k;                                                                   \
            }                                                                                 \
            __syncthreads();                                                                  \
            bitonic(keys, idx, n);                                                            \
            i64 ov = write_values ? offset_of(lv, r) : 0;                                     \
            i64 oi = write_indices ? offset_of(li, r) : 0;                                    \
            for (int k = threadIdx.x; k < m; k += blockDim.x) {                               \
                int j = idx[k];                                                               \
                if (write_values) values[ov + k * sv] = x[ox + j * sx];                       \
                if (write_indices) indices[oi + k * si] = (i64)j;                             \
            }                                                                                 \
            __syncthreads();                                                                  \
        }                                                                                     \
    }

SORT_ROWS(f32, float, F32_KEY)
SORT_ROWS(f64, double, F64_KEY)
SORT_ROWS(f16, u16, F16_KEY)
SORT_ROWS(bf16, u16, BF16_KEY)
SORT_ROWS(i64, i64, INT_KEY)
SORT_ROWS(i32, i32, INT_KEY)
SORT_ROWS(i8, i8, INT_KEY)
SORT_ROWS(u8, u8, INT_KEY)
SORT_ROWS(bool, u8, INT_KEY)
