// Shared definitions prepended to every kernel source by the crate (NVRTC, no includes).

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
    int pad_;
    i64 shape[8];
    i64 strides[8];
    i64 offset;
};

// Element offset of the row-major linear index `i` of the view's logical shape.
__device__ __forceinline__ i64 offset_of(const Layout& l, i64 i) {
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
