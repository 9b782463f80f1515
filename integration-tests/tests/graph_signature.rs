//! CPU tests of `Graph::signature_bytes` (the plan-cache key) and `EnginePolicy::signature_bits`.

use std::collections::HashMap;
use std::thread;

use cudnn_backend::graph::{
    conv_output_size, ConvAttrs, ConvMode, DataType, Graph, PointwiseMode, ReduceOp, ResampleAttrs, ResampleMode,
    Scalar, SignatureContext,
};
use cudnn_backend::plan::policy::{EnginePolicy, HeuristicMode};

use DataType::{BF16, F16, F32, F64, I8};

/// Every knob of the test graph
/// `x, w -> conv -> +bias -> act -> *scale -> {reduction | pool}`.
#[derive(Clone, Debug)]
struct Spec {
    x_dims: [i64; 4],
    x_nhwc: bool,
    dtype: DataType,
    out_dtype: DataType,
    x_alignment: u32,
    conv_is_output: bool,
    conv: ConvAttrs,
    compute_type: DataType,
    intermediate_type: DataType,
    act: PointwiseMode,
    scale: Scalar,
    reduce: ReduceOp,
    reduce_as_pool: bool,
    pool: ResampleAttrs,
    with_index: bool,
    pool_first: bool,
    ctx: SignatureContext,
}

fn base() -> Spec {
    Spec {
        x_dims: [2, 3, 8, 8],
        x_nhwc: false,
        dtype: F16,
        out_dtype: F16,
        x_alignment: 16,
        conv_is_output: false,
        conv: ConvAttrs::new(&[1, 1], &[1, 1], &[1, 1]),
        compute_type: F32,
        intermediate_type: F32,
        act: PointwiseMode::Relu,
        scale: Scalar::F32(2.0),
        reduce: ReduceOp::Sum,
        reduce_as_pool: false,
        pool: ResampleAttrs {
            mode: ResampleMode::MaxPool,
            window: vec![2, 2],
            stride: vec![2, 2],
            pre_padding: vec![0, 0],
            post_padding: vec![0, 0],
        },
        with_index: false,
        pool_first: false,
        ctx: SignatureContext {
            compute_capability: (9, 0),
            cudnn_version: 91400,
            policy: 0,
        },
    }
}

