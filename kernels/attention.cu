// The row softmax of attention's f32 math path (backend/core/src/ops/attention_math.rs), over the
// packed scores [rows, n] that a matmul wrote (rows = batch · heads · queries, n = keys):
// forward P = softmax(scale · S) in place, with the bottom-right causal mask, and the row
// log-sum-exp when asked; backward dS = P ∘ (dP − Σ P ∘ dP) · scale in place over dP.
// One warp per row, ATTN_ROWS rows per block; float accumulation throughout.

#define ATTN_ROWS 8
#define ATTN_LANES 32

__device__ __forceinline__ float attn_warp_sum(float v) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

__device__ __forceinline__ float attn_warp_max(float v) {
    for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

// Keys [0, visible) of a row: all of them, or with `causal` those j <= i + n - lq for query
// i = row % lq (lq <= n, so at least one).
__device__ __forceinline__ i64 attn_visible(i64 row, i64 n, i64 lq, int causal) {
    return causal ? row % lq + n - lq + 1 : n;
}

KERNEL void attn_softmax_f32(float* s, float* lse, i64 rows, i64 n, i64 lq, float scale, int causal) {
    i64 row = (i64)blockIdx.x * ATTN_ROWS + threadIdx.y;
    if (row >= rows) return;
    float* r = s + row * n;
    int lane = threadIdx.x;
    i64 visible = attn_visible(row, n, lq, causal);
    float m = __int_as_float(0xff800000);  // -inf
    for (i64 c = lane; c < visible; c += ATTN_LANES) m = fmaxf(m, r[c] * scale);
    m = attn_warp_max(m);
    float sum = 0.0f;
    for (i64 c = lane; c < visible; c += ATTN_LANES) sum += expf(r[c] * scale - m);
    sum = attn_warp_sum(sum);
    float inv = 1.0f / sum;
    for (i64 c = lane; c < n; c += ATTN_LANES) r[c] = c < visible ? expf(r[c] * scale - m) * inv : 0.0f;
    if (lse && lane == 0) lse[row] = m + logf(sum);
}

KERNEL void attn_softmax_bwd_f32(const float* p, float* dp, i64 rows, i64 n, float scale) {
    i64 row = (i64)blockIdx.x * ATTN_ROWS + threadIdx.y;
    if (row >= rows) return;
    const float* pr = p + row * n;
    float* dr = dp + row * n;
    int lane = threadIdx.x;
    float dot = 0.0f;
    for (i64 c = lane; c < n; c += ATTN_LANES) dot += pr[c] * dr[c];
    dot = attn_warp_sum(dot);
    for (i64 c = lane; c < n; c += ATTN_LANES) dr[c] = pr[c] * (dr[c] - dot) * scale;
}
