//! Random number kernels on strided views: uniform, normal, bernoulli and uniform_int,
//! from a counter-based Philox4x32-10 generator.
//!
//! Every function takes the stream first, validates all its arguments, and only enqueues
//! work (it never synchronizes). The output may be arbitrarily strided (negative strides
//! included) but must not overlap itself (no 0 stride on a dim > 1). Empty outputs return
//! `Ok(())` at once after validation and leave the generator where it was.
//!
//! # The stream of numbers
//!
//! The key is the 64-bit seed (`[seed as u32, (seed >> 32) as u32]`). An output of `n`
//! elements reserves `ceil(n / 4)` counter values from the generator ([`Philox::advance`]);
//! element `i` (the row-major linear index of the output's logical shape, whatever its
//! strides) takes word `i % 4` of the block [`Philox::block`]`(i / 4, 0)`, i.e. of
//! [`philox4x32_10`] with counter `[lo32(c), hi32(c), carry, 0]`, `c = offset + i / 4`
//! (`carry` the overflow bit of that add). Where 32 bits are not enough (the low bits of
//! f64 uniforms, 64-bit wide integers) the second word comes from the same block index in
//! stream 1 (counter word 3 = 1). Results therefore do not depend on the launch
//! configuration or the GPU.
//!
//! Conversions (`w` a stream-0 word, `w'` the stream-1 word of the same element):
//! - uniform f32/f16/bf16: `u = (w >> 8) * 2^-24`, `v = fma(u, (f32)(high - low), (f32)low)`
//!   in f32, rounded to the dtype, then clamped to the dtype's values inside
//!   `[low, high)` (so `high` never comes out); f64: `u = ((w << 32 | w') >> 11) * 2^-53`,
//!   `v = fma(u, high - low, low)`, clamped the same way. A range narrower than the
//!   dtype's spacing holds none of its values: there the outputs are the two values around
//!   it, rounded to nearest, as Burn's reference backends give.
//! - normal: Box–Muller on word pairs (0, 1) and (2, 3) of the block: even words give
//!   `r cos(2 pi u2)`, odd ones `r sin(2 pi u2)`, `r = sqrt(-2 ln u1)` with
//!   `u1 = ((w >> 8) + 1) * 2^-24` in (0, 1]; then `fma(z, std, mean)`; f16/bf16 in f32,
//!   f64 from 53-bit uniforms.
//! - bernoulli: 1 when `w < floor(p * 2^32)` (so p = 1 always gives 1), else 0.
//! - uniform_int: `low + ((w * range) >> 32)` with `range = high - low`; when
//!   `range > 2^32` (I64 only), `low + (((w << 32 | w') * range) >> 64)`.
//!
//! Host work is split in two: a pure `plan_*` function (validation, layout, kernel choice)
//! that needs no device, and the launch of the planned kernel (`kernels/random.cu`).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::launch::KernelLayout;
use crate::ffi::launch_random::{self as launch, RandomTarget};
use crate::graph::{may_overlap, DataType};
use crate::kernels::check::on_stream;
use crate::kernels::layout::{coalesce, kernel_layout};
use crate::kernels::{stream_function, RANDOM};
use crate::types::{TensorMut, TensorRef};

// ---------------------------------------------------------------------------------------
// Philox4x32-10

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block (Salmon et al. 2011, as in Random123): ten rounds of
/// `counter` under `key`. The CPU reference of what the kernels compute.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = PHILOX_M0 as u64 * c[0] as u64;
        let p1 = PHILOX_M1 as u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Counter-based generator state: a 64-bit key (seed) and a 64-bit counter offset; the
/// same (seed, offset) always gives the same numbers on any GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Philox {
    /// The Philox key.
    pub seed: u64,
    /// The next unused counter value (in blocks of four 32-bit words).
    pub offset: u64,
}

impl Philox {
    /// A generator at offset 0.
    pub fn new(seed: u64) -> Self {
        Philox { seed, offset: 0 }
    }

