//! Bad input to the Burn backend `cudnn_backend::burn::Cudnn`, both through the `Backend`
//! traits directly (no Burn-level checks) and through `burn::tensor::Tensor`: mismatched
//! shapes, mixed dtypes, zero-sized dims, sizes that overflow, flipped and transposed views,
//! views starting at an unaligned address, and a device that does not exist.
//!
//! Every case must either panic with a message naming the op or the argument (the backend
//! panics with `cudnn-backend: <op>: ...`, Burn's checks with their own messages) or give the
//! right result (empty results for zero-sized dims; the CPU reference `burn-ndarray` for
//! views). Never undefined behaviour, an abort or a hang. Each test prints
//! `burn bad input <group>: N cases, all rejected or handled`.
//!
//! Tests that need a GPU are ignored by default; the size-overflow and missing-device tests
//! run anywhere (they fail before a device is needed).

use std::panic::{catch_unwind, AssertUnwindSafe};

use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData};
use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps, ModuleOps};
use burn_backend::tensor::FloatTensor;
use burn_backend::{read_sync, Backend, BoolDType, FloatDType, IntDType, Shape, Slice};
use cudnn_backend::burn::{Cudnn, CudnnDevice};
use integration_tests::burn_ref::Nd;
use integration_tests::panic_message;

type B = Cudnn;

/// f32 matmuls run on TF32 tensor cores (as PyTorch's `allow_tf32`): relative error ~1e-3.
const MATMUL_TOL: f64 = 2e-3;

fn dev() -> CudnnDevice {
    CudnnDevice::default()
}

/// Counts cases and collects failures; [`Suite::finish`] prints the summary and asserts.
struct Suite {
    group: &'static str,
    cases: usize,
    failures: Vec<String>,
}

impl Suite {
    fn new(group: &'static str) -> Self {
        Self {
            group,
            cases: 0,
            failures: Vec::new(),
        }
    }

    /// `f` must panic with a message containing one of `names` (case-insensitive).
    fn rejects<R>(&mut self, case: &str, names: &[&str], f: impl FnOnce() -> R) {
        self.cases += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(_) => self.failures.push(format!("{case}: returned instead of panicking")),
            Err(p) => {
                let msg = panic_message(&*p);
                let lower = msg.to_lowercase();
                if !names.iter().any(|n| lower.contains(&n.to_lowercase())) {
                    self.failures
                        .push(format!("{case}: the panic names none of {names:?}: {msg}"));
                }
            }
        }
    }

    /// `f` must return `Ok` without panicking.
    fn handles(&mut self, case: &str, f: impl FnOnce() -> Result<(), String>) {
        self.cases += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => self.failures.push(format!("{case}: {why}")),
            Err(p) => self.failures.push(format!("{case}: panicked: {}", panic_message(&*p))),
        }
    }

    /// Either a panic naming one of `names`, or `f` returns `Ok`.
    fn rejects_or_handles(&mut self, case: &str, names: &[&str], f: impl FnOnce() -> Result<(), String>) {
        self.cases += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => self.failures.push(format!("{case}: ran but {why}")),
            Err(p) => {
                let msg = panic_message(&*p);
                let lower = msg.to_lowercase();
                if !names.iter().any(|n| lower.contains(&n.to_lowercase())) {
                    self.failures
                        .push(format!("{case}: the panic names none of {names:?}: {msg}"));
                }
            }
        }
    }

    fn finish(self) {
        if self.failures.is_empty() {
            println!(
                "burn bad input {}: {} cases, all rejected or handled",
                self.group, self.cases
            );
        }
        assert!(
            self.failures.is_empty(),
            "burn bad input {}: {} of {} cases failed:\n{}",
            self.group,
            self.failures.len(),
            self.cases,
            self.failures.join("\n")
        );
    }
}

/// Deterministic values in [-1, 1).
fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503));
            ((h >> 8) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// A float tensor of the backend from values and a shape.
fn ft(v: Vec<f32>, shape: &[usize]) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(v, shape.to_vec()), &dev())
}

