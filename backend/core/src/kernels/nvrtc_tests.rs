//! Tests that need only libnvrtc (no GPU): every kernel compiles alone to a CUBIN, the warm
//! groups name real kernels, and (printed, for the design notes) what compiling costs.
//!
//! ```sh
//! LD_LIBRARY_PATH=/path/to/nvrtc/lib CUDNN_BACKEND_COMPILE_TIMINGS=1 \
//!     cargo test --release -p cudnn-backend --lib kernels::nvrtc_tests -- --ignored --nocapture \
//!     --test-threads=1
//! ```

use std::collections::BTreeSet;
use std::time::Instant;

use super::compile::{self, name_expression, Target};
use super::{KernelSource, ALL_SOURCES};
use crate::ffi::nvrtc::{self, Output};
use crate::runtime::check_nvrtc;

const SM90: Target = Target {
    output: Output::Cubin,
    arch: 90,
};

/// `source` as one `extern "C"` translation unit (the loader's behaviour before per-kernel
/// compilation): `KERNEL` defined as `extern "C" __global__`, so every kernel is generated.
fn whole_text(source: KernelSource) -> String {
    let common = if source.common { super::COMMON } else { "" };
    format!("#define KERNEL extern \"C\" __global__\n{common}\n{}", source.code)
}

/// Every entry point of `source`, read from the `.entry` lines of its whole-source PTX.
fn entries(source: KernelSource) -> Vec<String> {
    let opts = ["--gpu-architecture=compute_90".to_string()];
    let ptx =
        nvrtc::compile(&whole_text(source), source.name, &[], &opts, Output::Ptx).unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8(ptx.image).unwrap();
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(".visible .entry ")?;
            Some(rest.split(|c: char| c == '(' || c.is_whitespace()).next()?.to_string())
        })
        .collect();
    assert!(!names.is_empty(), "no entry points in {}", source.name);
    names.into_iter().collect()
}

fn all_kernels() -> Vec<(KernelSource, &'static str)> {
    ALL_SOURCES
        .iter()
        .flat_map(|s| {
            entries(*s)
                .into_iter()
                .map(move |n| (*s, &*Box::leak(n.into_boxed_str())))
        })
        .collect()
}

/// Compiles `kernels` with up to `threads` threads, one program per kernel; returns seconds.
fn compile_each(kernels: &[(KernelSource, &'static str)], threads: usize) -> f64 {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(src, name)) = kernels.get(i) else { break };
                let img = compile::compile(src, Some(name), SM90).unwrap_or_else(|e| panic!("{e}"));
                assert!(!img.bytes.is_empty() && !img.symbol.is_empty(), "{name}");
            });
        }
    });
    t.elapsed().as_secs_f64()
}

/// Compiles `kernels` grouped by source (one program per source, one name expression per
/// kernel) with up to `threads` threads; returns seconds.
fn compile_grouped(kernels: &[(KernelSource, &'static str)], threads: usize) -> f64 {
    let mut groups: Vec<(KernelSource, Vec<String>)> = Vec::new();
    for (s, n) in kernels {
        match groups.iter_mut().find(|(g, _)| g.name == s.name) {
            Some((_, names)) => names.push(name_expression(n)),
            None => groups.push((*s, vec![name_expression(n)])),
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((src, exprs)) = groups.get(i) else { break };
                let text = compile::full_source(*src);
                let out = nvrtc::compile(&text, src.name, exprs, &SM90.options(), Output::Cubin)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(out.lowered.len(), exprs.len());
            });
        }
    });
    t.elapsed().as_secs_f64()
}