    /// Reserves `n` draws and returns the generator position to use for them (advances
    /// `self.offset` by `ceil(n / 4)`, wrapping).
    pub fn advance(&mut self, n: u64) -> Philox {
        let at = *self;
        self.offset = self.offset.wrapping_add(n.div_ceil(4));
        at
    }

    /// The four words of block `index` (elements `4 * index .. 4 * index + 4` of a draw
    /// at this position) in `stream` (0: the main words, 1: the extra words of f64 and
    /// wide integer draws), as the kernels compute them.
    pub fn block(&self, index: u64, stream: u32) -> [u32; 4] {
        let (c, carry) = self.offset.overflowing_add(index);
        philox4x32_10(
            [c as u32, (c >> 32) as u32, carry as u32, stream],
            [self.seed as u32, (self.seed >> 32) as u32],
        )
    }
}

// ---------------------------------------------------------------------------------------
// Plans (pure host logic)

/// Scalar parameters of the planned kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RandomParams {
    /// `low`, `range = high - low`, and the clamp bounds (the dtype's smallest value
    /// `>= low` and largest value `< high`).
    Uniform { low: f64, range: f64, lo_c: f64, hi_c: f64 },
    /// `mean`, `std`.
    Normal { mean: f64, std: f64 },
    /// Threshold `floor(p * 2^32)` and the dtype's bit pattern of 1.
    Bernoulli { thr: u64, one: u64 },
    /// `low`, `range = high - low` (as u64), and whether 64-bit draws are needed.
    Int { low: i64, range: u64, wide: bool },
}

/// What a random function launches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RandomPlan {
    pub entry: &'static str,
    pub layout: KernelLayout,
    pub n: i64,
    pub params: RandomParams,
}

const FLOAT_NAMES: &str = "F32, F16, BF16 or F64";

/// Checks `out` (consistency, no overlap) and packs its layout; `None` when empty.
fn prepare(op: &'static str, out: &TensorRef) -> Result<Option<(KernelLayout, i64)>> {
    if out.dims.len() != out.strides.len() {
        return Err(Error::invalid_arg(
            op,
            "out",
            format!("{} dims but {} strides", out.dims.len(), out.strides.len()),
        ));
    }
    if let Some(d) = out.dims.iter().find(|&&d| d < 0) {
        return Err(Error::invalid_arg(
            op,
            "out",
            format!("negative dim {d} in {:?}", out.dims),
        ));
    }
    let n = out
        .dims
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::invalid_arg(op, "out", format!("{:?} has too many elements", out.dims)))?;
    if n > 0 && out.ptr == 0 {
        return Err(Error::invalid_arg(op, "out", "null device pointer"));
    }
    if may_overlap(&out.dims, &out.strides) {
        let msg = format!(
            "output dims {:?} with strides {:?} overlap (a 0 or too small stride)",
            out.dims, out.strides
        );
        return Err(Error::invalid_arg(op, "out", msg));
    }
    if n == 0 {
        return Ok(None);
    }
    let (shape, strides) = coalesce(&out.dims, &[out.strides.to_vec()]);
    Ok(Some((kernel_layout(op, &shape, &strides[0])?, n)))
}

fn finite(op: &'static str, arg: &'static str, v: f64) -> Result<()> {
    if !v.is_finite() {
        return Err(Error::invalid_arg(op, arg, format!("{v} is not finite")));
    }
    Ok(())
}

fn float_entry(op: &'static str, out: &TensorRef, entries: [&'static str; 4]) -> Result<&'static str> {
    match out.dtype {
        DataType::F32 => Ok(entries[0]),
        DataType::F16 => Ok(entries[1]),
        DataType::BF16 => Ok(entries[2]),
        DataType::F64 => Ok(entries[3]),
        d => Err(Error::invalid_arg(
            op,
            "out",
            format!("dtype {d:?} is not a float dtype ({FLOAT_NAMES})"),
        )),
    }
}