fn nchw(d: &[i64; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

fn nhwc(d: &[i64; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]]
}

const K: i64 = 4;

/// Builds the graph of `s` (validated when `validate`, else as built).
fn build(s: &Spec, validate: bool, case: &str) -> Graph {
    let mut g = Graph::new();
    g.compute_type = s.compute_type;
    g.intermediate_type = s.intermediate_type;
    let xs = if s.x_nhwc { nhwc(&s.x_dims) } else { nchw(&s.x_dims) };
    let x = g.tensor("x", &s.x_dims, &xs, s.dtype);
    g.set_alignment(x, s.x_alignment);
    let w = g.tensor("w", &[K, 3, 3, 3], &nchw(&[K, 3, 3, 3]), s.dtype);
    let bias = g.tensor("bias", &[1, K, 1, 1], &[K, 1, 1, 1], s.dtype);
    let scale = g.scalar("scale", s.scale, 4);
    let c = g.conv_fprop(x, w, s.conv.clone());
    if s.conv_is_output {
        g.set_output(c, s.out_dtype);
    }
    let b = g.bias_add(c, bias);
    let a = g.pointwise(s.act, b, None);
    let y = g.pointwise(PointwiseMode::Mul, a, Some(scale));
    g.set_output(y, s.out_dtype);

    let spatial: Vec<i64> = (0..2)
        .map(|i| {
            let cv = &s.conv.geometry;
            conv_output_size(
                s.x_dims[i + 2],
                3,
                cv.pre_padding[i],
                cv.post_padding[i],
                cv.stride[i],
                cv.dilation[i],
            )
            .unwrap_or_else(|| panic!("{case}: conv does not fit"))
        })
        .collect();
    let reduce = |g: &mut Graph| {
        let r = if s.reduce_as_pool {
            let global = ResampleAttrs {
                mode: ResampleMode::AvgPoolIncludePadding,
                window: spatial.clone(),
                stride: vec![1, 1],
                pre_padding: vec![0, 0],
                post_padding: vec![0, 0],
            };
            g.resample_fwd(y, global, false).0
        } else {
            g.reduction(s.reduce, y, &[s.x_dims[0], K, 1, 1])
        };
        g.set_output(r, F32);
    };
    let pool = |g: &mut Graph| {
        let (p, idx) = g.resample_fwd(y, s.pool.clone(), s.with_index);
        g.set_output(p, s.out_dtype);
        if let Some(i) = idx {
            g.set_output(i, I8);
        }
    };
    if s.pool_first {
        pool(&mut g);
        reduce(&mut g);
    } else {
        reduce(&mut g);
        pool(&mut g);
    }
    if validate {
        if let Err(e) = g.validate() {
            panic!("{case}: the test graph must be valid: {e}");
        }
    }
    g
}

fn sig(s: &Spec, validate: bool, case: &str) -> Vec<u8> {
    build(s, validate, case).signature_bytes(&s.ctx)
}

type Mutation = (&'static str, fn(&mut Spec));

/// Single-field changes of `base()`; every one gives a different (valid) graph or context.
fn mutations() -> Vec<Mutation> {
    vec![
        ("x N", |s| s.x_dims[0] = 3),
        ("x C (grouped)", |s| s.x_dims[1] = 6),
        ("x H", |s| s.x_dims[2] = 9),
        ("x W", |s| s.x_dims[3] = 10),
        ("x strides NHWC", |s| s.x_nhwc = true),
        ("input dtype bf16", |s| s.dtype = BF16),
        ("output dtype f32", |s| s.out_dtype = F32),
        ("alignment 8", |s| s.x_alignment = 8),
        ("alignment 4", |s| s.x_alignment = 4),
        ("alignment 2", |s| s.x_alignment = 2),
        ("conv output not virtual", |s| s.conv_is_output = true),
        ("padding 0", |s| {
            s.conv.geometry.pre_padding = vec![0, 0];
            s.conv.geometry.post_padding = vec![0, 0];
        }),
        ("padding pre 2 post 0", |s| {
            s.conv.geometry.pre_padding = vec![2, 2];
            s.conv.geometry.post_padding = vec![0, 0];
        }),
        ("padding pre 0 post 2", |s| {
            s.conv.geometry.pre_padding = vec![0, 0];
            s.conv.geometry.post_padding = vec![2, 2];
        }),
        ("padding H only pre", |s| {
            s.conv.geometry.pre_padding = vec![2, 1];
            s.conv.geometry.post_padding = vec![0, 1];
        }),
        ("conv stride 2", |s| s.conv.geometry.stride = vec![2, 2]),
        ("conv stride W 2", |s| s.conv.geometry.stride = vec![1, 2]),
        ("dilation 2", |s| s.conv.geometry.dilation = vec![2, 2]),
        ("conv mode convolution", |s| s.conv.mode = ConvMode::Convolution),
        ("conv compute f16", |s| s.conv.compute = Some(F16)),
        ("graph compute type f16", |s| s.compute_type = F16),
        ("intermediate type f16", |s| s.intermediate_type = F16),
        ("act gelu", |s| s.act = PointwiseMode::Gelu),
        ("act tanh", |s| s.act = PointwiseMode::Tanh),
        ("act elu 1.0", |s| s.act = PointwiseMode::Elu(1.0)),
        ("act elu 0.5", |s| s.act = PointwiseMode::Elu(0.5)),
        ("act swish 1.0", |s| s.act = PointwiseMode::Swish(1.0)),
        ("act swish 1.702", |s| s.act = PointwiseMode::Swish(1.702)),
        ("scalar dtype f64", |s| s.scale = Scalar::F64(2.0)),
        ("reduce max", |s| s.reduce = ReduceOp::Max),
        ("reduce min", |s| s.reduce = ReduceOp::Min),
        ("reduce mean", |s| s.reduce = ReduceOp::Mean),
        ("reduction replaced by global avg pool", |s| s.reduce_as_pool = true),
        ("pool avg incl", |s| s.pool.mode = ResampleMode::AvgPoolIncludePadding),
        ("pool avg excl", |s| s.pool.mode = ResampleMode::AvgPoolExcludePadding),
        ("pool window 3", |s| s.pool.window = vec![3, 3]),
        ("pool window W 3", |s| s.pool.window = vec![2, 3]),
        ("pool stride 1", |s| s.pool.stride = vec![1, 1]),
        ("pool padding 1", |s| {
            s.pool.pre_padding = vec![1, 1];
            s.pool.post_padding = vec![1, 1];
        }),
        ("pool padding pre only", |s| s.pool.pre_padding = vec![1, 1]),
        ("pool padding post only", |s| s.pool.post_padding = vec![1, 1]),
        ("pool with index", |s| s.with_index = true),
        ("node order", |s| s.pool_first = true),
        ("compute capability 8.0", |s| s.ctx.compute_capability = (8, 0)),
        ("compute capability 9.1", |s| s.ctx.compute_capability = (9, 1)),
        ("cuDNN version", |s| s.ctx.cudnn_version = 91300),
        ("policy bit 0", |s| s.ctx.policy = 1),
        ("policy bit 8", |s| s.ctx.policy = 1 << 8),
    ]
}

#[test]
fn equal_graphs_give_equal_bytes() {
    for validate in [false, true] {
        let s = base();
        let (a, b) = (sig(&s, validate, "first"), sig(&s, validate, "second"));
        assert!(!a.is_empty());
        assert_eq!(a, b, "validated={validate}: two builds of one graph");
        let g = build(&s, validate, "clone");
        assert_eq!(g.clone().signature_bytes(&s.ctx), a, "validated={validate}: a clone");
    }
}

#[test]
fn validation_changes_the_bytes() {
    // Inferred dims/strides/dtypes are part of the key: an unvalidated graph never aliases a
    // validated one.
    let s = base();
    assert_ne!(sig(&s, false, "raw"), sig(&s, true, "validated"));
}

#[test]
fn every_single_field_change_gives_different_bytes() {
    for validate in [false, true] {
        let base_sig = sig(&base(), validate, "base");
        let mut seen: HashMap<Vec<u8>, &str> = HashMap::new();
        seen.insert(base_sig.clone(), "base");
        for (case, mutate) in mutations() {
            let mut s = base();
            mutate(&mut s);
            let bytes = sig(&s, validate, case);
            assert_ne!(
                bytes, base_sig,
                "validated={validate}: `{case}` must change the signature"
            );
            if let Some(other) = seen.insert(bytes, case) {
                panic!("validated={validate}: `{case}` and `{other}` give the same signature");
            }
        }
    }
}

#[test]
fn mutations_are_single_field_changes() {
    // Guards the test above: each mutation really changes its spec, and builds a valid graph.
    for (case, mutate) in mutations() {
        let mut s = base();
        mutate(&mut s);
        assert_ne!(format!("{s:?}"), format!("{:?}", base()), "`{case}` changes nothing");
        build(&s, true, case);
    }
}

#[test]
fn scalar_values_do_not_change_the_signature_but_their_dtype_does() {
    for validate in [false, true] {
        let at = |scale: Scalar| {
            let mut s = base();
            s.scale = scale;
            sig(&s, validate, &format!("{scale:?}"))
        };
        let f32_2 = at(Scalar::F32(2.0));
        for v in [0.0f32, -7.5, 1e30, f32::NAN] {
            assert_eq!(at(Scalar::F32(v)), f32_2, "validated={validate}: F32({v}) vs F32(2.0)");
        }
        let f64_2 = at(Scalar::F64(2.0));
        assert_eq!(at(Scalar::F64(-3.25)), f64_2, "validated={validate}: F64 values");
        assert_ne!(f64_2, f32_2, "validated={validate}: F64 vs F32 scalar");
    }
    // i64 scalars are rejected by a pointwise op, so compare them on an unvalidated graph.
    let mut s = base();
    s.scale = Scalar::I64(2);
    let i64_2 = sig(&s, false, "I64(2)");
    s.scale = Scalar::I64(-9);
    assert_eq!(sig(&s, false, "I64(-9)"), i64_2, "I64 values");
    assert_ne!(i64_2, sig(&base(), false, "F32"), "I64 vs F32 scalar");
}

#[test]
fn tensor_names_do_not_change_the_signature() {
    let build_named = |x: &str, scale: &str| {
        let mut g = Graph::new();
        let xi = g.tensor(x, &[2, 3], &[3, 1], F32);
        let si = g.scalar(scale, Scalar::F32(1.5), 2);
        let yi = g.pointwise(PointwiseMode::Mul, xi, Some(si));
        g.set_output(yi, F32);
        g.validate().expect("scaled graph");
        g.signature_bytes(&SignatureContext::default())
    };
    assert_eq!(build_named("x", "alpha"), build_named("input", "beta"));
}

#[test]
fn explicit_output_strides_change_the_signature() {
    let with_out = |strides: Option<[i64; 4]>| {
        let mut g = Graph::new();
        let x = g.tensor("x", &[2, 3, 4, 5], &[60, 20, 5, 1], F32);
        let y = g.pointwise(PointwiseMode::Abs, x, None);
        g.set_output(y, F32);
        if let Some(s) = strides {
            g.set_strides(y, &s);
        }
        g.validate().expect("abs graph");
        g.signature_bytes(&SignatureContext::default())
    };
    let inferred = with_out(None);
    assert_eq!(
        with_out(Some([60, 20, 5, 1])),
        inferred,
        "explicit strides equal to the inferred ones"
    );
    assert_ne!(with_out(Some([60, 1, 15, 3])), inferred, "NHWC output");
    assert_ne!(with_out(Some([120, 40, 10, 2])), inferred, "gapped output");
}

#[test]
fn op_kind_changes_the_signature() {
    // Same tensors and ports: only the op (its mode or kind) differs.
    let one = |mode: PointwiseMode| {
        let mut g = Graph::new();
        let a = g.tensor("a", &[4, 4], &[4, 1], F32);
        let b = g.tensor("b", &[4, 4], &[4, 1], F32);
        let y = g.pointwise(mode, a, Some(b));
        g.set_output(y, F32);
        g.validate().expect("binary graph");
        g.signature_bytes(&SignatureContext::default())
    };
    let all = [
        one(PointwiseMode::Add),
        one(PointwiseMode::Sub),
        one(PointwiseMode::Mul),
        one(PointwiseMode::Div),
        one(PointwiseMode::Max),
        one(PointwiseMode::Min),
        one(PointwiseMode::ReluBwd),
        one(PointwiseMode::GeluBwd),
        one(PointwiseMode::SigmoidBwd),
        one(PointwiseMode::TanhBwd),
    ];
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            assert_ne!(all[i], all[j], "pointwise modes #{i} and #{j}");
        }
    }
    // Matmul vs a pointwise op on the same [4, 4] operands.
    let mut g = Graph::new();
    let a = g.tensor("a", &[4, 4], &[4, 1], F32);
    let b = g.tensor("b", &[4, 4], &[4, 1], F32);
    let c = g.matmul(a, b);
    g.set_output(c, F32);
    g.validate().expect("matmul graph");
    assert_ne!(g.signature_bytes(&SignatureContext::default()), all[2], "matmul vs mul");
}

