//! Property test: random graphs (valid and invalid) through `validate()` never panic, and
//! every graph it accepts is fully inferred, consistent and has a deterministic signature.

use cudnn_backend::graph::{
    packed_strides, ConvAttrs, DataType, Graph, PointwiseMode, ReduceOp, ResampleAttrs, ResampleMode, SignatureContext,
    TensorId,
};
use proptest::prelude::*;

const DTYPES: [DataType; 5] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U8,
];

/// One random build step, interpreted against the graph built so far.
#[derive(Clone, Debug)]
enum Step {
    Input {
        dims: Vec<i64>,
        nhwc: bool,
        dtype: usize,
        align: u32,
        bad_stride: Option<i64>,
    },
    Conv {
        a: usize,
        b: usize,
        pad: i64,
        post: i64,
        stride: i64,
        dil: i64,
    },
    Matmul {
        a: usize,
        b: usize,
    },
    Pointwise {
        mode: usize,
        a: usize,
        b: Option<usize>,
    },
    Reduce {
        a: usize,
        keep: Vec<bool>,
    },
    Pool {
        a: usize,
        window: i64,
        stride: i64,
        pad: i64,
        mode: usize,
    },
    Output {
        a: usize,
        dtype: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            prop::collection::vec(-1i64..9, 1..6),
            any::<bool>(),
            0..DTYPES.len(),
            prop::sample::select(vec![1u32, 2, 3, 4, 8, 16, 32]),
            prop::option::weighted(0.1, -2i64..2)
        )
            .prop_map(|(dims, nhwc, dtype, align, bad_stride)| Step::Input {
                dims,
                nhwc,
                dtype,
                align,
                bad_stride
            }),
        (0usize..8, 0usize..8, 0i64..3, 0i64..3, 0i64..3, 0i64..3).prop_map(|(a, b, pad, post, stride, dil)| {
            Step::Conv {
                a,
                b,
                pad,
                post,
                stride,
                dil,
            }
        }),
        (0usize..8, 0usize..8).prop_map(|(a, b)| Step::Matmul { a, b }),
        (0usize..24, 0usize..8, prop::option::of(0usize..8)).prop_map(|(mode, a, b)| Step::Pointwise { mode, a, b }),
        (0usize..8, prop::collection::vec(any::<bool>(), 1..6)).prop_map(|(a, keep)| Step::Reduce { a, keep }),
        (0usize..8, 0i64..4, 0i64..3, 0i64..3, 0usize..3).prop_map(|(a, window, stride, pad, mode)| Step::Pool {
            a,
            window,
            stride,
            pad,
            mode
        }),
        (0usize..8, 0..DTYPES.len()).prop_map(|(a, dtype)| Step::Output { a, dtype }),
    ]
}

const MODES: [PointwiseMode; 24] = [
    PointwiseMode::Add,
    PointwiseMode::Sub,
    PointwiseMode::Mul,
    PointwiseMode::Div,
    PointwiseMode::Max,
    PointwiseMode::Min,
    PointwiseMode::Exp,
    PointwiseMode::Log,
    PointwiseMode::Sqrt,
    PointwiseMode::Rsqrt,
    PointwiseMode::Neg,
    PointwiseMode::Abs,
    PointwiseMode::Identity,
    PointwiseMode::Relu,
    PointwiseMode::Gelu,
    PointwiseMode::GeluTanh,
    PointwiseMode::Sigmoid,
    PointwiseMode::Tanh,
    PointwiseMode::Elu(1.0),
    PointwiseMode::Swish(1.0),
    PointwiseMode::ReluBwd,
    PointwiseMode::GeluBwd,
    PointwiseMode::SigmoidBwd,
    PointwiseMode::TanhBwd,
];

