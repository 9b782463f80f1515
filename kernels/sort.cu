// Sort kernels on strided views (see backend/core/src/kernels/sort.rs): a stable sort of every
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
//
// Longer rows are merge-sorted (at the end of the file): chunks of 4096 elements are
// bitonic-sorted as above into global scratch arrays, then sorted runs are merged pairwise
// until one run per row is left.

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
    KERNEL void sort_rows_##NAME(                                                             \
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

// ---------------------------------------------------------------------------------------
// Rows longer than one block sorts: merge sort through global scratch memory.
//
// 1. sort_chunks_<dt>: every row is cut into chunks of SORT_CHUNK elements (the last one
//    shorter); one block bitonic-sorts a chunk's (key, index) pairs in shared memory, as
//    sort_rows does, with indices relative to the row, and writes them to the scratch
//    arrays `keys` (u64) and `idx` (i32), both [rows, len] packed.
// 2. merge_runs_b{1,2,4,8}: merges the neighbouring sorted runs [s, s + width) and
//    [s + width, s + 2 * width) of every row (the second may be short or empty) into one.
//    Merge path: each thread owns MERGE_ITEMS consecutive outputs, finds by a binary search
//    along its diagonal how many of the outputs before them come from the first run, then
//    merges its outputs sequentially. Pairs compare lexicographically and indices are
//    unique, so this is the stable merge (equal keys keep the lower index first). Passes
//    ping-pong between two scratch pairs; the last pass (one run per row left) writes the
//    values (copied bit-exactly from x by index) and/or the i64 indices to the strided
//    outputs instead.

#define SORT_CHUNK 4096
#define MERGE_ITEMS 8

// sort_chunks_<dt>(const T* x, u64* keys, i32* idx, Layout lx, i64 sx, i64 len,
//                  int descending, i64 rows); dynamic shared memory: SORT_CHUNK * (8 + 4)
// bytes.
#define SORT_CHUNKS(NAME, T, KEY)                                                             \
    KERNEL void sort_chunks_##NAME(const T* x, u64* keys_out, i32* idx_out,                   \
                                                  Layout lx, i64 sx, i64 len, int descending, \
                                                  i64 rows) {                                 \
        extern __shared__ u64 smem[];                                                         \
        u64* keys = smem;                                                                     \
        int* idx = (int*)(smem + SORT_CHUNK);                                                 \
        i64 chunks = (len + SORT_CHUNK - 1) / SORT_CHUNK;                                     \
        for (i64 b = blockIdx.x; b < rows * chunks; b += gridDim.x) {                         \
            i64 r = b / chunks;                                                               \
            i64 start = (b - r * chunks) * SORT_CHUNK;                                        \
            int m = len - start < SORT_CHUNK ? (int)(len - start) : SORT_CHUNK;               \
            i64 ox = offset_of(lx, r) + start * sx;                                           \
            for (int k = threadIdx.x; k < SORT_CHUNK; k += blockDim.x) {                      \
                u64 key = 0xffffffffffffffffull;                                              \
                if (k < m) {                                                                  \
                    key = KEY(x[ox + k * sx]);                                                \
                    if (descending) key = ~key;                                               \
                }                                                                             \
                keys[k] = key;                                                                \
                idx[k] = k;                                                                   \
            }                                                                                 \
            __syncthreads();                                                                  \
            bitonic(keys, idx, SORT_CHUNK);                                                   \
            i64 o = r * len + start;                                                          \
            for (int k = threadIdx.x; k < m; k += blockDim.x) {                               \
                keys_out[o + k] = keys[k];                                                    \
                idx_out[o + k] = (i32)(start + idx[k]);                                       \
            }                                                                                 \
            __syncthreads();                                                                  \
        }                                                                                     \
    }

SORT_CHUNKS(f32, float, F32_KEY)
SORT_CHUNKS(f64, double, F64_KEY)
SORT_CHUNKS(f16, u16, F16_KEY)
SORT_CHUNKS(bf16, u16, BF16_KEY)
SORT_CHUNKS(i64, i64, INT_KEY)
SORT_CHUNKS(i32, i32, INT_KEY)
SORT_CHUNKS(i8, i8, INT_KEY)
SORT_CHUNKS(u8, u8, INT_KEY)
SORT_CHUNKS(bool, u8, INT_KEY)

