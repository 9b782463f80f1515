//! The batch-norm kernel family (`kernels/batch_norm.cu`): which of its three variants runs a
//! call (16-byte vectors across the channels of packed channels-last data, 16-byte vectors
//! along the planes of packed NCHW data, strided kernels for any other layout), their entry
//! points, the reductions' split into chunks and the f32 workspace's layout. `ops::batch_norm`
//! validates the operands and runs the passes this module picks.

use crate::ffi::launch_batch_norm::{BnOperand, BnPlanesShape, BnShape, BnVecShape, BnView};
use crate::graph::DataType;
use crate::types::DeviceAddress;

/// An `[N, C, S]` reading of one data operand (S = the product of the spatial dims).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ncs {
    pub n: i64,
    pub c: i64,
    pub s: i64,
    pub view: BnView,
}

/// A batch-norm kernel (each has an entry per pass family and data dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Stats,
    Apply,
    GradStats,
    GradApply,
}

/// Entry points by kernel, family (strided, channels-last vectors, planes vectors) and data
/// dtype (f32, f16, bf16).
const ENTRIES: [[[&str; 3]; 3]; 4] = [
    [
        ["bn_stats_f32", "bn_stats_f16", "bn_stats_bf16"],
        ["bn_stats_vec_f32", "bn_stats_vec_f16", "bn_stats_vec_bf16"],
        ["bn_stats_planes_f32", "bn_stats_planes_f16", "bn_stats_planes_bf16"],
    ],
    [
        ["bn_apply_f32", "bn_apply_f16", "bn_apply_bf16"],
        ["bn_apply_vec_f32", "bn_apply_vec_f16", "bn_apply_vec_bf16"],
        ["bn_apply_planes_f32", "bn_apply_planes_f16", "bn_apply_planes_bf16"],
    ],
    [
        ["bn_grad_stats_f32", "bn_grad_stats_f16", "bn_grad_stats_bf16"],
        [
            "bn_grad_stats_vec_f32",
            "bn_grad_stats_vec_f16",
            "bn_grad_stats_vec_bf16",
        ],
        [
            "bn_grad_stats_planes_f32",
            "bn_grad_stats_planes_f16",
            "bn_grad_stats_planes_bf16",
        ],
    ],
    [
        ["bn_grad_apply_f32", "bn_grad_apply_f16", "bn_grad_apply_bf16"],
        [
            "bn_grad_apply_vec_f32",
            "bn_grad_apply_vec_f16",
            "bn_grad_apply_vec_bf16",
        ],
        [
            "bn_grad_apply_planes_f32",
            "bn_grad_apply_planes_f16",
            "bn_grad_apply_planes_bf16",
        ],
    ],
];

/// The kernels that run a call's passes over the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Any layout `ncs` reads (the strided kernels).
    Strided(BnShape),
    /// Packed channels-last, 16-byte vectors across the channels (the `*_vec_*` kernels).
    ChannelsLast(BnVecShape),
    /// Packed planes (NCHW), 16-byte vectors along the spatial dims (the `*_planes_*` kernels).
    Planes(BnPlanesShape),
}

impl Pass {
    /// The fastest family whose layout every data operand present has (address not 0);
    /// `channels_last_ok` false leaves the channels-last vectors out.
    pub(crate) fn choose(
        x: &Ncs,
        dtype: DataType,
        operands: &[&BnOperand],
        sm_count: u32,
        channels_last_ok: bool,
    ) -> Pass {
        if let Some(v) = vec_shape(x, dtype, operands, sm_count).filter(|_| channels_last_ok) {
            return Pass::ChannelsLast(v);
        }
        match planes_shape(x, dtype, operands, sm_count) {
            Some(p) => Pass::Planes(p),
            None => Pass::Strided(strided_shape(x, sm_count)),
        }
    }

    pub(crate) fn entry(&self, kernel: Kernel, dtype: DataType) -> &'static str {
        let family = match self {
            Pass::Strided(_) => 0,
            Pass::ChannelsLast(_) => 1,
            Pass::Planes(_) => 2,
        };
        let dt = match dtype {
            DataType::F32 => 0,
            DataType::F16 => 1,
            _ => 2,
        };
        ENTRIES[kernel as usize][family][dt]
    }

    /// The pass's shape as the per-channel finalize steps read it.
    pub(crate) fn shape(&self) -> BnShape {
        match self {
            Pass::Strided(sh) => *sh,
            Pass::ChannelsLast(v) => v.as_shape(),
            Pass::Planes(p) => p.as_shape(),
        }
    }
}