#[test]
fn signature_is_deterministic_across_threads() {
    let here = sig(&base(), true, "main thread");
    let handles: Vec<_> = (0..2)
        .map(|i| thread::spawn(move || sig(&base(), true, &format!("thread {i}"))))
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let bytes = h.join().unwrap_or_else(|_| panic!("thread {i} panicked"));
        assert_eq!(bytes, here, "thread {i} vs main thread");
    }
}

#[test]
fn context_fields_each_change_the_signature() {
    let g = build(&base(), true, "ctx");
    let ctx = base().ctx;
    let b = g.signature_bytes(&ctx);
    assert_eq!(g.signature_bytes(&ctx), b, "same context");
    for (case, other) in [
        (
            "major",
            SignatureContext {
                compute_capability: (10, 0),
                ..ctx
            },
        ),
        (
            "minor",
            SignatureContext {
                compute_capability: (9, 1),
                ..ctx
            },
        ),
        (
            "cudnn",
            SignatureContext {
                cudnn_version: 91401,
                ..ctx
            },
        ),
        ("policy", SignatureContext { policy: 1 << 40, ..ctx }),
        ("default", SignatureContext::default()),
    ] {
        assert_ne!(g.signature_bytes(&other), b, "{case}");
    }
}

// ------------------------------------------------------------ EnginePolicy bits