/// `v` rounded to the nearest value of the float `dtype` (overflow gives infinity).
fn round_float(dtype: DataType, v: f64) -> f64 {
    match dtype {
        DataType::F32 => v as f32 as f64,
        DataType::F16 => half::f16::from_f64(v).to_f64(),
        DataType::BF16 => half::bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// The next value of the 16-bit float format with bits `b` up (`up`) or down.
fn step16(b: u16, up: bool) -> u16 {
    let negative = b & 0x8000 != 0;
    let zero = b & 0x7fff == 0;
    match (zero, up, negative) {
        (true, true, _) => 0x0001,
        (true, false, _) => 0x8001,
        (false, true, false) | (false, false, true) => b + 1,
        (false, true, true) | (false, false, false) => b - 1,
    }
}

/// The neighbour of the float-dtype value `v` (already a value of `dtype`) up or down.
fn step_float(dtype: DataType, v: f64, up: bool) -> f64 {
    match dtype {
        DataType::F32 => {
            let f = v as f32;
            let b = f.to_bits();
            let next = match (f == 0.0, (f > 0.0) == up) {
                (true, _) => 1 | if up { 0 } else { 0x8000_0000 },
                (false, true) => b + 1,
                (false, false) => b - 1,
            };
            f32::from_bits(next) as f64
        }
        DataType::F16 => half::f16::from_bits(step16(half::f16::from_f64(v).to_bits(), up)).to_f64(),
        DataType::BF16 => half::bf16::from_bits(step16(half::bf16::from_f64(v).to_bits(), up)).to_f64(),
        _ => {
            let b = v.to_bits();
            let next = match (v == 0.0, (v > 0.0) == up) {
                (true, _) => 1 | if up { 0 } else { 1 << 63 },
                (false, true) => b + 1,
                (false, false) => b - 1,
            };
            f64::from_bits(next)
        }
    }
}

/// The smallest `dtype` value `>= low` and the largest `< high` (infinite inputs are
/// excluded by the caller; out-of-range bounds saturate to the finite extremes).
fn float_bounds(dtype: DataType, low: f64, high: f64) -> (f64, f64) {
    let mut lo = round_float(dtype, low);
    if lo < low {
        lo = step_float(dtype, lo, true);
    }
    let mut hi = round_float(dtype, high);
    if hi >= high {
        hi = step_float(dtype, hi, false);
    }
    (lo, hi)
}

pub(crate) fn plan_uniform(low: f64, high: f64, out: &TensorRef) -> Result<Option<RandomPlan>> {
    const OP: &str = "uniform";
    let entry = float_entry(OP, out, ["uniform_f32", "uniform_f16", "uniform_bf16", "uniform_f64"])?;
    finite(OP, "low", low)?;
    finite(OP, "high", high)?;
    if low >= high {
        return Err(Error::invalid_arg(
            OP,
            "high",
            format!("high {high} is not above low {low}"),
        ));
    }
    let range = high - low;
    let compute_ok = if out.dtype == DataType::F64 {
        range.is_finite()
    } else {
        (range as f32).is_finite() && (low as f32).is_finite()
    };
    if !compute_ok {
        let t = if out.dtype == DataType::F64 { "f64" } else { "f32" };
        return Err(Error::invalid_arg(
            OP,
            "high",
            format!("[{low}, {high}) is too wide: high - low or low overflows {t}"),
        ));
    }
    let (mut lo_c, mut hi_c) = float_bounds(out.dtype, low, high);
    if lo_c > hi_c {
        // No value of the dtype lies in [low, high). Burn's reference backends sample in f32
        // and round to the nearest value of the dtype, so the outputs are the two
        // neighbours around the range (`hi_c` is the one below, `lo_c` the one above).
        std::mem::swap(&mut lo_c, &mut hi_c);
    }
    Ok(prepare(OP, out)?.map(|(layout, n)| RandomPlan {
        entry,
        layout,
        n,
        params: RandomParams::Uniform { low, range, lo_c, hi_c },
    }))
}

pub(crate) fn plan_normal(mean: f64, std: f64, out: &TensorRef) -> Result<Option<RandomPlan>> {
    const OP: &str = "normal";
    let entry = float_entry(OP, out, ["normal_f32", "normal_f16", "normal_bf16", "normal_f64"])?;
    finite(OP, "mean", mean)?;
    finite(OP, "std", std)?;
    if std < 0.0 {
        return Err(Error::invalid_arg(OP, "std", format!("std {std} is negative")));
    }
    if out.dtype != DataType::F64 {
        for (arg, v) in [("mean", mean), ("std", std)] {
            if !(v as f32).is_finite() {
                return Err(Error::invalid_arg(
                    OP,
                    arg,
                    format!("{v} overflows f32 (the compute type of {:?})", out.dtype),
                ));
            }
        }
    }
    Ok(prepare(OP, out)?.map(|(layout, n)| RandomPlan {
        entry,
        layout,
        n,
        params: RandomParams::Normal { mean, std },
    }))
}

/// The bit pattern of 1 in `dtype`.
fn one_bits(dtype: DataType) -> u64 {
    match dtype {
        DataType::F32 => 1f32.to_bits() as u64,
        DataType::F16 => half::f16::ONE.to_bits() as u64,
        DataType::BF16 => half::bf16::ONE.to_bits() as u64,
        DataType::F64 => 1f64.to_bits(),
        _ => 1,
    }
}

pub(crate) fn plan_bernoulli(p: f64, out: &TensorRef) -> Result<Option<RandomPlan>> {
    const OP: &str = "bernoulli";
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid_arg(OP, "p", format!("p {p} is not in [0, 1]")));
    }
    let entry = match out.dtype.size() {
        1 => "bernoulli_b1",
        2 => "bernoulli_b2",
        4 => "bernoulli_b4",
        _ => "bernoulli_b8",
    };
    let thr = (p * 4_294_967_296.0) as u64;
    Ok(prepare(OP, out)?.map(|(layout, n)| RandomPlan {
        entry,
        layout,
        n,
        params: RandomParams::Bernoulli {
            thr,
            one: one_bits(out.dtype),
        },
    }))
}