fn build(steps: &[Step]) -> Graph {
    let mut g = Graph::new();
    let mut ids: Vec<TensorId> = Vec::new();
    let pick = |ids: &[TensorId], i: usize| ids.get(i % ids.len().max(1)).copied();
    for s in steps {
        match s.clone() {
            Step::Input {
                dims,
                nhwc,
                dtype,
                align,
                bad_stride,
            } => {
                let mut order: Vec<usize> = (0..dims.len()).collect();
                if nhwc && dims.len() > 2 {
                    order = std::iter::once(0)
                        .chain(2..dims.len())
                        .chain(std::iter::once(1))
                        .collect();
                }
                let mut strides = packed_strides(&dims, &order);
                if let Some(b) = bad_stride {
                    strides[0] = b;
                }
                let t = g.tensor("in", &dims, &strides, DTYPES[dtype]);
                g.set_alignment(t, align);
                ids.push(t);
            }
            Step::Conv {
                a,
                b,
                pad,
                post,
                stride,
                dil,
            } => {
                if let (Some(x), Some(w)) = (pick(&ids, a), pick(&ids, b)) {
                    let s = g.tensor_info(x).dims.len().saturating_sub(2).max(1);
                    let mut attrs = ConvAttrs::new(&vec![pad; s], &vec![stride; s], &vec![dil; s]);
                    attrs.geometry.post_padding = vec![post; s];
                    ids.push(g.conv_fprop(x, w, attrs));
                }
            }
            Step::Matmul { a, b } => {
                if let (Some(x), Some(y)) = (pick(&ids, a), pick(&ids, b)) {
                    ids.push(g.matmul(x, y));
                }
            }
            Step::Pointwise { mode, a, b } => {
                if let Some(x) = pick(&ids, a) {
                    let y = b.and_then(|b| pick(&ids, b));
                    ids.push(g.pointwise(MODES[mode], x, y));
                }
            }
            Step::Reduce { a, keep } => {
                if let Some(x) = pick(&ids, a) {
                    let dims = g.tensor_info(x).dims.clone();
                    let out: Vec<i64> = dims
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| if *keep.get(i).unwrap_or(&true) { d } else { 1 })
                        .collect();
                    ids.push(g.reduction(ReduceOp::Sum, x, &out));
                }
            }
            Step::Pool {
                a,
                window,
                stride,
                pad,
                mode,
            } => {
                if let Some(x) = pick(&ids, a) {
                    let s = g.tensor_info(x).dims.len().saturating_sub(2).max(1);
                    let attrs = ResampleAttrs {
                        mode: [
                            ResampleMode::MaxPool,
                            ResampleMode::AvgPoolIncludePadding,
                            ResampleMode::AvgPoolExcludePadding,
                        ][mode],
                        window: vec![window; s],
                        stride: vec![stride; s],
                        pre_padding: vec![pad; s],
                        post_padding: vec![pad; s],
                    };
                    ids.push(g.resample_fwd(x, attrs, false).0);
                }
            }
            Step::Output { a, dtype } => {
                if let Some(x) = pick(&ids, a) {
                    if g.tensor_info(x).is_virtual {
                        g.set_output(x, DTYPES[dtype]);
                    }
                }
            }
        }
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn validate_never_panics_and_accepted_graphs_are_consistent(steps in prop::collection::vec(step(), 1..12)) {
        let mut g = build(&steps);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.validate()));
        let result = result.map_err(|_| TestCaseError::fail("validate() panicked"))?;
        if result.is_ok() {
            prop_assert!(g.is_validated());
            for t in g.tensors() {
                prop_assert!(!t.dims.is_empty() && t.dims.len() == t.strides.len(), "tensor {} not inferred", t.name);
                prop_assert!(t.dims.iter().all(|&d| d >= 1), "tensor {} has dims {:?}", t.name, t.dims);
                prop_assert!(t.strides.iter().all(|&s| s >= 1), "tensor {} has strides {:?}", t.name, t.strides);
                prop_assert!(t.dtype.is_some());
            }
            let ctx = SignatureContext::default();
            let a = g.signature_bytes(&ctx);
            let mut again = build(&steps);
            again.validate().map_err(|e| TestCaseError::fail(format!("second validation failed: {e}")))?;
            prop_assert_eq!(a, again.signature_bytes(&ctx), "signature not deterministic");
            // Re-validation is idempotent.
            prop_assert!(g.validate().is_ok());
        }
    }
}
