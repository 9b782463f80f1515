// Shared definitions prepended to every kernel source that asks for them (NVRTC, no includes),
// after prelude.cuh. Kernels are declared `KERNEL void name(...)`, not `extern "C" __global__`:
// see prelude.cuh and backend/core/src/kernels/mod.rs ("Kernel convention").

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// Strided view of up to 8 dims (matches `KernelLayout` on the host): offsets in elements.
struct Layout {
    int rank;
    int index32;  // 1: fewer than 2^31 elements, so 32-bit index arithmetic is exact
    i64 shape[8];
    i64 strides[8];
    i64 offset;
};

// Element offset of the row-major linear index `i` of the view's logical shape.
__device__ __forceinline__ i64 offset_of(const Layout& l, i64 i) {
    if (l.rank == 1) return l.offset + i * l.strides[0];
    if (l.index32) {
        // 32-bit division is several times cheaper than 64-bit; offsets stay 64-bit.
        unsigned int j = (unsigned int)i;
        i64 off = l.offset;
        for (int d = l.rank - 1; d >= 0; --d) {
            unsigned int n = (unsigned int)l.shape[d];
            off += (i64)(j % n) * l.strides[d];
            j /= n;
        }
        return off;
    }
    i64 off = l.offset;
    for (int d = l.rank - 1; d >= 0; --d) {
        i64 n = l.shape[d];
        off += (i % n) * l.strides[d];
        i /= n;
    }
    return off;
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Grid-stride loop over n items.
#define FOR_EACH(i, n) \
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ---- Shared by the families that address rank-4 views or add atomically into halfs. ----

// Logical coordinates of row-major index `i` in a rank-4 layout's shape.
// Decomposes the walk index `i` into coordinates of the [N, C, H, W] view `l`, in the view's
// memory order: channels innermost when `l` is channels-last (unit channel stride, the
// width strided), else row-major (width innermost). Every walk is a bijection either way;
// following memory order makes consecutive threads touch consecutive addresses.
// 32-bit division (several times cheaper than 64-bit) when the view has fewer than 2^31
// elements.
template <class I>
__device__ __forceinline__ void coords4_in(const Layout& l, I i, i64& b, i64& c, i64& h, i64& w) {
    const I C = (I)l.shape[1], H = (I)l.shape[2], W = (I)l.shape[3];
    if (C > 1 && l.strides[1] == 1 && W > 1 && l.strides[3] != 1) {
        c = (i64)(i % C);
        i /= C;
        w = (i64)(i % W);
        i /= W;
        h = (i64)(i % H);
        b = (i64)(i / H);
        return;
    }
    w = (i64)(i % W);
    i /= W;
    h = (i64)(i % H);
    i /= H;
    c = (i64)(i % C);
    b = (i64)(i / C);
}

__device__ __forceinline__ void coords4(const Layout& l, i64 i, i64& b, i64& c, i64& h, i64& w) {
    if (l.index32)
        coords4_in<unsigned int>(l, (unsigned int)i, b, c, h, w);
    else
        coords4_in<i64>(l, i, b, c, h, w);
}

__device__ __forceinline__ i64 off4(const Layout& l, i64 b, i64 c, i64 h, i64 w) {
    return b * l.strides[0] + c * l.strides[1] + h * l.strides[2] + w * l.strides[3];
}

// Element access by dtype: `T` is the stored type, `A` the accumulator.
struct DF32 {
    typedef float T;
    typedef float A;
    static __device__ __forceinline__ A ld(const T* p, i64 o) { return p[o]; }
    static __device__ __forceinline__ void st(T* p, i64 o, A v) { p[o] = v; }
    static __device__ __forceinline__ void add(T* p, A v) { atomicAdd(p, v); }
};
struct DF64 {
    typedef double T;
    typedef double A;
    static __device__ __forceinline__ A ld(const T* p, i64 o) { return p[o]; }
    static __device__ __forceinline__ void st(T* p, i64 o, A v) { p[o] = v; }
    static __device__ __forceinline__ void add(T* p, A v) { atomicAdd(p, v); }
};

// f16 (BF = false) or bf16 (BF = true) add by a 16-bit CAS on the element itself (sm_70+),
// so nothing outside the element is read; the sum is computed in f32 and rounded to
// nearest even.
template <bool BF>
__device__ __forceinline__ void atomic_add_half(u16* p, float v) {
    u16 old = *(volatile u16*)p, assumed;
    do {
        assumed = old;
        float f = (BF ? bf16_to_f32(assumed) : f16_to_f32(assumed)) + v;
        u16 next = BF ? f32_to_bf16(f) : f32_to_f16(f);
        old = atomicCAS(p, assumed, next);
    } while (old != assumed);
}

// Adds `h`, a value already in the element's format (f16, or bf16 with BF), to `*p`: the
// hardware's half add where it has one (f16 from sm_70, bf16 from sm_90; one rounding, as
// the compare-and-swap loop's), which under contention is far cheaper than retrying a CAS;
// elsewhere `atomic_add_half`.
template <bool BF>
__device__ __forceinline__ void atomic_add_half_value(u16* p, u16 h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (BF) {
        asm volatile("red.add.noftz.bf16 [%0], %1;" ::"l"(p), "h"(h) : "memory");
        return;
    }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    if (!BF) {
        asm volatile("red.add.noftz.f16 [%0], %1;" ::"l"(p), "h"(h) : "memory");
        return;
    }
#endif
    atomic_add_half<BF>(p, BF ? bf16_to_f32(h) : f16_to_f32(h));
}

struct DF16 {
    typedef u16 T;
    typedef float A;
    static __device__ __forceinline__ A ld(const T* p, i64 o) { return f16_to_f32(p[o]); }
    static __device__ __forceinline__ void st(T* p, i64 o, A v) { p[o] = f32_to_f16(v); }
    static __device__ __forceinline__ void add(T* p, A v) { atomic_add_half<false>(p, v); }
};
struct DBF16 {
    typedef u16 T;
    typedef float A;
    static __device__ __forceinline__ A ld(const T* p, i64 o) { return bf16_to_f32(p[o]); }
    static __device__ __forceinline__ void st(T* p, i64 o, A v) { p[o] = f32_to_bf16(v); }
    static __device__ __forceinline__ void add(T* p, A v) { atomic_add_half<true>(p, v); }
};

// A per-channel parameter of dtype code `pdt` (0 f32, 1 f16, 2 bf16): loaded as f32, stored
// rounded (the training kernels keep parameters in f32 or the data's half type).
__device__ __forceinline__ float ld_param(const void* p, int pdt, i64 i) {
    if (pdt == 0) return ((const float*)p)[i];
    if (pdt == 1) return f16_to_f32(((const u16*)p)[i]);
    return bf16_to_f32(((const u16*)p)[i]);
}

__device__ __forceinline__ void st_param(void* p, int pdt, i64 i, float v) {
    if (pdt == 0)
        ((float*)p)[i] = v;
    else if (pdt == 1)
        ((u16*)p)[i] = f32_to_f16(v);
    else
        ((u16*)p)[i] = f32_to_bf16(v);
}