/// Floats of the reductions' partials (`per_channel` floats per chunk and channel).
pub(crate) fn partial_floats(per_channel: usize, pass: &Pass) -> usize {
    let sh = pass.shape();
    per_channel * sh.chunks as usize * sh.c as usize
}

/// Bytes of a workspace holding `floats` f32 values, then `coef_floats` coefficients that
/// start 16-byte aligned (the vector kernels read them 16 bytes at a time).
pub(crate) fn scratch_bytes(floats: usize, coef_floats: usize) -> usize {
    (floats + coef_floats) * 4 + 16
}

/// The coefficients' address in a workspace at `ws` after `floats` f32 values.
pub(crate) fn coef_at(ws: DeviceAddress, floats: usize) -> DeviceAddress {
    let end = ws.get() + floats as u64 * 4;
    ws.offset_bytes(end.next_multiple_of(16) - ws.get())
}

/// Channel lanes per block of the channels-last reductions (`BN_LANES`).
const LANES: i64 = 32;

/// How the reductions split the work: channels-last order when the channel stride is 1,
/// and about four blocks per SM in total (each chunk at least a few hundred elements).
fn plan_shape(x: &Ncs, view_is_channels_last: bool, sm_count: u32) -> BnShape {
    let target_blocks = 4 * sm_count.max(1) as i64;
    let rows = x.n * x.s;
    let (order, lanes_blocks, min_chunk) = if view_is_channels_last {
        (1, (x.c + LANES - 1) / LANES, 64)
    } else {
        (0, x.c, 512)
    };
    let max_chunks = ((rows + min_chunk - 1) / min_chunk).max(1);
    let chunks = ((target_blocks + lanes_blocks - 1) / lanes_blocks.max(1)).clamp(1, max_chunks.min(65_535));
    let chunk_len = ((rows + chunks - 1) / chunks).max(1);
    let chunks = ((rows + chunk_len - 1) / chunk_len).max(1);
    BnShape {
        n: x.n,
        c: x.c,
        s: x.s,
        order,
        chunk_len,
        chunks: chunks as i32,
    }
}

/// The strided kernels' pass over `x` (channels-last walk when the channel stride is 1).
fn strided_shape(x: &Ncs, sm_count: u32) -> BnShape {
    let channels_last = x.view.sc == 1 && x.c > 1 && (x.s == 1 || x.view.ss >= x.c);
    plan_shape(x, channels_last, sm_count)
}

/// The vectorized channels-last pass over `x` (the `*_vec_*` kernels) when every data
/// operand present (address not 0) is packed `[N * S, C]` with channels innermost and
/// 16-byte aligned, and C is a multiple of the 16-byte vector's element count; `None`
/// otherwise (the strided kernels serve every other layout).
fn vec_shape(x: &Ncs, dtype: DataType, operands: &[&BnOperand], sm_count: u32) -> Option<BnVecShape> {
    let vec = (16 / dtype.size()) as i64;
    let packed = |o: &&BnOperand| {
        o.ptr == crate::types::DeviceAddress::NULL
            || (o.ptr.get().is_multiple_of(16)
                && o.view.sc == 1
                && (x.s == 1 || o.view.ss == x.c)
                && (x.n == 1 || o.view.sn == x.s * x.c))
    };
    if x.c == 0 || x.c % vec != 0 || !operands.iter().all(packed) {
        return None;
    }
    let rows = x.n * x.s;
    let vectors = x.c / vec;
    let lanes = vectors.min(32);
    let row_blocks = (vectors + lanes - 1) / lanes;
    // About four blocks per SM, each thread at least four rows.
    let min_rows = (256 / lanes) * 4;
    let max_chunks = ((rows + min_rows - 1) / min_rows).clamp(1, 65_535);
    let target = 4 * i64::from(sm_count.max(1));
    let chunks = ((target + row_blocks - 1) / row_blocks).clamp(1, max_chunks);
    let chunk_len = ((rows + chunks - 1) / chunks).max(1);
    Some(BnVecShape {
        rows,
        c: x.c,
        vec,
        chunk_len,
        chunks: ((rows + chunk_len - 1) / chunk_len).max(1) as i32,
        lanes: lanes as u32,
    })
}

