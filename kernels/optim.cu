// Multi-tensor optimizer steps (see backend/core/src/ops/optim.rs). `common.cuh` is prepended.
//
// One launch updates up to ADAM_MAX tensors of one dtype: the tensors' addresses and sizes
// travel in the kernel's parameter block (a __grid_constant__ struct, read in place), each
// block updates one chunk of one tensor. Every tensor is packed; outputs may alias inputs.

#define ADAM_MAX 32
#define ADAM_THREADS 256

// One parameter tensor: inputs, outputs (0 = absent: moments start at 0, the AMSGrad
// maximum at the new second moment), element count, and the step's bias-correction
// factors: update = m * a / (sqrt(v) + e).
struct AdamTensor {
    u64 p, g, m, v, vmax;
    u64 p_out, m_out, v_out, vmax_out;
    i64 numel;
    float a, e;
};

struct AdamBatch {
    int count;  // tensors in this launch
    int chunk;  // elements per block
    int first_chunk[ADAM_MAX + 1];
    AdamTensor t[ADAM_MAX];
};

// Shared hyper-parameters: lr, betas, the L2 penalty added to the gradient (Adam's weight
// decay), the decoupled decay rate lr * wd (AdamW; `cautious` skips it where the parameter
// and the new first moment differ in sign), and AMSGrad.
struct AdamHyper {
    float lr, beta1, beta2, l2, decay_rate;
    int amsgrad, cautious;
};

// `x` rounded to the storage dtype of `D` and back.
template <class D>
__device__ __forceinline__ float as_stored(float x) {
    typename D::T tmp;
    D::st(&tmp, 0, x);
    return D::ld(&tmp, 0);
}

template <class D>
__device__ void adam_step(const AdamBatch& b, const AdamHyper& h) {
    typedef typename D::T T;
    int blk = blockIdx.x;
    int k = 0;
    while (k + 1 < b.count && b.first_chunk[k + 1] <= blk) ++k;
    const AdamTensor& t = b.t[k];
    i64 start = (i64)(blk - b.first_chunk[k]) * b.chunk;
    i64 end = min(t.numel, start + (i64)b.chunk);
    const T* p = (const T*)t.p;
    const T* g = (const T*)t.g;
    const T* m = (const T*)t.m;
    const T* v = (const T*)t.v;
    const T* vmax = (const T*)t.vmax;
    for (i64 i = start + threadIdx.x; i < end; i += ADAM_THREADS) {
        float pv = D::ld(p, i);
        float gv = D::ld(g, i);
        if (h.l2 != 0.0f) gv += h.l2 * pv;
        float mv = m ? D::ld(m, i) : 0.0f;
        float vv = v ? D::ld(v, i) : 0.0f;
        mv = h.beta1 * mv + (1.0f - h.beta1) * gv;
        vv = h.beta2 * vv + (1.0f - h.beta2) * gv * gv;
        // The moments are kept in the tensors' dtype; the update uses them as stored, as
        // the composed optimizer does.
        mv = as_stored<D>(mv);
        vv = as_stored<D>(vv);
        float vuse = vv;
        if (h.amsgrad) {
            vuse = vmax ? fmaxf(D::ld(vmax, i), vv) : vv;
            D::st((T*)t.vmax_out, i, vuse);
        }
        D::st((T*)t.m_out, i, mv);
        D::st((T*)t.v_out, i, vv);
        float upd = mv * t.a / (sqrtf(vuse) + t.e);
        float decay = h.decay_rate;
        if (h.cautious && ((pv >= 0.0f) != (mv >= 0.0f))) decay = 0.0f;
        D::st((T*)t.p_out, i, pv - pv * decay - h.lr * upd);
    }
}

KERNEL void adam_f32(const __grid_constant__ AdamBatch b, AdamHyper h) { adam_step<DF32>(b, h); }
KERNEL void adam_f16(const __grid_constant__ AdamBatch b, AdamHyper h) { adam_step<DF16>(b, h); }
KERNEL void adam_bf16(const __grid_constant__ AdamBatch b, AdamHyper h) { adam_step<DBF16>(b, h); }