pub(crate) fn plan_uniform_int(low: i64, high: i64, out: &TensorRef) -> Result<Option<RandomPlan>> {
    const OP: &str = "uniform_int";
    let (entry, min, max) = match out.dtype {
        DataType::I64 => ("uniform_int_b8", i64::MIN, i64::MAX),
        DataType::I32 => ("uniform_int_b4", i32::MIN as i64, i32::MAX as i64),
        DataType::I8 => ("uniform_int_b1", i8::MIN as i64, i8::MAX as i64),
        DataType::U8 => ("uniform_int_b1", 0, u8::MAX as i64),
        d => {
            return Err(Error::invalid_arg(
                OP,
                "out",
                format!("dtype {d:?} is not I64, I32, I8 or U8"),
            ))
        }
    };
    if low >= high {
        return Err(Error::invalid_arg(
            OP,
            "high",
            format!("high {high} is not above low {low}"),
        ));
    }
    if low < min {
        return Err(Error::invalid_arg(
            OP,
            "low",
            format!("low {low} is below {:?}'s minimum {min}", out.dtype),
        ));
    }
    if high - 1 > max {
        return Err(Error::invalid_arg(
            OP,
            "high",
            format!(
                "high {high} is above {:?}'s maximum + 1 ({})",
                out.dtype,
                max as i128 + 1
            ),
        ));
    }
    let range = high.wrapping_sub(low) as u64;
    Ok(prepare(OP, out)?.map(|(layout, n)| RandomPlan {
        entry,
        layout,
        n,
        params: RandomParams::Int {
            low,
            range,
            wide: range > 1 << 32,
        },
    }))
}