/// The kernels a Burn f32 training step (train_burn) plausibly uses: the f32, i64 and bool
/// warm groups plus the fallback bias+activation.
fn training_set() -> Vec<(KernelSource, &'static str)> {
    let mut set: Vec<(KernelSource, &'static str)> = super::warm::GROUPS[..4]
        .iter()
        .flat_map(|g| g.iter().copied())
        .collect();
    set.retain(|(_, n)| !n.starts_with("bias_act_") || *n == "bias_act_f32");
    set
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn every_kernel_compiles_alone_and_warm_groups_name_real_kernels() {
    check_nvrtc().expect("libnvrtc");
    let all = all_kernels();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let secs = compile_each(&all, threads);
    println!(
        "{} kernels compiled one by one on {threads} threads in {secs:.1} s",
        all.len()
    );
    for g in super::warm::GROUPS {
        for (s, n) in g.iter() {
            assert!(
                all.iter().any(|(s2, n2)| s2.name == s.name && n2 == n),
                "warm group names {n} of {}, which has no such kernel",
                s.name
            );
        }
    }
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn a_bad_name_is_an_nvrtc_error_not_a_panic() {
    check_nvrtc().expect("libnvrtc");
    let e = compile::compile(super::ELEMENTWISE, Some("no_such_kernel"), SM90).unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::Nvrtc {
                kernel: "elementwise.cu",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("no_such_kernel"), "{e}");
    let (v, archs) = compile::nvrtc_info().unwrap();
    assert!(v.0 >= 12 && archs.contains(&90), "{v:?} {archs:?}");
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn compiled_images_go_through_the_disk_cache() {
    use super::load::{compile_stats, image_for, Build};
    use crate::runtime::disk_cache::DiskCache;
    check_nvrtc().expect("libnvrtc");
    let (v, _) = compile::nvrtc_info().unwrap();
    let b = Build::new(SM90, v, 13000);
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::at(dir.path().join("kernels"));
    let mut compiles = 0;
    let before = compile_stats();
    let (first, compiled) = image_for(
        &b,
        Some(&cache),
        super::ELEMENTWISE,
        Some("fill_b4"),
        false,
        &mut || compiles += 1,
    )
    .unwrap();
    assert!(
        compiled && compiles == 1 && first.symbol.contains("fill_b4"),
        "{}",
        first.symbol
    );
    // A second process (same key) reads the entry instead of compiling.
    let t = std::time::Instant::now();
    let (again, compiled) = image_for(
        &b,
        Some(&cache),
        super::ELEMENTWISE,
        Some("fill_b4"),
        false,
        &mut || compiles += 1,
    )
    .unwrap();
    assert!(!compiled && compiles == 1 && again == first);
    println!(
        "disk hit: {:.2} ms for a {} B entry",
        t.elapsed().as_secs_f64() * 1e3,
        again.image.len()
    );
    let after = compile_stats();
    assert!(after.compiled > before.compiled && after.disk_hits > before.disk_hits);
    // A corrupt entry is ignored (with a warning) and rebuilt.
    let files: Vec<_> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();
    let (rebuilt, compiled) = image_for(
        &b,
        Some(&cache),
        super::ELEMENTWISE,
        Some("fill_b4"),
        false,
        &mut || compiles += 1,
    )
    .unwrap();
    assert!(compiled && compiles == 2 && rebuilt == first);
    // Another driver version is another key: compiled again, beside the first entry.
    let b2 = Build::new(SM90, v, 13010);
    let (_, compiled) = image_for(
        &b2,
        Some(&cache),
        super::ELEMENTWISE,
        Some("fill_b4"),
        false,
        &mut || {},
    )
    .unwrap();
    assert!(compiled);
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 2);
    // A source still written with `extern "C"` is compiled whole, its kernels by plain name.
    let legacy = KernelSource {
        name: "legacy.cu",
        code: "extern \"C\" __global__ void legacy_a(float* p) { p[0] = 1.f; }\n\
               extern \"C\" __global__ void legacy_b(float* p) { p[0] = 2.f; }",
        common: false,
    };
    let (whole, compiled) = image_for(&b, Some(&cache), legacy, None, false, &mut || {}).unwrap();
    assert!(compiled && whole.symbol.is_empty() && !whole.image.is_empty());
    assert!(!compile::per_kernel(legacy));
}

/// Prints the measurements behind the loader's design (no assertions beyond success). Takes
/// minutes, so it runs only with `CUDNN_BACKEND_COMPILE_TIMINGS=1` (GPU suites run every
/// ignored test).
#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn compile_timings() {
    use crate::config::test_vars::{var_os, COMPILE_TIMINGS_ENV};
    if var_os(COMPILE_TIMINGS_ENV).is_none_or(|v| v != "1") {
        println!("compile_timings: set CUDNN_BACKEND_COMPILE_TIMINGS=1 to run it");
        return;
    }
    check_nvrtc().expect("libnvrtc");
    let (v, _) = compile::nvrtc_info().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("NVRTC {}.{}, {cores} cores, target sm_90", v.0, v.1);
    // Warm NVRTC up (first-call initialisation) so it is not charged to one measurement.
    compile::compile(super::BIAS_ACT, Some("bias_act_f32"), SM90).unwrap();

    println!("\n(a) whole source, every kernel, one program (the old loader's unit):");
    let mut whole_total = 0.0;
    for s in ALL_SOURCES {
        let t = Instant::now();
        let out = nvrtc::compile(&whole_text(*s), s.name, &[], &SM90.options(), Output::Cubin).unwrap();
        let secs = t.elapsed().as_secs_f64();
        whole_total += secs;
        println!(
            "  {:16} {:3} kernels {secs:6.2} s  {:8} B cubin",
            s.name,
            entries(*s).len(),
            out.image.len()
        );
    }
    println!("  total {whole_total:.1} s");

    println!("\n(b) each kernel alone (front end of its source + that kernel), one thread:");
    let mut all_ms = Vec::new();
    for s in ALL_SOURCES {
        let parse = {
            let t = Instant::now();
            nvrtc::compile(&compile::full_source(*s), s.name, &[], &SM90.options(), Output::Cubin).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        };
        let mut ms: Vec<f64> = entries(*s)
            .iter()
            .map(|n| {
                let n: &'static str = Box::leak(n.clone().into_boxed_str());
                let t = Instant::now();
                compile::compile(*s, Some(n), SM90).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        let sum: f64 = ms.iter().sum();
        println!(
            "  {:16} no kernel {parse:5.0} ms; per kernel min {:4.0} median {:4.0} max {:4.0} ms, sum {:6.0} ms",
            s.name,
            ms[0],
            ms[ms.len() / 2],
            ms[ms.len() - 1],
            sum
        );
        all_ms.extend(ms);
    }
    all_ms.sort_by(f64::total_cmp);
    println!(
        "  all {} kernels: median {:.0} ms, sum {:.1} s",
        all_ms.len(),
        all_ms[all_ms.len() / 2],
        all_ms.iter().sum::<f64>() / 1e3
    );

    let set = training_set();
    println!("\n(c) a training step's {} kernels:", set.len());
    println!(
        "  one program per kernel, 1 thread      {:6.2} s",
        compile_each(&set, 1)
    );
    println!(
        "  one program per kernel, {cores} threads     {:6.2} s",
        compile_each(&set, cores)
    );
    println!(
        "  one program per source, 1 thread      {:6.2} s",
        compile_grouped(&set, 1)
    );
    println!(
        "  one program per source, {cores} threads     {:6.2} s",
        compile_grouped(&set, cores)
    );
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn generated_fused_programs_compile() {
    use super::elementwise::{BinaryOp, CompareOp, UnaryOp};
    use super::fused::{FusedOp, Program, Value};
    use crate::graph::DataType;
    check_nvrtc().expect("libnvrtc");
    let program = Program {
        inputs: vec![DataType::F16, DataType::BF16, DataType::Bool, DataType::F32],
        scalars: 2,
        ops: vec![
            FusedOp::Binary(BinaryOp::Add, Value::Input(0), Value::Input(1)),
            FusedOp::unary(UnaryOp::Gelu, Value::Reg(0)).unwrap(),
            FusedOp::Compare(CompareOp::Le, Value::Reg(1), Value::Scalar(0)),
            FusedOp::Select(Value::Reg(2), Value::Scalar(1), Value::Reg(1)),
            FusedOp::Clamp(Value::Reg(3), Value::Scalar(0), Value::Input(3)),
            FusedOp::Round(Value::Reg(4), DataType::BF16),
            FusedOp::Or(Value::Reg(2), Value::Input(2)),
            FusedOp::Not(Value::Reg(6)),
            FusedOp::FromBool(Value::Reg(7)),
        ],
        outputs: vec![
            (5, DataType::BF16),
            (7, DataType::Bool),
            (8, DataType::F16),
            (3, DataType::F32),
        ],
        small_outputs: 0b0100,
    };
    program.validate().unwrap();
    // A program that reads no tensor.
    let fill = super::fused::scaled_fill_program();
    fill.validate().unwrap();
    for vec in [1, 4] {
        let variant = super::fused::Variant {
            rank: 1,
            vec,
            wide: false,
        };
        let source = KernelSource {
            name: "fused-fill-test.cu",
            code: Box::leak(format!("{}\n{}", super::ELEMENTWISE_MATH, fill.source(variant)).into_boxed_str()),
            common: true,
        };
        let image = compile::compile(source, Some("fused_elementwise"), SM90).unwrap_or_else(|e| panic!("{e}"));
        assert!(!image.bytes.is_empty());
    }
    let variants = [
        super::fused::Variant {
            rank: 1,
            vec: 1,
            wide: true,
        },
        super::fused::Variant {
            rank: 3,
            vec: 4,
            wide: false,
        },
        super::fused::Variant {
            rank: 2,
            vec: 8,
            wide: false,
        },
    ];
    for variant in variants {
        let source = KernelSource {
            name: "fused-test.cu",
            code: Box::leak(format!("{}\n{}", super::ELEMENTWISE_MATH, program.source(variant)).into_boxed_str()),
            common: true,
        };
        let t = Instant::now();
        let image = compile::compile(source, Some("fused_elementwise"), SM90).unwrap_or_else(|e| panic!("{e}"));
        assert!(!image.bytes.is_empty());
        println!(
            "fused program {variant:?} compiled in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn generated_fused_reductions_compile() {
    use super::elementwise::{BinaryOp, UnaryOp};
    use super::fused::{FusedOp, Program, Value};
    use super::fused_reduce::ReduceProgram;
    use crate::graph::DataType;
    check_nvrtc().expect("libnvrtc");
    // sum over n, h, w of (x - mean) * g in bf16, with x - mean stored; and a plain max of
    // an f16 input over dim 0 (no operations, 64-bit coordinates).
    let programs = [
        ReduceProgram {
            program: Program {
                inputs: vec![DataType::BF16, DataType::F32, DataType::BF16],
                scalars: 1,
                ops: vec![
                    FusedOp::Binary(BinaryOp::Sub, Value::Input(0), Value::Input(1)),
                    FusedOp::Binary(BinaryOp::Mul, Value::Reg(0), Value::Input(2)),
                    FusedOp::Binary(BinaryOp::Mul, Value::Reg(1), Value::Scalar(0)),
                ],
                outputs: vec![(0, DataType::BF16)],
                small_outputs: 0,
            },
            target: Value::Reg(2),
            siblings: vec![],
            rank: 4,
            reduced: 0b1101,
            max: false,
            out: DataType::BF16,
            wide: false,
            vec: 1,
            epilogue: None,
        },
        ReduceProgram {
            program: Program {
                inputs: vec![DataType::F16],
                ..Program::default()
            },
            target: Value::Input(0),
            siblings: vec![],
            rank: 2,
            reduced: 0b01,
            max: true,
            out: DataType::F16,
            wide: true,
            vec: 1,
            epilogue: None,
        },
        // A softmax's second half in bf16: exp(x - max) summed over the last dim, then the
        // exponential divided by the sum (input 2, the result) and stored.
        ReduceProgram {
            program: Program {
                inputs: vec![DataType::BF16, DataType::BF16, DataType::BF16],
                scalars: 0,
                ops: vec![
                    FusedOp::Binary(BinaryOp::Sub, Value::Input(0), Value::Input(1)),
                    FusedOp::unary(UnaryOp::Exp, Value::Reg(0)).unwrap(),
                    FusedOp::Binary(BinaryOp::Div, Value::Reg(1), Value::Input(2)),
                ],
                outputs: vec![(1, DataType::BF16), (2, DataType::BF16)],
                small_outputs: 0,
            },
            target: Value::Reg(1),
            siblings: vec![],
            rank: 2,
            reduced: 0b10,
            max: false,
            out: DataType::BF16,
            wide: false,
            vec: 1,
            epilogue: Some(super::fused_reduce::Epilogue {
                prologue_ops: 2,
                result_input: Some(2),
            }),
        },
    ];
    // The first program also summing x and (x - mean) * g beside it, each into its own result
    // (burn-autodiff's batch-norm gradient sums three values of one pass).
    let siblings = ReduceProgram {
        siblings: vec![Value::Input(0), Value::Reg(1)],
        ..programs[0].clone()
    };
    let programs: Vec<ReduceProgram> = programs.into_iter().chain([siblings]).collect();
    // The programs that reduce their innermost dim also in groups of 8 and 2 elements.
    let grouped = programs.iter().flat_map(|rp| {
        let inner_reduced = rp.reduced >> (rp.rank - 1) & 1 == 1;
        [8u8, 2]
            .into_iter()
            .filter(move |_| inner_reduced)
            .map(|vec| ReduceProgram { vec, ..rp.clone() })
    });
    let all: Vec<ReduceProgram> = programs.iter().cloned().chain(grouped).collect();
    assert_eq!(all.len(), 10);
    for rp in all {
        rp.validate().unwrap();
        let source = KernelSource {
            name: "fused-reduce-test.cu",
            code: Box::leak(format!("{}\n{}", super::ELEMENTWISE_MATH, rp.source()).into_boxed_str()),
            common: true,
        };
        let image = compile::compile(source, Some("fused_reduce"), SM90).unwrap_or_else(|e| panic!("{e}"));
        assert!(!image.bytes.is_empty());
    }
}

#[test]
#[ignore = "needs libnvrtc on the loader path"]
fn vector_elementwise_entries_compile() {
    use super::elementwise::{BINARY_SCALAR_VEC_ENTRIES, BINARY_VEC_ENTRIES, UNARY_VEC_ENTRIES};
    check_nvrtc().expect("libnvrtc");
    let listed = entries(super::ELEMENTWISE);
    let names = UNARY_VEC_ENTRIES
        .iter()
        .chain(&BINARY_VEC_ENTRIES)
        .chain(&BINARY_SCALAR_VEC_ENTRIES);
    for &name in names {
        assert!(
            listed.iter().any(|n| n == name),
            "{name} is not an entry point of elementwise.cu"
        );
        let t = Instant::now();
        let image = compile::compile(super::ELEMENTWISE, Some(name), SM90).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !image.bytes.is_empty() && image.symbol.contains(name),
            "{name}: {}",
            image.symbol
        );
        println!(
            "{name}: {:.0} ms, {} B",
            t.elapsed().as_secs_f64() * 1e3,
            image.bytes.len()
        );
    }
}
