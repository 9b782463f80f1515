//! The cross-entropy kernel family (`kernels/cross_entropy.cu`): which variant runs a call (a
//! warp per row for short rows, a block of 256 threads per row for long ones), their entry
//! points, whether the backward may take 16-byte vectors, and the ignored targets as the
//! kernels read them. `ops::cross_entropy` validates the operands and runs the passes.

use crate::ffi::launch_cross_entropy::{RowGrid, XentIgnore, MAX_IGNORE};
use crate::graph::DataType;

/// Rows of at most this many classes take a warp each (`xent_*_warp_*`); longer rows a
/// block of [`BLOCK_LANES`] threads each.
pub(crate) const WARP_MAX_CLASSES: i64 = 2048;

/// Threads per row of the block variant (`XENT_BLOCK_LANES`).
const BLOCK_LANES: u32 = 256;

/// Rows per block of the warp variant (`XENT_WARP_ROWS`).
const WARP_ROWS: u32 = 8;

/// A row kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Forward,
    Backward,
}

/// Entry points by kernel, variant (block, warp) and dtype (f32, f16, bf16).
const ENTRIES: [[[&str; 3]; 2]; 2] = [
    [
        ["xent_fwd_f32", "xent_fwd_f16", "xent_fwd_bf16"],
        ["xent_fwd_warp_f32", "xent_fwd_warp_f16", "xent_fwd_warp_bf16"],
    ],
    [
        ["xent_bwd_f32", "xent_bwd_f16", "xent_bwd_bf16"],
        ["xent_bwd_warp_f32", "xent_bwd_warp_f16", "xent_bwd_warp_bf16"],
    ],
];

/// The mean of the row losses.
pub(crate) const MEAN: &str = "xent_mean";
/// The backward's scale: the upstream gradient over the mean's denominator.
pub(crate) const SCALE: &str = "xent_scale";

/// The variant that runs rows of `k` classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// One block of [`BLOCK_LANES`] threads per row.
    Block,
    /// One warp per row, [`WARP_ROWS`] rows per block.
    Warp,
}

impl Variant {
    /// The variant for rows of `k` classes.
    pub(crate) fn for_classes(k: i64) -> Variant {
        if k <= WARP_MAX_CLASSES {
            Variant::Warp
        } else {
            Variant::Block
        }
    }

    /// The entry point of `kernel` for data of `dtype` (F32, F16 or BF16).
    pub(crate) fn entry(self, kernel: Kernel, dtype: DataType) -> &'static str {
        let dt = match dtype {
            DataType::F32 => 0,
            DataType::F16 => 1,
            _ => 2,
        };
        ENTRIES[kernel as usize][self as usize][dt]
    }

    /// The launch shape the entry points of this variant assume.
    pub(crate) fn grid(self) -> RowGrid {
        match self {
            Variant::Block => RowGrid {
                lanes: BLOCK_LANES,
                rows_per_block: 1,
            },
            Variant::Warp => RowGrid {
                lanes: 32,
                rows_per_block: WARP_ROWS,
            },
        }
    }
}

/// Whether the backward may read the logits and write their gradient 16 bytes at a time:
/// both start at the same offset within 16 bytes (the kernels then peel the same elements
/// off every row of both).
pub(crate) fn vectors_line_up(x: u64, dx: u64) -> bool {
    x % 16 == dx % 16
}

/// The ignore set of `values` (duplicates are kept; at most [`MAX_IGNORE`], checked by the
/// caller).
pub(crate) fn ignore_set(values: &[i64]) -> XentIgnore {
    let mut ign = XentIgnore {
        n: values.len().min(MAX_IGNORE) as i64,
        ..Default::default()
    };
    for (slot, &v) in ign.values.iter_mut().zip(values) {
        *slot = v;
    }
    ign
}

/// The dtype code the mean's output and the upstream gradient take (`ld_param`/`st_param`:
/// 0 f32, 1 f16, 2 bf16).
pub(crate) fn scalar_code(dtype: DataType) -> i32 {
    match dtype {
        DataType::F16 => 1,
        DataType::BF16 => 2,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_take_a_warp_and_long_rows_a_block() {
        assert_eq!(Variant::for_classes(10), Variant::Warp);
        assert_eq!(Variant::for_classes(WARP_MAX_CLASSES), Variant::Warp);
        assert_eq!(Variant::for_classes(WARP_MAX_CLASSES + 1), Variant::Block);
        assert_eq!(Variant::for_classes(50_257), Variant::Block);
        assert_eq!(
            Variant::Warp.entry(Kernel::Forward, DataType::BF16),
            "xent_fwd_warp_bf16"
        );
        assert_eq!(Variant::Block.entry(Kernel::Backward, DataType::F16), "xent_bwd_f16");
        assert_eq!(Variant::Block.entry(Kernel::Forward, DataType::F32), "xent_fwd_f32");
        assert_eq!(
            Variant::Warp.grid(),
            RowGrid {
                lanes: 32,
                rows_per_block: 8
            }
        );
        assert_eq!(Variant::Block.grid().rows_per_block, 1);
    }

    #[test]
    fn vectors_need_the_same_offset_within_16_bytes() {
        assert!(vectors_line_up(4096, 8192));
        assert!(vectors_line_up(4098, 8194));
        assert!(!vectors_line_up(4096, 8194));
    }

    #[test]
    fn the_ignore_set_lists_its_values() {
        let ign = ignore_set(&[0, -100, 7]);
        assert_eq!(ign.n, 3);
        assert_eq!(&ign.values[..3], &[0, -100, 7]);
        assert_eq!(ignore_set(&[]).n, 0);
        assert_eq!(scalar_code(DataType::BF16), 2);
        assert_eq!(scalar_code(DataType::F32), 0);
    }
}