// ---------------------------------------------------------------------------------------
// Public API

/// Loads the plan's kernel, reserves its draws from `gen` and launches it.
fn run(stream: &Arc<CudaStream>, gen: &mut Philox, out: &TensorRef, plan: Option<RandomPlan>) -> Result<()> {
    let Some(p) = plan else {
        return Ok(());
    };
    let f = stream_function(stream, RANDOM, p.entry)?;
    let at = gen.advance(p.n as u64);
    let t = RandomTarget {
        out: out.address(),
        layout: &p.layout,
        n: p.n,
        offset: at.offset,
        seed: at.seed,
    };
    match p.params {
        RandomParams::Uniform { low, range, lo_c, hi_c } => launch::uniform(stream, &f, &t, [low, range, lo_c, hi_c]),
        RandomParams::Normal { mean, std } => launch::normal(stream, &f, &t, mean, std),
        RandomParams::Bernoulli { thr, one } => launch::bernoulli(stream, &f, &t, thr, one),
        RandomParams::Int { low, range, wide } => launch::uniform_int(stream, &f, &t, low, range, wide),
    }
}

/// Fills `out` (F32, F16, BF16 or F64) with uniform values in `[low, high)` (both finite,
/// `low < high`; `high` never comes out, even where rounding to the dtype would give it,
/// unless no value of the dtype lies in `[low, high)`: then each output is the nearer of the
/// two values around the range, as Burn's reference backends give).
/// Reserves `numel(out)` draws from `gen`.
pub fn uniform(stream: &Arc<CudaStream>, gen: &mut Philox, low: f64, high: f64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "uniform", &[("out", out)])?;
    run(stream, gen, out, plan_uniform(low, high, out)?)
}

/// Fills `out` (F32, F16, BF16 or F64) with normal values of mean `mean` and standard
/// deviation `std >= 0` (Box–Muller). Reserves `numel(out)` draws from `gen`.
pub fn normal(stream: &Arc<CudaStream>, gen: &mut Philox, mean: f64, std: f64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "normal", &[("out", out)])?;
    run(stream, gen, out, plan_normal(mean, std, out)?)
}

/// Fills `out` (any dtype) with 1 with probability `p` in `[0, 1]`, else 0. Reserves
/// `numel(out)` draws from `gen`.
pub fn bernoulli(stream: &Arc<CudaStream>, gen: &mut Philox, p: f64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "bernoulli", &[("out", out)])?;
    run(stream, gen, out, plan_bernoulli(p, out)?)
}