/// `ft` then a cast to `dtype`.
fn ft_as(v: Vec<f32>, shape: &[usize], dtype: FloatDType) -> FloatTensor<B> {
    B::float_cast(ft(v, shape), dtype)
}

/// Reads a float tensor back: (shape, values as f32).
fn read(t: FloatTensor<B>) -> (Vec<usize>, Vec<f32>) {
    let d = read_sync(B::float_into_data(t)).expect("read back");
    let shape = d.shape.to_vec();
    let v = d.convert::<f32>().to_vec::<f32>().expect("f32 values");
    (shape, v)
}

/// Checks shape and values (relative L2 error within `tol`).
fn check(what: &str, got: (Vec<usize>, Vec<f32>), shape: &[usize], want: &[f32], tol: f64) -> Result<(), String> {
    if got.0 != shape {
        return Err(format!("{what}: shape {:?}, expected {shape:?}", got.0));
    }
    if got.1.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.1.len(), want.len()));
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.1.iter().zip(want) {
        if !g.is_finite() {
            return Err(format!("{what}: non-finite value {g}"));
        }
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let err = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
    if err > tol {
        return Err(format!("{what}: relative L2 error {err:.2e} > {tol:.0e}"));
    }
    Ok(())
}

/// Values of a Burn tensor on any backend as f32.
fn tvals<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> (Vec<usize>, Vec<f32>) {
    let d = t.into_data();
    (
        d.shape.to_vec(),
        d.convert::<f32>().to_vec::<f32>().expect("f32 values"),
    )
}

/// conv2d on the CPU reference backend.
fn conv_ref(x: &[f32], xs: [usize; 4], w: &[f32], ws: [usize; 4], o: ConvOptions<2>) -> (Vec<usize>, Vec<f32>) {
    let d = Default::default();
    let x = Tensor::<Nd, 4>::from_data(TensorData::new(x.to_vec(), xs), &d);
    let w = Tensor::<Nd, 4>::from_data(TensorData::new(w.to_vec(), ws), &d);
    tvals(conv2d(x, w, None, o))
}

/// matmul on the CPU reference backend.
fn matmul_ref(a: &[f32], as_: [usize; 2], b: &[f32], bs: [usize; 2]) -> (Vec<usize>, Vec<f32>) {
    let d = Default::default();
    let a = Tensor::<Nd, 2>::from_data(TensorData::new(a.to_vec(), as_), &d);
    let b = Tensor::<Nd, 2>::from_data(TensorData::new(b.to_vec(), bs), &d);
    tvals(a.matmul(b))
}