// (ka, ia) < (kb, ib) lexicographically.
__device__ __forceinline__ bool pair_lt(u64 ka, i32 ia, u64 kb, i32 ib) {
    return ka < kb || (ka == kb && ia < ib);
}

// merge_runs_b{1,2,4,8}(const T* x, const u64* skeys, const i32* sidx, u64* dkeys,
//                       i32* didx, T* values, i64* indices, int final_pass,
//                       int write_values, int write_indices, Layout lx, Layout lv,
//                       Layout li, i64 sx, i64 sv, i64 si, i64 len, i64 width, i64 rows):
// a grid-stride loop over rows * ceil(len / MERGE_ITEMS) tiles of outputs. `width` is a
// multiple of MERGE_ITEMS, so a tile never straddles two merged pairs.
#define MERGE_RUNS(B, T)                                                                      \
    KERNEL void merge_runs_b##B(                                                              \
        const T* x, const u64* skeys, const i32* sidx, u64* dkeys, i32* didx, T* values,      \
        i64* indices, int final_pass, int write_values, int write_indices, Layout lx,         \
        Layout lv, Layout li, i64 sx, i64 sv, i64 si, i64 len, i64 width, i64 rows) {         \
        i64 tiles = (len + MERGE_ITEMS - 1) / MERGE_ITEMS;                                    \
        FOR_EACH(t, rows * tiles) {                                                           \
            i64 r = t / tiles;                                                                \
            i64 p = (t - r * tiles) * MERGE_ITEMS;                                            \
            i64 s = p / (2 * width) * (2 * width);                                            \
            i64 a_end = s + width < len ? s + width : len;                                    \
            i64 b_end = s + 2 * width < len ? s + 2 * width : len;                            \
            i64 na = a_end - s, nb = b_end - a_end, d = p - s;                                \
            const u64* ka = skeys + r * len + s;                                              \
            const i32* ia = sidx + r * len + s;                                               \
            const u64* kb = ka + na;                                                          \
            const i32* ib = ia + na;                                                          \
            /* How many of the first d merged elements come from run a. */                    \
            i64 lo = d > nb ? d - nb : 0, hi = d < na ? d : na;                               \
            while (lo < hi) {                                                                 \
                i64 mid = (lo + hi) >> 1;                                                     \
                if (pair_lt(ka[mid], ia[mid], kb[d - 1 - mid], ib[d - 1 - mid])) {            \
                    lo = mid + 1;                                                             \
                } else {                                                                      \
                    hi = mid;                                                                 \
                }                                                                             \
            }                                                                                 \
            i64 i = lo, j = d - lo;                                                           \
            i64 count = b_end - p < MERGE_ITEMS ? b_end - p : MERGE_ITEMS;                    \
            i64 ox = 0, ov = 0, oi = 0;                                                       \
            if (final_pass) {                                                                 \
                ox = offset_of(lx, r);                                                        \
                if (write_values) ov = offset_of(lv, r);                                      \
                if (write_indices) oi = offset_of(li, r);                                     \
            }                                                                                 \
            for (i64 q = 0; q < count; ++q) {                                                 \
                bool take_a = j >= nb || (i < na && pair_lt(ka[i], ia[i], kb[j], ib[j]));     \
                u64 key;                                                                      \
                i32 id;                                                                       \
                if (take_a) {                                                                 \
                    key = ka[i];                                                              \
                    id = ia[i];                                                               \
                    ++i;                                                                      \
                } else {                                                                      \
                    key = kb[j];                                                              \
                    id = ib[j];                                                               \
                    ++j;                                                                      \
                }                                                                             \
                i64 pos = p + q;                                                              \
                if (final_pass) {                                                             \
                    if (write_values) values[ov + pos * sv] = x[ox + (i64)id * sx];           \
                    if (write_indices) indices[oi + pos * si] = (i64)id;                      \
                } else {                                                                      \
                    dkeys[r * len + pos] = key;                                               \
                    didx[r * len + pos] = id;                                                 \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

MERGE_RUNS(1, u8)
MERGE_RUNS(2, u16)
MERGE_RUNS(4, u32)
MERGE_RUNS(8, u64)