/// Fills `out` (I64, I32, I8 or U8) with integers uniform in `[low, high)` (`low < high`,
/// both within the dtype's range, `high` up to its maximum + 1). Reserves `numel(out)`
/// draws from `gen`.
pub fn uniform_int(stream: &Arc<CudaStream>, gen: &mut Philox, low: i64, high: i64, out: &TensorMut) -> Result<()> {
    on_stream(stream, "uniform_int", &[("out", out)])?;
    run(stream, gen, out, plan_uniform_int(low, high, out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x1000;

    fn t(dims: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake_packed(dims, dtype, P)
    }

    fn ts(dims: &[i64], strides: &[i64], dtype: DataType) -> TensorRef<'static> {
        TensorRef::fake(dims, strides, dtype, P)
    }

    use crate::kernels::invalid_argument as invalid;

    #[test]
    fn philox_known_answers() {
        // Random123 kat_vectors, philox4x32 with 10 rounds.
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn advance_reserves_whole_blocks() {
        let mut g = Philox::new(7);
        assert_eq!(g.advance(10), Philox { seed: 7, offset: 0 });
        assert_eq!(g.offset, 3);
        assert_eq!(g.advance(0).offset, 3);
        assert_eq!(g.offset, 3);
        assert_eq!(g.advance(4).offset, 3);
        assert_eq!(g.offset, 4);
        let mut w = Philox {
            seed: 1,
            offset: u64::MAX,
        };
        w.advance(8);
        assert_eq!(w.offset, 1);
    }

    #[test]
    fn block_counter_layout() {
        let g = Philox {
            seed: 0x0123_4567_89ab_cdef,
            offset: u64::MAX,
        };
        let key = [0x89ab_cdef, 0x0123_4567];
        assert_eq!(g.block(0, 0), philox4x32_10([u32::MAX, u32::MAX, 0, 0], key));
        // The add carries into word 2; stream 1 sets word 3.
        assert_eq!(g.block(2, 1), philox4x32_10([1, 0, 1, 1], key));
        assert_ne!(g.block(0, 0), g.block(0, 1));
        assert_eq!(Philox::new(5).block(0, 0), philox4x32_10([0; 4], [5, 0]));
    }

    #[test]
    fn entry_names_by_dtype() {
        use DataType::*;
        let x = |d| t(&[5], d);
        let names: Vec<_> = [F32, F16, BF16, F64]
            .into_iter()
            .map(|d| plan_uniform(0.0, 1.0, &x(d)).unwrap().unwrap().entry)
            .collect();
        assert_eq!(names, ["uniform_f32", "uniform_f16", "uniform_bf16", "uniform_f64"]);
        let names: Vec<_> = [F32, F16, BF16, F64]
            .into_iter()
            .map(|d| plan_normal(0.0, 1.0, &x(d)).unwrap().unwrap().entry)
            .collect();
        assert_eq!(names, ["normal_f32", "normal_f16", "normal_bf16", "normal_f64"]);
        for (d, e) in [
            (F32, "bernoulli_b4"),
            (F16, "bernoulli_b2"),
            (BF16, "bernoulli_b2"),
            (F64, "bernoulli_b8"),
            (I64, "bernoulli_b8"),
            (I32, "bernoulli_b4"),
            (I8, "bernoulli_b1"),
            (U8, "bernoulli_b1"),
            (Bool, "bernoulli_b1"),
        ] {
            assert_eq!(plan_bernoulli(0.5, &x(d)).unwrap().unwrap().entry, e);
        }
        for (d, e) in [
            (I64, "uniform_int_b8"),
            (I32, "uniform_int_b4"),
            (I8, "uniform_int_b1"),
            (U8, "uniform_int_b1"),
        ] {
            assert_eq!(plan_uniform_int(0, 3, &x(d)).unwrap().unwrap().entry, e);
        }
    }

    #[test]
    fn uniform_clamps_below_high() {
        let bounds = |d, lo, hi| match plan_uniform(lo, hi, &t(&[2], d)).unwrap().unwrap().params {
            RandomParams::Uniform { lo_c, hi_c, .. } => (lo_c, hi_c),
            p => panic!("{p:?}"),
        };
        assert_eq!(bounds(DataType::F32, 0.0, 1.0), (0.0, 1.0 - 2f64.powi(-24)));
        assert_eq!(bounds(DataType::F16, 0.0, 1.0), (0.0, 1.0 - 2f64.powi(-11)));
        assert_eq!(bounds(DataType::BF16, -1.0, 1.0), (-1.0, 1.0 - 2f64.powi(-8)));
        assert_eq!(bounds(DataType::F64, 0.0, 1.0), (0.0, 1.0 - 2f64.powi(-53)));
        // Bounds between representable values; beyond the format's range.
        assert!(bounds(DataType::F16, 0.1, 0.2).0 >= 0.1);
        assert!(bounds(DataType::F16, 0.1, 0.2).1 < 0.2);
        assert_eq!(bounds(DataType::F16, -1e6, 1e6), (-65504.0, 65504.0));
        assert_eq!(bounds(DataType::F16, -1.0, 0.0).1, -(2f64.powi(-24)));
        assert_eq!(bounds(DataType::F32, -1.0, 0.0), (-1.0, -(2f64.powi(-149))));
        assert_eq!(bounds(DataType::F64, -2.0, 0.0).1, -f64::from_bits(1));
        assert_eq!(bounds(DataType::F16, -1e5, -6e4), (-65504.0, -60032.0));
        // Ranges narrower than the format's spacing hold no value of it: the outputs are
        // the values around the range, rounded to nearest as Burn's reference does.
        assert_eq!(bounds(DataType::F16, 0.99999, 1.0), (1.0 - 2f64.powi(-11), 1.0));
        assert_eq!(bounds(DataType::F16, 1.0001, 1.0002), (1.0, 1.0 + 2f64.powi(-10)));
        assert_eq!(bounds(DataType::BF16, 0.999, 0.9995), (1.0 - 2f64.powi(-8), 1.0));
        assert_eq!(bounds(DataType::F16, 7e4, 8e4), (65504.0, f64::INFINITY));
        // The f32 formula on the largest word stays below high.
        let u = (u32::MAX >> 8) as f32 * 2f32.powi(-24);
        assert!(u.mul_add(1.0, 0.0) < 1.0);
    }

    #[test]
    fn invalid_parameters_name_the_argument() {
        let f = t(&[3], DataType::F32);
        let i = t(&[3], DataType::I32);
        let (op, arg, why) = invalid(plan_uniform(0.0, 1.0, &i));
        assert_eq!((op, arg), ("uniform", "out"));
        assert!(why.contains("I32"), "{why}");
        assert_eq!(invalid(plan_uniform(1.0, 1.0, &f)).1, "high");
        assert_eq!(invalid(plan_uniform(2.0, 1.0, &f)).1, "high");
        assert_eq!(invalid(plan_uniform(f64::NAN, 1.0, &f)).1, "low");
        assert_eq!(invalid(plan_uniform(0.0, f64::INFINITY, &f)).1, "high");
        assert_eq!(invalid(plan_uniform(-3e38, 3e38, &f)).1, "high");
        assert!(plan_uniform(-3e38, 3e38, &t(&[3], DataType::F64)).is_ok());
        assert_eq!(invalid(plan_normal(0.0, 1.0, &i)).1, "out");
        let (_, arg, why) = invalid(plan_normal(0.0, -1.0, &f));
        assert_eq!(arg, "std");
        assert!(why.contains("negative"), "{why}");
        assert_eq!(invalid(plan_normal(f64::NAN, 1.0, &f)).1, "mean");
        assert_eq!(invalid(plan_normal(1e300, 1.0, &f)).1, "mean");
        assert!(plan_normal(0.0, 0.0, &f).is_ok());
        for p in [-0.1, 1.5, f64::NAN] {
            assert_eq!(invalid(plan_bernoulli(p, &f)).1, "p");
        }
        assert_eq!(invalid(plan_uniform_int(0, 3, &f)).1, "out");
        assert_eq!(invalid(plan_uniform_int(0, 3, &t(&[3], DataType::Bool))).1, "out");
        assert_eq!(invalid(plan_uniform_int(3, 3, &i)).1, "high");
        assert_eq!(invalid(plan_uniform_int(-129, 0, &t(&[3], DataType::I8))).1, "low");
        assert_eq!(invalid(plan_uniform_int(-1, 5, &t(&[3], DataType::U8))).1, "low");
        let (_, arg, why) = invalid(plan_uniform_int(0, 257, &t(&[3], DataType::U8)));
        assert_eq!(arg, "high");
        assert!(why.contains("256"), "{why}");
        assert!(plan_uniform_int(0, 256, &t(&[3], DataType::U8)).is_ok());
        assert!(plan_uniform_int(-128, 128, &t(&[3], DataType::I8)).is_ok());
    }

    #[test]
    fn scalar_parameters() {
        let f = t(&[3], DataType::F16);
        let thr = |p| match plan_bernoulli(p, &f).unwrap().unwrap().params {
            RandomParams::Bernoulli { thr, .. } => thr,
            p => panic!("{p:?}"),
        };
        assert_eq!((thr(0.0), thr(0.5), thr(1.0)), (0, 1 << 31, 1 << 32));
        for (d, one) in [
            (DataType::F32, 0x3f80_0000),
            (DataType::F16, 0x3c00),
            (DataType::BF16, 0x3f80),
            (DataType::F64, 0x3ff0_0000_0000_0000),
            (DataType::Bool, 1),
            (DataType::I64, 1),
        ] {
            assert_eq!(one_bits(d), one);
        }
        let int = |lo, hi, d| plan_uniform_int(lo, hi, &t(&[3], d)).unwrap().unwrap().params;
        assert_eq!(
            int(-5, 5, DataType::I32),
            RandomParams::Int {
                low: -5,
                range: 10,
                wide: false
            }
        );
        assert_eq!(
            int(0, 1 << 32, DataType::I64),
            RandomParams::Int {
                low: 0,
                range: 1 << 32,
                wide: false
            }
        );
        assert_eq!(
            int(i64::MIN, i64::MAX, DataType::I64),
            RandomParams::Int {
                low: i64::MIN,
                range: u64::MAX,
                wide: true
            }
        );
        let p = plan_uniform(-2.0, 3.0, &t(&[3], DataType::F32)).unwrap().unwrap();
        assert_eq!(
            p.params,
            RandomParams::Uniform {
                low: -2.0,
                range: 5.0,
                lo_c: -2.0,
                hi_c: f32::from_bits(3.0f32.to_bits() - 1) as f64
            }
        );
    }

    #[test]
    fn layouts_and_overlap() {
        let f = DataType::F32;
        // A transposed output keeps both dims (row-major logical order).
        let p = plan_uniform(0.0, 1.0, &ts(&[3, 5], &[1, 3], f)).unwrap().unwrap();
        assert_eq!((p.n, p.layout.rank, &p.layout.strides[..2]), (15, 2, &[1i64, 3][..]));
        // Packed dims merge.
        let p = plan_normal(0.0, 1.0, &t(&[2, 3, 4], f)).unwrap().unwrap();
        assert_eq!((p.layout.rank, p.layout.shape[0]), (1, 24));
        // A scalar is rank 0.
        let p = plan_bernoulli(0.5, &t(&[], DataType::Bool)).unwrap().unwrap();
        assert_eq!((p.layout.rank, p.n), (0, 1));
        // Overlapping, inconsistent and null outputs.
        let (_, arg, why) = invalid(plan_uniform(0.0, 1.0, &ts(&[4, 3], &[0, 1], f)));
        assert_eq!(arg, "out");
        assert!(why.contains("overlap"), "{why}");
        invalid(plan_bernoulli(0.5, &ts(&[2, 3], &[3], f)));
        invalid(plan_uniform_int(0, 2, &ts(&[-1], &[1], DataType::I32)));
        invalid(plan_normal(0.0, 1.0, &TensorRef::fake_packed(&[3], f, 0)));
        // Negative strides are fine.
        assert!(plan_uniform(0.0, 1.0, &ts(&[2, 3], &[-3, 1], f)).unwrap().is_some());
    }

    #[test]
    fn empty_outputs_plan_nothing_but_still_validate() {
        let f = DataType::F32;
        assert!(plan_uniform(0.0, 1.0, &t(&[0, 3], f)).unwrap().is_none());
        assert!(plan_bernoulli(0.5, &TensorRef::fake_packed(&[0], f, 0))
            .unwrap()
            .is_none());
        invalid(plan_uniform(1.0, 0.0, &t(&[0], f)));
        invalid(plan_uniform_int(0, 2, &t(&[0], f)));
    }
}
