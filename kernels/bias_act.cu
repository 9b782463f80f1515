// Bias add + activation over a packed tensor, in place: y = act(y + bias[channel]).
// Header-free (NVRTC needs no CUDA include path): f16/bf16 conversions are done by hand.

typedef unsigned short u16;

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }

__device__ __forceinline__ float ld_h(const u16* p, long long i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i]));
    return f;
}
__device__ __forceinline__ void st_h(u16* p, long long i, float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
}
__device__ __forceinline__ float ld_b(const u16* p, long long i) {
    return __uint_as_float(((unsigned)p[i]) << 16);
}
__device__ __forceinline__ void st_b(u16* p, long long i, float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = 0x7fc0; return; }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (u16)(u >> 16);
}

__device__ __forceinline__ float activate(float v, int act, float p) {
    switch (act) {
        case 1: return v > 0.f ? v : 0.f;
        case 2: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
        case 3: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        case 4: return 1.f / (1.f + expf(-v));
        case 5: return tanhf(v);
        case 6: return v > 0.f ? v : p * (expf(v) - 1.f);
        case 7: return v / (1.f + expf(-p * v));
        default: return v;
    }
}

#define BIAS_ACT(NAME, T, LD, ST)                                                          \
KERNEL void NAME(T* y, const T* bias, long long n, long long c_stride,                     \
                                long long channels, int act, float p) {                    \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;            \
         i += (long long)gridDim.x * blockDim.x) {                                         \
        float v = LD(y, i);                                                                \
        if (bias) v += LD(bias, (i / c_stride) % channels);                                \
        ST(y, i, activate(v, act, p));                                                     \
    }                                                                                      \
}

BIAS_ACT(bias_act_f32, float, ld, st)
BIAS_ACT(bias_act_f16, u16, ld_h, st_h)
BIAS_ACT(bias_act_bf16, u16, ld_b, st_b)