fn opts(padding: usize) -> ConvOptions<2> {
    ConvOptions::new([1, 1], [padding, padding], [1, 1], 1)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mismatched_shapes_panic_naming_the_op() {
    let mut s = Suite::new("shapes");
    // Direct trait calls: the backend's own checks.
    s.rejects("float_add [2,3]+[4,5]", &["float_add"], || {
        B::float_add(ft(vals(6, 1), &[2, 3]), ft(vals(20, 2), &[4, 5]))
    });
    s.rejects("float_matmul [2,3]x[4,5]", &["float_matmul"], || {
        B::float_matmul(ft(vals(6, 1), &[2, 3]), ft(vals(20, 2), &[4, 5]))
    });
    s.rejects("float_matmul rank 1", &["float_matmul"], || {
        B::float_matmul(ft(vals(3, 1), &[3]), ft(vals(3, 2), &[3]))
    });
    s.rejects("conv2d 3 channels, filter for 2", &["conv2d", "conv"], || {
        B::conv2d(
            ft(vals(75, 1), &[1, 3, 5, 5]),
            ft(vals(72, 2), &[4, 2, 3, 3]),
            None,
            opts(0),
        )
    });
    s.rejects("conv2d filter larger than input", &["conv2d", "conv"], || {
        B::conv2d(
            ft(vals(12, 1), &[1, 3, 2, 2]),
            ft(vals(108, 2), &[4, 3, 3, 3]),
            None,
            opts(0),
        )
    });
    s.rejects("conv2d bias of 3 for 4 filters", &["conv2d", "conv", "bias"], || {
        let bias = ft(vals(3, 3), &[3]);
        B::conv2d(
            ft(vals(75, 1), &[1, 3, 5, 5]),
            ft(vals(108, 2), &[4, 3, 3, 3]),
            Some(bias),
            opts(0),
        )
    });
    s.rejects("float_cat [2,3] with [2,4] on dim 0", &["float_cat"], || {
        B::float_cat(vec![ft(vals(6, 1), &[2, 3]), ft(vals(8, 2), &[2, 4])], 0)
    });
    s.rejects("float_cat dim out of range", &["float_cat"], || {
        B::float_cat(vec![ft(vals(6, 1), &[2, 3]), ft(vals(6, 2), &[2, 3])], 5)
    });
    s.rejects(
        "float_reshape 6 elements to [4,2]",
        &["reshape", "float_reshape"],
        || B::float_reshape(ft(vals(6, 1), &[2, 3]), Shape::from(vec![4, 2])),
    );
    // Burn's slices clamp like Python's: rows 2..9 of 4 rows are rows 2..4.
    s.handles("float_slice past the end clamps", || {
        let y = B::float_slice(ft(vals(20, 1), &[4, 5]), &[Slice::new(2, Some(9), 1)]);
        let (dims, got) = read(y);
        let want: Vec<f32> = vals(20, 1)[10..].to_vec();
        if dims != [2, 5] || got != want {
            return Err(format!("got dims {dims:?} values {got:?}, want [2, 5] {want:?}"));
        }
        Ok(())
    });
    // Through `Tensor`: Burn's checks (or ours) name the op.
    let t = |v: Vec<f32>, shape: [usize; 2]| Tensor::<B, 2>::from_data(TensorData::new(v, shape), &dev());
    s.rejects("Tensor add [2,3]+[4,5]", &["add"], || {
        t(vals(6, 1), [2, 3]) + t(vals(20, 2), [4, 5])
    });
    s.rejects("Tensor matmul [2,3]x[4,5]", &["matmul"], || {
        t(vals(6, 1), [2, 3]).matmul(t(vals(20, 2), [4, 5]))
    });
    s.rejects("Tensor conv2d channel mismatch", &["conv2d", "conv"], || {
        let x = Tensor::<B, 4>::from_data(TensorData::new(vals(75, 1), [1, 3, 5, 5]), &dev());
        let w = Tensor::<B, 4>::from_data(TensorData::new(vals(72, 2), [4, 2, 3, 3]), &dev());
        conv2d(x, w, None, opts(0))
    });
    s.rejects("Tensor cat [2,3] with [2,4] on dim 0", &["cat"], || {
        Tensor::cat(vec![t(vals(6, 1), [2, 3]), t(vals(8, 2), [2, 4])], 0)
    });
    // The backend still works afterwards.
    s.handles("float_add after the rejections", || {
        let a = vals(6, 1);
        let sum: Vec<f32> = a.iter().map(|v| v * 2.0).collect();
        check(
            "a+a",
            read(B::float_add(ft(a.clone(), &[2, 3]), ft(a, &[2, 3]))),
            &[2, 3],
            &sum,
            1e-6,
        )
    });
    s.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mixed_dtypes_panic_naming_the_op_or_promote_correctly() {
    let mut s = Suite::new("dtypes");
    let (a, b) = (vals(4, 1), vals(4, 2));
    s.rejects("float_add f16 + f32", &["float_add"], || {
        B::float_add(ft_as(a.clone(), &[2, 2], FloatDType::F16), ft(b.clone(), &[2, 2]))
    });
    s.rejects("float_matmul bf16 x f32", &["float_matmul"], || {
        B::float_matmul(ft_as(a.clone(), &[2, 2], FloatDType::BF16), ft(b.clone(), &[2, 2]))
    });
    s.rejects(
        "conv2d f16 input, f32 filter",
        &["conv2d", "conv", "dtype", "data type"],
        || {
            B::conv2d(
                ft_as(vals(75, 1), &[1, 3, 5, 5], FloatDType::F16),
                ft(vals(108, 2), &[4, 3, 3, 3]),
                None,
                opts(0),
            )
        },
    );
    s.rejects("float_cat f16 with f32", &["float_cat"], || {
        B::float_cat(
            vec![ft_as(a.clone(), &[2, 2], FloatDType::F16), ft(b.clone(), &[2, 2])],
            0,
        )
    });
    // Through `Tensor`: Burn may promote; then the result must be right.
    s.rejects_or_handles("Tensor f16 + f32", &["add", "dtype", "data type"], || {
        let x = Tensor::<B, 2>::from_data(TensorData::new(a.clone(), [2, 2]), &dev()).cast(FloatDType::F16);
        let y = Tensor::<B, 2>::from_data(TensorData::new(b.clone(), [2, 2]), &dev());
        let want: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| half::f16::from_f32(p).to_f32() + q)
            .collect();
        check("f16+f32", tvals(x + y), &[2, 2], &want, 1e-3)
    });
    s.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn zero_sized_dims_give_empty_or_zero_results() {
    let mut s = Suite::new("zero-sized");
    s.handles("float_sum_dim over an empty dim", || {
        check(
            "sum_dim",
            read(B::float_sum_dim(ft(vec![], &[3, 0]), 1)),
            &[3, 1],
            &[0.0; 3],
            0.0,
        )
    });
    s.handles("float_sum of an empty tensor", || {
        check("sum", read(B::float_sum(ft(vec![], &[0, 4]))), &[1], &[0.0], 0.0)
    });
    s.handles("float_matmul with k = 0", || {
        check(
            "matmul k=0",
            read(B::float_matmul(ft(vec![], &[2, 0]), ft(vec![], &[0, 3]))),
            &[2, 3],
            &[0.0; 6],
            0.0,
        )
    });
    s.handles("float_matmul with m = 0", || {
        check(
            "matmul m=0",
            read(B::float_matmul(ft(vec![], &[0, 4]), ft(vals(12, 1), &[4, 3]))),
            &[0, 3],
            &[],
            0.0,
        )
    });
    s.handles("float_matmul f16 with k = 0", || {
        let a = ft_as(vec![], &[3, 0], FloatDType::F16);
        let b = ft_as(vec![], &[0, 2], FloatDType::F16);
        check("matmul f16 k=0", read(B::float_matmul(a, b)), &[3, 2], &[0.0; 6], 0.0)
    });
    s.handles("conv2d with batch 0", || {
        let y = B::conv2d(
            ft(vec![], &[0, 3, 5, 5]),
            ft(vals(108, 2), &[4, 3, 3, 3]),
            None,
            opts(0),
        );
        check("conv batch 0", read(y), &[0, 4, 3, 3], &[], 0.0)
    });
    s.handles("conv2d with 0 input channels", || {
        let y = B::conv2d(ft(vec![], &[1, 0, 5, 5]), ft(vec![], &[2, 0, 3, 3]), None, opts(1));
        check("conv 0 channels", read(y), &[1, 2, 5, 5], &[0.0; 50], 0.0)
    });
    s.handles("float_cat with an empty part (dim 1)", || {
        let b = vals(6, 4);
        let y = B::float_cat(
            vec![ft(vec![], &[2, 0]), ft(b.clone(), &[2, 3]), ft(vec![], &[2, 0])],
            1,
        );
        check("cat", read(y), &[2, 3], &b, 0.0)
    });
    s.handles("float_cat of empty parts only", || {
        let y = B::float_cat(vec![ft(vec![], &[0, 3]), ft(vec![], &[0, 3])], 0);
        check("cat empty", read(y), &[0, 3], &[], 0.0)
    });
    s.handles("float_slice to an empty range", || {
        let y = B::float_slice(ft(vals(20, 1), &[4, 5]), &[Slice::new(2, Some(2), 1)]);
        check("slice", read(y), &[0, 5], &[], 0.0)
    });
    s.handles("elementwise ops on empty tensors", || {
        let y = B::float_exp(B::float_add(ft(vec![], &[0, 3]), ft(vec![], &[0, 3])));
        check("exp(a+b)", read(y), &[0, 3], &[], 0.0)
    });
    s.handles("float_zeros / int_zeros / bool_zeros of size 0", || {
        let f = B::float_zeros(Shape::from(vec![4, 0, 2]), &dev(), FloatDType::F32);
        check("float_zeros", read(f), &[4, 0, 2], &[], 0.0)?;
        let i = read_sync(B::int_into_data(B::int_zeros(
            Shape::from(vec![0]),
            &dev(),
            IntDType::I64,
        )))
        .map_err(|e| e.to_string())?;
        let b = read_sync(B::bool_into_data(B::bool_zeros(
            Shape::from(vec![3, 0]),
            &dev(),
            BoolDType::Native,
        )))
        .map_err(|e| e.to_string())?;
        if i.num_elements() != 0 || b.num_elements() != 0 {
            return Err("int/bool zeros of size 0 hold elements".into());
        }
        Ok(())
    });
    // Through `Tensor`.
    s.handles("Tensor sum_dim / matmul / conv2d / cat / slice with empty dims", || {
        let d = dev();
        let e = Tensor::<B, 2>::empty([3, 0], &d);
        check("sum_dim", tvals(e.clone().sum_dim(1)), &[3, 1], &[0.0; 3], 0.0)?;
        let k0 = Tensor::<B, 2>::zeros([2, 0], &d).matmul(Tensor::<B, 2>::zeros([0, 3], &d));
        check("matmul", tvals(k0), &[2, 3], &[0.0; 6], 0.0)?;
        let x = Tensor::<B, 4>::zeros([0, 3, 5, 5], &d);
        let w = Tensor::<B, 4>::from_data(TensorData::new(vals(108, 2), [4, 3, 3, 3]), &d);
        check("conv2d", tvals(conv2d(x, w, None, opts(1))), &[0, 4, 5, 5], &[], 0.0)?;
        let b = vals(6, 4);
        let full = Tensor::<B, 2>::from_data(TensorData::new(b.clone(), [2, 3]), &d);
        let cat = Tensor::cat(vec![Tensor::<B, 2>::zeros([0, 3], &d), full.clone()], 0);
        check("cat", tvals(cat), &[2, 3], &b, 0.0)?;
        check("slice", tvals(full.slice([1..1, 0..3])), &[0, 3], &[], 0.0)
    });
    s.finish();
}

/// Shapes whose element count or byte size overflows: a panic naming the op, before any
/// device is touched (so this runs without a GPU too).
#[test]
fn overflowing_sizes_panic_naming_the_op() {
    let mut s = Suite::new("overflow");
    let huge = || Shape::from(vec![1usize << 40, 1 << 40]);
    s.rejects("float_empty [2^40, 2^40]", &["float_empty"], || {
        B::float_empty(huge(), &dev(), FloatDType::F32)
    });
    s.rejects("float_zeros [2^40, 2^40]", &["float_zeros"], || {
        B::float_zeros(huge(), &dev(), FloatDType::F32)
    });
    s.rejects("float_ones [2^40, 2^40] f16", &["float_ones"], || {
        B::float_ones(huge(), &dev(), FloatDType::F16)
    });
    s.rejects("float_full [2^62, 4]", &["float_full"], || {
        B::float_full(
            Shape::from(vec![1usize << 62, 4]),
            burn_backend::Scalar::Float(1.0),
            &dev(),
            FloatDType::F32,
        )
    });
    s.rejects("float_zeros [2^63] (wraps to a negative i64)", &["float_zeros"], || {
        B::float_zeros(Shape::from(vec![1usize << 63]), &dev(), FloatDType::F32)
    });
    s.rejects("int_zeros [2^40, 2^40]", &["int_zeros"], || {
        B::int_zeros(huge(), &dev(), IntDType::I64)
    });
    s.rejects("int_empty [2^40, 2^40]", &["int_empty"], || {
        B::int_empty(huge(), &dev(), IntDType::I32)
    });
    s.rejects("bool_zeros [2^40, 2^40]", &["bool_zeros"], || {
        B::bool_zeros(huge(), &dev(), BoolDType::Native)
    });
    // Burn computes the element count itself first; either check must name the problem.
    s.rejects("Tensor::zeros [2^40, 2^40]", &["zeros", "overflow"], || {
        Tensor::<B, 2>::zeros([1usize << 40, 1 << 40], &dev())
    });
    s.finish();
}

/// Sizes that fit the address space but not the GPU: an out-of-memory panic naming the op.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sizes_beyond_device_memory_panic_naming_the_op() {
    let mut s = Suite::new("too large for the device");
    let big = || Shape::from(vec![1usize << 20, 1 << 20]); // 4 TiB of f32
    s.rejects("float_empty 4 TiB", &["float_empty"], || {
        B::float_empty(big(), &dev(), FloatDType::F32)
    });
    s.rejects("float_zeros 4 TiB", &["float_zeros"], || {
        B::float_zeros(big(), &dev(), FloatDType::F32)
    });
    s.rejects("Tensor::ones 4 TiB", &["ones", "memory"], || {
        Tensor::<B, 2>::ones([1usize << 20, 1 << 20], &dev())
    });
    s.handles("an allocation after the failures", || {
        check(
            "zeros",
            read(B::float_zeros(Shape::from(vec![2, 2]), &dev(), FloatDType::F32)),
            &[2, 2],
            &[0.0; 4],
            0.0,
        )
    });
    s.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flipped_and_transposed_views_give_right_results() {
    let mut s = Suite::new("views");
    let (xv, wv) = (vals(2 * 3 * 7 * 6, 1), vals(4 * 3 * 3 * 3, 2));
    let flip_ref = |v: &[f32], shape: [usize; 4], axes: &[isize]| -> Vec<f32> {
        let t = Tensor::<Nd, 4>::from_data(TensorData::new(v.to_vec(), shape), &Default::default());
        let t = match axes {
            [a] => t.flip([*a]),
            [a, b] => t.flip([*a, *b]),
            _ => t,
        };
        tvals(t).1
    };
    // Direct: flip (negative strides) then conv2d.
    for axes in [&[3usize][..], &[2, 3], &[0, 1]] {
        let name = format!("conv2d of x flipped on {axes:?}");
        let iaxes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        let want = conv_ref(
            &flip_ref(&xv, [2, 3, 7, 6], &iaxes),
            [2, 3, 7, 6],
            &wv,
            [4, 3, 3, 3],
            opts(1),
        );
        s.handles(&name, || {
            let x = B::float_flip(ft(xv.clone(), &[2, 3, 7, 6]), axes);
            let y = B::conv2d(x, ft(wv.clone(), &[4, 3, 3, 3]), None, opts(1));
            check(&name, read(y), &want.0, &want.1, 1e-4)
        });
    }
    s.handles("conv2d with a flipped filter", || {
        let want = conv_ref(
            &xv,
            [2, 3, 7, 6],
            &flip_ref(&wv, [4, 3, 3, 3], &[2, 3]),
            [4, 3, 3, 3],
            opts(0),
        );
        let w = B::float_flip(ft(wv.clone(), &[4, 3, 3, 3]), &[2, 3]);
        let y = B::conv2d(ft(xv.clone(), &[2, 3, 7, 6]), w, None, opts(0));
        check("flipped filter", read(y), &want.0, &want.1, 1e-4)
    });
    // Direct: flipped and transposed operands of matmul.
    let (av, bv) = (vals(5 * 7, 3), vals(7 * 4, 4));
    s.handles("matmul of flipped rows x transposed", || {
        let a_ref = Tensor::<Nd, 2>::from_data(TensorData::new(av.clone(), [5, 7]), &Default::default()).flip([0, 1]);
        let b_ref = Tensor::<Nd, 2>::from_data(TensorData::new(bv.clone(), [4, 7]), &Default::default()).transpose();
        let want = tvals(a_ref.matmul(b_ref));
        let a = B::float_flip(ft(av.clone(), &[5, 7]), &[0, 1]);
        let b = B::float_transpose(ft(bv.clone(), &[4, 7]));
        check(
            "flip x transpose",
            read(B::float_matmul(a, b)),
            &want.0,
            &want.1,
            MATMUL_TOL,
        )
    });
    s.handles("matmul of a stepped slice", || {
        // Every other column of a [5, 14] tensor: a stride-2 inner dim.
        let wide = vals(5 * 14, 5);
        let picked: Vec<f32> = (0..5)
            .flat_map(|r| (0..7).map(move |c| (r, c)))
            .map(|(r, c)| wide[r * 14 + 2 * c])
            .collect();
        let want = matmul_ref(&picked, [5, 7], &bv, [7, 4]);
        let a = B::float_slice(ft(wide, &[5, 14]), &[Slice::new(0, None, 1), Slice::new(0, None, 2)]);
        check(
            "stepped",
            read(B::float_matmul(a, ft(bv.clone(), &[7, 4]))),
            &want.0,
            &want.1,
            MATMUL_TOL,
        )
    });
    // Through `Tensor`.
    s.handles("Tensor flip then conv2d and matmul", || {
        let d = dev();
        let x = Tensor::<B, 4>::from_data(TensorData::new(xv.clone(), [2, 3, 7, 6]), &d).flip([3]);
        let w = Tensor::<B, 4>::from_data(TensorData::new(wv.clone(), [4, 3, 3, 3]), &d);
        let want = conv_ref(
            &flip_ref(&xv, [2, 3, 7, 6], &[3]),
            [2, 3, 7, 6],
            &wv,
            [4, 3, 3, 3],
            opts(1),
        );
        check(
            "Tensor conv2d",
            tvals(conv2d(x, w, None, opts(1))),
            &want.0,
            &want.1,
            1e-4,
        )?;
        let a = Tensor::<B, 2>::from_data(TensorData::new(av.clone(), [5, 7]), &d).flip([1]);
        let b = Tensor::<B, 2>::from_data(TensorData::new(bv.clone(), [7, 4]), &d).flip([0]);
        let a_ref = Tensor::<Nd, 2>::from_data(TensorData::new(av.clone(), [5, 7]), &Default::default()).flip([1]);
        let b_ref = Tensor::<Nd, 2>::from_data(TensorData::new(bv.clone(), [7, 4]), &Default::default()).flip([0]);
        let want = tvals(a_ref.matmul(b_ref));
        check("Tensor matmul", tvals(a.matmul(b)), &want.0, &want.1, MATMUL_TOL)
    });
    s.finish();
}

/// f16 values rounded as the GPU stores them.
fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn views_at_unaligned_addresses_give_right_results() {
    let mut s = Suite::new("unaligned");
    // A view that starts one f16 element (2 bytes) into its buffer: cuDNN wants 16-byte
    // aligned operands, so the backend must copy, declare the alignment, or use a kernel.
    let unaligned = |v: &[f32], shape: &[usize]| -> FloatTensor<B> {
        let n: usize = shape.iter().product();
        let mut padded = vec![0.5f32];
        padded.extend_from_slice(&v[..n]);
        let flat = ft_as(padded, &[n + 1], FloatDType::F16);
        let view = B::float_slice(flat, &[Slice::new(1, None, 1)]);
        B::float_reshape(view, Shape::from(shape.to_vec()))
    };
    let (xv, wv) = (f16_round(&vals(2 * 4 * 6 * 6, 1)), f16_round(&vals(5 * 4 * 3 * 3, 2)));
    s.handles("conv2d of an f16 input at offset 1", || {
        let want = conv_ref(&xv, [2, 4, 6, 6], &wv, [5, 4, 3, 3], opts(1));
        let w = ft_as(wv.clone(), &[5, 4, 3, 3], FloatDType::F16);
        let y = B::conv2d(unaligned(&xv, &[2, 4, 6, 6]), w, None, opts(1));
        check("conv x+1", read(y), &want.0, &want.1, 1e-2)
    });
    s.handles("conv2d of an f16 filter at offset 1", || {
        let want = conv_ref(&xv, [2, 4, 6, 6], &wv, [5, 4, 3, 3], opts(0));
        let x = ft_as(xv.clone(), &[2, 4, 6, 6], FloatDType::F16);
        let y = B::conv2d(x, unaligned(&wv, &[5, 4, 3, 3]), None, opts(0));
        check("conv w+1", read(y), &want.0, &want.1, 1e-2)
    });
    let (av, bv) = (f16_round(&vals(9 * 16, 3)), f16_round(&vals(16 * 8, 4)));
    s.handles("matmul of f16 operands at offset 1", || {
        let want = matmul_ref(&av, [9, 16], &bv, [16, 8]);
        let y = B::float_matmul(unaligned(&av, &[9, 16]), unaligned(&bv, &[16, 8]));
        check("matmul +1", read(y), &want.0, &want.1, 1e-2)
    });
    s.handles("Tensor slice at offset 1 then conv2d and matmul", || {
        let d = dev();
        let mut padded = vec![0.25f32];
        padded.extend_from_slice(&av);
        let flat = Tensor::<B, 1>::from_data(TensorData::new(padded, [av.len() + 1]), &d).cast(FloatDType::F16);
        let a = flat.slice(1..av.len() + 1).reshape([9, 16]);
        let b = Tensor::<B, 2>::from_data(TensorData::new(bv.clone(), [16, 8]), &d).cast(FloatDType::F16);
        let want = matmul_ref(&av, [9, 16], &bv, [16, 8]);
        check("Tensor matmul +1", tvals(a.matmul(b)), &want.0, &want.1, 1e-2)?;
        let mut padded = vec![0.25f32];
        padded.extend_from_slice(&xv);
        let flat = Tensor::<B, 1>::from_data(TensorData::new(padded, [xv.len() + 1]), &d).cast(FloatDType::F16);
        let x = flat.slice(1..xv.len() + 1).reshape([2, 4, 6, 6]);
        let w = Tensor::<B, 4>::from_data(TensorData::new(wv.clone(), [5, 4, 3, 3]), &d).cast(FloatDType::F16);
        let want = conv_ref(&xv, [2, 4, 6, 6], &wv, [5, 4, 3, 3], opts(1));
        check(
            "Tensor conv2d +1",
            tvals(conv2d(x, w, None, opts(1))),
            &want.0,
            &want.1,
            1e-2,
        )
    });
    s.finish();
}

/// A device ordinal no machine running this has.
fn missing_ordinal() -> usize {
    cudnn_backend::runtime::device_count().unwrap_or(0).max(7)
}

/// A device that does not exist: `try_open` returns an error and ops panic naming the
/// device. Runs anywhere.
#[test]
fn a_missing_device_is_an_error_or_a_panic_naming_it() {
    let mut s = Suite::new("missing device");
    let n = missing_ordinal();
    let missing = CudnnDevice::new(n);
    s.handles("try_open of a missing ordinal", || match missing.try_open() {
        Ok(_) => Err(format!("device {n} opened")),
        Err(e) if e.to_string().trim().is_empty() => Err("empty error".into()),
        Err(_) => Ok(()),
    });
    let name = format!("device {n}");
    s.rejects("float_zeros on a missing device", &[&name], || {
        B::float_zeros(Shape::from(vec![2, 2]), &missing, FloatDType::F32)
    });
    s.rejects("float_from_data on a missing device", &[&name], || {
        B::float_from_data(TensorData::new(vec![1f32, 2.0], [2]), &missing)
    });
    s.rejects("Tensor::ones on a missing device", &[&name], || {
        Tensor::<B, 2>::ones([2, 2], &missing)
    });
    s.handles("sync on a missing device", || match B::sync(&missing) {
        Ok(()) => Err("sync succeeded".into()),
        Err(_) => Ok(()),
    });
    s.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moving_to_a_missing_device_panics_naming_it() {
    let mut s = Suite::new("to missing device");
    let n = missing_ordinal();
    let name = format!("device {n}");
    s.rejects("float_to_device to a missing ordinal", &[&name], || {
        B::float_to_device(ft(vals(4, 1), &[2, 2]), &CudnnDevice::new(n))
    });
    s.handles("the tensor's own device still works", || {
        check(
            "zeros",
            read(B::float_zeros(Shape::from(vec![3]), &dev(), FloatDType::F32)),
            &[3],
            &[0.0; 3],
            0.0,
        )
    });
    s.finish();
}