#[test]
fn policy_signature_bits_differ_for_every_field_change() {
    let d = EnginePolicy::default();
    let cases: Vec<(&str, EnginePolicy)> = vec![
        ("default", d),
        ("benchmark", EnginePolicy { benchmark: true, ..d }),
        (
            "deterministic",
            EnginePolicy {
                deterministic: true,
                ..d
            },
        ),
        (
            "benchmark+deterministic",
            EnginePolicy {
                benchmark: true,
                deterministic: true,
                ..d
            },
        ),
        ("allow_tf32", EnginePolicy { allow_tf32: true, ..d }),
        (
            "forbid_down_convert off",
            EnginePolicy {
                forbid_down_convert: false,
                ..d
            },
        ),
        (
            "heuristic B",
            EnginePolicy {
                heuristic: HeuristicMode::B,
                ..d
            },
        ),
        (
            "max_workspace 0",
            EnginePolicy {
                max_workspace: Some(0),
                ..d
            },
        ),
        (
            "max_workspace 1",
            EnginePolicy {
                max_workspace: Some(1),
                ..d
            },
        ),
        (
            "max_workspace 1 MiB",
            EnginePolicy {
                max_workspace: Some(1 << 20),
                ..d
            },
        ),
        (
            "max_workspace 1 MiB + 1",
            EnginePolicy {
                max_workspace: Some((1 << 20) + 1),
                ..d
            },
        ),
        (
            "max_workspace 64 GiB",
            EnginePolicy {
                max_workspace: Some(64 << 30),
                ..d
            },
        ),
        (
            "max_workspace 0 + tf32",
            EnginePolicy {
                max_workspace: Some(0),
                allow_tf32: true,
                ..d
            },
        ),
        (
            "dynamic_shapes",
            EnginePolicy {
                dynamic_shapes: true,
                ..d
            },
        ),
        (
            "sm_count_target 66",
            EnginePolicy {
                sm_count_target: Some(66),
                ..d
            },
        ),
    ];
    let mut seen: HashMap<u64, &str> = HashMap::new();
    for (case, p) in &cases {
        assert_eq!(p.signature_bits(), p.signature_bits(), "{case}: deterministic");
        if let Some(other) = seen.insert(p.signature_bits(), case) {
            panic!(
                "`{case}` and `{other}` give the same signature bits {:#x}",
                p.signature_bits()
            );
        }
    }
}