/// The vectorized planes pass over `x` (the `*_planes_*` kernels) when every data operand
/// present (address not 0) is packed `[N, C, S]` with S innermost (packed NCHW) and 16-byte
/// aligned, and S is a multiple of the 16-byte vector's element count; `None` otherwise.
fn planes_shape(x: &Ncs, dtype: DataType, operands: &[&BnOperand], sm_count: u32) -> Option<BnPlanesShape> {
    let vec = (16 / dtype.size()) as i64;
    let packed = |o: &&BnOperand| {
        o.ptr == crate::types::DeviceAddress::NULL
            || (o.ptr.get().is_multiple_of(16)
                && o.view.ss == 1
                && (x.c == 1 || o.view.sc == x.s)
                && (x.n == 1 || o.view.sn == x.c * x.s))
    };
    if x.c == 0 || x.s == 0 || x.s % vec != 0 || !operands.iter().all(packed) {
        return None;
    }
    // The strided reductions' split, counted in vectors.
    let in_vectors = Ncs { s: x.s / vec, ..*x };
    let sh = plan_shape(&in_vectors, false, sm_count);
    Some(BnPlanesShape {
        n: x.n,
        c: x.c,
        s: x.s,
        vec,
        chunk_len: sh.chunk_len,
        chunks: sh.chunks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_once() {
        for (n, c, s, cl) in [
            (128, 32, 1024, false),
            (1, 1, 2, false),
            (3, 200, 7, true),
            (512, 64, 49, true),
        ] {
            let v = Ncs {
                n,
                c,
                s,
                view: BnView::default(),
            };
            let sh = plan_shape(&v, cl, 132);
            let rows = n * s;
            assert!(sh.chunks >= 1 && sh.chunk_len >= 1);
            assert!((sh.chunks as i64 - 1) * sh.chunk_len < rows, "{sh:?}");
            assert!(sh.chunks as i64 * sh.chunk_len >= rows, "{sh:?}");
            assert_eq!(sh.order, cl as i32);
        }
    }

    #[test]
    fn packed_channels_last_operands_take_the_vector_kernels() {
        let x = Ncs {
            n: 64,
            c: 256,
            s: 56 * 56,
            view: BnView {
                sn: 56 * 56 * 256,
                sc: 1,
                ss: 256,
            },
        };
        let op = |ptr: u64, view: BnView| BnOperand {
            ptr: DeviceAddress::of_allocation(ptr),
            view,
        };
        let packed = op(4096, x.view);
        let v = vec_shape(&x, DataType::BF16, &[&packed, &op(0, BnView::default())], 132).expect("vector pass");
        assert_eq!((v.vec, v.lanes, v.rows), (8, 32, 64 * 3136));
        assert!((v.chunks as i64 - 1) * v.chunk_len < v.rows && v.chunks as i64 * v.chunk_len >= v.rows);
        // f32 takes 4 per vector; 12 channels divide by 4, not by 8.
        let x12 = Ncs {
            c: 12,
            view: BnView {
                sn: 12 * 3136,
                sc: 1,
                ss: 12,
            },
            ..x
        };
        assert_eq!(
            vec_shape(&x12, DataType::F32, &[&op(4096, x12.view)], 132).map(|v| (v.vec, v.lanes)),
            Some((4, 3))
        );
        assert!(vec_shape(&x12, DataType::F16, &[&op(4096, x12.view)], 132).is_none());
        // Misaligned, channels-first, or gapped operands take the strided kernels.
        assert!(vec_shape(&x, DataType::BF16, &[&op(4098, x.view)], 132).is_none());
        let nchw = BnView {
            sn: 256 * 3136,
            sc: 3136,
            ss: 1,
        };
        assert!(vec_shape(&x, DataType::BF16, &[&op(4096, nchw)], 132).is_none());
        let gapped = BnView {
            sn: 56 * 56 * 256 + 8,
            ..x.view
        };
        assert!(vec_shape(&x, DataType::BF16, &[&packed, &op(8192, gapped)], 132).is_none());
        // Few rows: one chunk of all of them.
        let tiny = Ncs { n: 2, s: 3, ..x };
        let v = vec_shape(
            &tiny,
            DataType::BF16,
            &[&op(
                4096,
                BnView {
                    sn: 768,
                    sc: 1,
                    ss: 256,
                },
            )],
            132,
        )
        .unwrap();
        assert_eq!((v.chunks, v.chunk_len), (1, 6));
    }

    #[test]
    fn packed_nchw_operands_take_the_planes_kernels() {
        let nchw = |n: i64, c: i64, s: i64| Ncs {
            n,
            c,
            s,
            view: BnView {
                sn: c * s,
                sc: s,
                ss: 1,
            },
        };
        let op = |ptr: u64, view: BnView| BnOperand {
            ptr: DeviceAddress::of_allocation(ptr),
            view,
        };
        let x = nchw(64, 256, 56 * 56);
        let p = planes_shape(&x, DataType::BF16, &[&op(4096, x.view), &op(0, BnView::default())], 132)
            .expect("planes pass");
        assert_eq!((p.vec, p.n, p.c, p.s), (8, 64, 256, 3136));
        // The chunks cover one channel's N * S / V vectors once.
        let per_channel = 64 * 3136 / 8;
        assert!((p.chunks as i64 - 1) * p.chunk_len < per_channel && p.chunks as i64 * p.chunk_len >= per_channel);
        let sh = p.as_shape();
        assert_eq!((sh.order, sh.chunk_len, sh.chunks), (0, p.chunk_len * 8, p.chunks));
        // 7 x 7 planes: 49 is no multiple of 8 (bf16) or 4 (f32); 14 x 14 = 196 is of 4 only.
        let x7 = nchw(64, 2048, 49);
        assert!(planes_shape(&x7, DataType::BF16, &[&op(4096, x7.view)], 132).is_none());
        let x14 = nchw(64, 1024, 196);
        assert!(planes_shape(&x14, DataType::BF16, &[&op(4096, x14.view)], 132).is_none());
        assert_eq!(
            planes_shape(&x14, DataType::F32, &[&op(4096, x14.view)], 132).map(|p| p.vec),
            Some(4)
        );
        // Misaligned, channels-last, channel-sliced or batch-gapped operands do not.
        assert!(planes_shape(&x, DataType::BF16, &[&op(4100, x.view)], 132).is_none());
        let nhwc = BnView {
            sn: 256 * 3136,
            sc: 1,
            ss: 256,
        };
        assert!(planes_shape(&x, DataType::BF16, &[&op(4096, nhwc)], 132).is_none());
        let sliced = BnView {
            sn: 512 * 3136,
            ..x.view
        };
        assert!(planes_shape(&x, DataType::BF16, &[&op(4096, x.view), &op(8192, sliced)], 132).is_none());
        // The channels-last vectors come first; packed NCHW takes the planes; the rest strided.
        let ops = [&op(4096, x.view)];
        assert!(matches!(
            Pass::choose(&x, DataType::BF16, &ops, 132, true),
            Pass::Planes(_)
        ));
        let cl = Ncs { view: nhwc, ..x };
        let cl_ops = [&op(4096, nhwc)];
        assert!(matches!(
            Pass::choose(&cl, DataType::BF16, &cl_ops, 132, true),
            Pass::ChannelsLast(_)
        ));
        assert!(matches!(
            Pass::choose(&cl, DataType::BF16, &cl_ops, 132, false),
            Pass::Strided(_)
        ));
        assert!(matches!(
            Pass::choose(&x7, DataType::BF16, &[&op(4096, x7.view)], 132, true),
            Pass::Strided(_)
        ));
        assert_eq!(
            Pass::choose(&x, DataType::F16, &ops, 132, true).entry(Kernel::GradApply, DataType::F16),
            "bn_grad_apply_planes_f16"
        );
        // Coefficients start 16-byte aligned after any number of partials.
        for floats in [0, 1, 3, 6, 7] {
            let coef = coef_at(DeviceAddress::of_allocation(256), floats).get();
            assert!(coef.is_multiple_of(16) && coef >= 256 + floats as u64 * 4);
            assert!(coef + 4 * 3 <= 256 + scratch_bytes(floats, 3) as u64);
        }
    }
}