#[test]
fn policy_bits_reach_the_graph_signature() {
    let g = build(&base(), true, "policy");
    let ctx = |p: EnginePolicy| SignatureContext {
        policy: p.signature_bits(),
        ..base().ctx
    };
    let d = EnginePolicy::default();
    assert_ne!(
        g.signature_bytes(&ctx(d)),
        g.signature_bytes(&ctx(EnginePolicy { allow_tf32: true, ..d })),
        "tf32 on vs off"
    );
}

#[test]
fn policy_signature_bits_distinguish_huge_workspace_caps() {
    let d = EnginePolicy::default();
    for (a, b) in [(0u64, 1u64 << 56), (u64::MAX, u64::MAX >> 8), (1, (1 << 56) + 1)] {
        let pa = EnginePolicy {
            max_workspace: Some(a),
            ..d
        };
        let pb = EnginePolicy {
            max_workspace: Some(b),
            ..d
        };
        assert_ne!(
            pa.signature_bits(),
            pb.signature_bits(),
            "max_workspace {a:#x} vs {b:#x}"
        );
    }
}

#[test]
fn f64_and_bf16_dtypes_are_distinct() {
    // DataType codes feed the signature; every float type must map to its own bytes.
    let one = |dt: DataType| {
        let mut g = Graph::new();
        let x = g.tensor("x", &[8], &[1], dt);
        let y = g.pointwise(PointwiseMode::Neg, x, None);
        g.set_output(y, dt);
        g.validate().unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        g.signature_bytes(&SignatureContext::default())
    };
    let all = [one(F32), one(F16), one(BF16), one(F64)];
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            assert_ne!(all[i], all[j], "dtypes #{i} and #{j}");
        }
    }
}

#[test]
fn topology_bytes_ignore_sizes_but_not_layout_dtype_or_ops() {
    for validate in [false, true] {
        let topo = |s: &Spec| build(s, validate, "topology").topology_bytes(&s.ctx);
        let a = base();
        let mut bigger = base();
        bigger.x_dims = [4, 3, 16, 16];
        assert_eq!(topo(&a), topo(&bigger), "sizes alone must not change the topology");
        assert_ne!(sig(&a, validate, "a"), sig(&bigger, validate, "bigger"));
        let mut nhwc = base();
        nhwc.x_nhwc = true;
        let mut half_out = base();
        half_out.dtype = BF16;
        let mut gelu = base();
        gelu.act = PointwiseMode::Gelu;
        for (name, other) in [("layout", nhwc), ("dtype", half_out), ("activation", gelu)] {
            assert_ne!(topo(&a), topo(&other), "{name} must change the topology");
        }
    }
}

#[test]
fn the_default_policys_bits_are_stable() {
    // Tuning files and stored plans are keyed with these bits: a new policy field must leave
    // the default policy's value as it was.
    assert_eq!(EnginePolicy::default().signature_bits(), 0x6dc2_3786_9c05_080c);
}
