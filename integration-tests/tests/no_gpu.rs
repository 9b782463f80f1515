//! Error paths and device-free helpers, for CI machines without a GPU, driver or cuDNN.
//!
//! Each test that touches the run-time first asks `check_driver()` (or the probe itself) what
//! the machine has, then asserts the behaviour that machine must show: on a developer's GPU
//! machine the same tests check the success path instead of silently passing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudnn_backend::graph::DataType::{self, BF16, F16, F32, F64, I8};
use cudnn_backend::ops::{ConvParams, PoolMode, PoolParams, TensorRef};
use cudnn_backend::plan::policy::{EnginePolicy, HeuristicMode};
use cudnn_backend::runtime::{self, check_driver, Device};
use cudnn_backend::types::{channels_last_strides, row_major_strides};
use cudnn_backend::{CudnnStatus, Error, CUDNN_LIB_ENV, CUDNN_LIB_NAMES};
use integration_tests::panic_message;

/// True when the NVIDIA driver library loads (a GPU machine, or at least a driver).
fn has_driver() -> bool {
    check_driver().is_ok()
}

/// Runs `f`, failing the test (instead of unwinding) if it panics.
#[track_caller]
fn no_panic<R>(case: &str, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => panic!("{case}: panicked instead of returning an error: {}", panic_message(&*p)),
    }
}

/// Asserts `e` is `LibraryNotFound` for `library_prefix` and returns (searched, Display).
#[track_caller]
fn library_not_found(e: Error, case: &str, library_prefix: &str) -> (Vec<String>, String) {
    let shown = e.to_string();
    match e {
        Error::LibraryNotFound {
            library,
            searched,
            hint,
        } => {
            assert!(library.starts_with(library_prefix), "{case}: library `{library}`");
            assert!(!searched.is_empty(), "{case}: `searched` must list what was tried");
            assert!(!hint.is_empty(), "{case}: a hint says what to install");
            assert!(shown.contains(hint), "{case}: Display includes the hint: {shown}");
            assert!(shown.contains(library), "{case}: Display names the library: {shown}");
            (searched, shown)
        }
        other => panic!("{case}: expected Error::LibraryNotFound, got {other:?}"),
    }
}

/// Runs `f`; returns a description of what went wrong unless it returned `InvalidArgument`.
fn expect_invalid_argument(case: &str, f: impl FnOnce() -> cudnn_backend::Result<Vec<i64>>) -> Option<String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Err(Error::InvalidArgument { .. })) => None,
        Ok(other) => Some(format!("{case}: expected Err(InvalidArgument), got {other:?}")),
        Err(_) => Some(format!("{case}: panicked")),
    }
}

fn invalid_argument(r: cudnn_backend::Result<Vec<i64>>, case: &str, want_op: &str, want_arg: &str) -> String {
    match r {
        Err(Error::InvalidArgument { op, arg, reason }) => {
            assert_eq!(op, want_op, "{case}: op");
            assert_eq!(arg, want_arg, "{case}: arg");
            reason
        }
        other => panic!("{case}: expected Error::InvalidArgument, got {other:?}"),
    }
}

// ------------------------------------------------------------------ run-time probing

#[test]
fn device_new_reports_a_missing_driver_without_panicking() {
    let r = no_panic("Device::new(0)", || Device::new(0));
    if has_driver() {
        // A driver is present: device 0 opens (or, on a driver without GPUs, says so).
        match r {
            Ok(dev) => {
                assert_eq!(dev.ordinal(), 0);
                assert!(!dev.info().name.is_empty(), "device name");
                assert!(dev.info().compute_capability.0 >= 3, "compute capability");
                let again = Device::new(0).expect("second open of device 0");
                assert!(Arc::ptr_eq(&dev, &again), "Device::new caches one Arc per ordinal");
            }
            Err(Error::NoDevice(msg)) => assert!(!msg.is_empty(), "NoDevice explains why"),
            Err(other) => panic!("driver present: Device::new(0) failed unexpectedly: {other}"),
        }
    } else {
        let e = r.expect_err("no driver: Device::new(0) must fail");
        let (searched, shown) = library_not_found(e, "Device::new(0)", "libcuda");
        assert!(
            searched.iter().any(|n| n.contains("libcuda")),
            "searched {searched:?} mentions libcuda"
        );
        assert!(
            shown.contains("install the NVIDIA driver"),
            "Display says what to install: {shown}"
        );
        assert!(shown.contains("libcuda"), "Display: {shown}");
    }
}

#[test]
fn device_new_with_a_huge_ordinal_fails_cleanly() {
    for ordinal in [63usize, 64, 1000, usize::MAX] {
        let case = format!("Device::new({ordinal})");
        let r = no_panic(&case, || Device::new(ordinal));
        let e = r.expect_err(&format!("{case}: no machine has that many GPUs"));
        if has_driver() {
            match e {
                Error::NoDevice(msg) => assert!(msg.contains(&format!("device {ordinal} requested")), "{case}: {msg}"),
                other => panic!("{case}: expected NoDevice, got {other:?}"),
            }
        } else {
            library_not_found(e, &case, "libcuda");
        }
    }
}

#[test]
fn device_count_matches_the_driver_probe() {
    let r = no_panic("device_count", runtime::device_count);
    match check_driver() {
        Ok(name) => {
            assert!(name.contains("cuda"), "loaded driver library `{name}`");
            match r {
                Ok(n) => assert!(n >= 1, "device_count() is Ok only with >= 1 device, got {n}"),
                Err(Error::NoDevice(msg)) => assert!(!msg.is_empty()),
                Err(other) => panic!("driver present: unexpected {other:?}"),
            }
        }
        Err(e) => {
            library_not_found(e, "check_driver", "libcuda");
            let e = r.expect_err("no driver: device_count() fails");
            library_not_found(e, "device_count", "libcuda");
        }
    }
    // The probe is cached and stable.
    assert_eq!(check_driver().is_ok(), has_driver());
}

#[test]
fn cudnn_version_reports_what_was_searched() {
    // cuDNN can be installed without a driver (e.g. from a wheel), so branch on the probe itself
    // and check it agrees with `report()`.
    let r = no_panic("cudnn_version", runtime::cudnn_version);
    let report = runtime::report();
    match r {
        Ok(v) => {
            assert!(v >= 90000, "cuDNN 9 or newer, got {v}");
            let (rv, path) = report.cudnn.expect("report() agrees that cuDNN loaded");
            assert_eq!(rv, v, "report() version");
            assert!(!path.is_empty(), "report() names the loaded library");
        }
        Err(e) => {
            let (searched, shown) = library_not_found(e, "cudnn_version", "libcudnn");
            assert!(
                searched.iter().any(|n| n == "libcudnn.so.9"),
                "searched {searched:?} includes libcudnn.so.9"
            );
            for name in CUDNN_LIB_NAMES {
                assert!(
                    searched.iter().any(|n| n == name),
                    "searched {searched:?} includes {name}"
                );
            }
            if let Some(path) = &cudnn_backend::config::config().cudnn_lib {
                assert_eq!(&searched[0], path, "the {CUDNN_LIB_ENV} path is tried first");
            }
            assert!(
                shown.contains("CUDNN_BACKEND_CUDNN_LIB"),
                "Display names the env var: {shown}"
            );
            assert!(shown.contains("cuDNN 9"), "Display says what to install: {shown}");
            let err = report.cudnn.expect_err("report() agrees that cuDNN is missing");
            assert_eq!(err, shown, "report() carries the same message");
        }
    }
    assert_eq!(CUDNN_LIB_ENV, "CUDNN_BACKEND_CUDNN_LIB");
    assert_eq!(CUDNN_LIB_NAMES.first(), Some(&"libcudnn.so.9"));
}

#[test]
fn check_nvrtc_reports_what_was_searched() {
    match no_panic("check_nvrtc", runtime::check_nvrtc) {
        Ok(name) => assert!(name.contains("nvrtc"), "loaded `{name}`"),
        Err(e) => {
            let (searched, shown) = library_not_found(e, "check_nvrtc", "libnvrtc");
            assert!(searched.iter().any(|n| n.contains("nvrtc")), "searched {searched:?}");
            assert!(shown.contains("LD_LIBRARY_PATH"), "Display: {shown}");
        }
    }
}

#[test]
fn report_never_panics_and_shows_each_component() {
    let report = no_panic("report()", runtime::report);
    let shown = report.to_string();
    let driver_line = shown
        .lines()
        .find(|l| l.starts_with("CUDA driver"))
        .unwrap_or_else(|| panic!("no driver line in:\n{shown}"));
    for label in ["CUDA driver", "devices", "cuDNN", "NVRTC"] {
        assert!(shown.contains(label), "report lists {label}:\n{shown}");
    }
    if has_driver() {
        let name = report.driver.as_ref().expect("driver Ok in the report");
        assert!(
            driver_line.contains(name.as_str()),
            "driver line names the library: {driver_line}"
        );
        assert!(!driver_line.contains("unavailable"), "driver line: {driver_line}");
    } else {
        assert!(report.driver.is_err(), "report().driver is an error without a driver");
        assert!(report.devices.is_err(), "report().devices is an error without a driver");
        assert!(driver_line.contains("unavailable"), "driver line: {driver_line}");
        assert!(driver_line.contains("libcuda"), "driver line: {driver_line}");
        let devices_line = shown.lines().find(|l| l.starts_with("devices")).expect("devices line");
        assert!(devices_line.contains("unavailable"), "devices line: {devices_line}");
    }
    // The other components agree with their own probes.
    assert_eq!(report.nvrtc.is_ok(), runtime::check_nvrtc().is_ok());
    assert_eq!(report.cudnn.is_ok(), runtime::cudnn_version().is_ok());
}

// ------------------------------------------------------------------ TensorRef helpers

/// A view the tests only inspect (strides, alignment, extent): never passed to an op.
fn described(dims: &[i64], strides: &[i64], dtype: DataType, ptr: u64) -> TensorRef<'static> {
    // SAFETY: these views only describe tensors; no op reads or writes through them.
    unsafe { TensorRef::from_raw(dims, strides, dtype, ptr) }
}

#[test]
fn tensor_ref_contiguous_and_channels_last_strides() {
    for (case, t, strides) in [
        (
            "NCHW",
            described(&[2, 3, 4, 5], &row_major_strides(&[2, 3, 4, 5]), F32, 0),
            vec![60, 20, 5, 1],
        ),
        (
            "NHWC",
            described(&[2, 3, 4, 5], &channels_last_strides(&[2, 3, 4, 5]), F32, 0),
            vec![60, 1, 15, 3],
        ),
        (
            "NCL",
            described(&[2, 3, 5], &row_major_strides(&[2, 3, 5]), F16, 0),
            vec![15, 5, 1],
        ),
        (
            "NLC",
            described(&[2, 3, 5], &channels_last_strides(&[2, 3, 5]), F16, 0),
            vec![15, 1, 3],
        ),
        (
            "NCDHW",
            described(&[2, 3, 4, 5, 6], &row_major_strides(&[2, 3, 4, 5, 6]), BF16, 0),
            vec![360, 120, 30, 6, 1],
        ),
        (
            "NDHWC",
            described(&[2, 3, 4, 5, 6], &channels_last_strides(&[2, 3, 4, 5, 6]), BF16, 0),
            vec![360, 1, 90, 18, 3],
        ),
        (
            "matrix",
            described(&[4, 7], &row_major_strides(&[4, 7]), F64, 0),
            vec![7, 1],
        ),
        (
            "channels-last matrix",
            described(&[4, 7], &channels_last_strides(&[4, 7]), F64, 0),
            vec![7, 1],
        ),
        ("vector", described(&[9], &channels_last_strides(&[9]), F32, 0), vec![1]),
        (
            "unit dims",
            described(&[1, 1, 1], &row_major_strides(&[1, 1, 1]), F32, 0),
            vec![1, 1, 1],
        ),
    ] {
        assert_eq!(t.strides(), strides, "{case}");
        assert_eq!(t.dims().len(), t.strides().len(), "{case}");
    }
    let t = described(&[2, 3, 4, 5], &channels_last_strides(&[2, 3, 4, 5]), F16, 0x1000);
    assert_eq!((t.dtype(), t.ptr()), (F16, 0x1000), "dtype and pointer are kept");
    let n = described(&[2, 3], &[1, 2], I8, 7);
    assert_eq!(
        (n.dims(), n.strides(), n.dtype(), n.ptr()),
        (&[2i64, 3][..], &[1i64, 2][..], I8, 7)
    );
}

#[test]
fn tensor_ref_alignment_of_pointers() {
    for (ptr, align) in [
        (0u64, 16u32),
        (0x1000, 16),
        (0x7f00_0000_0010, 16),
        (0x20, 16),
        (0x1008, 8),
        (0x1004, 4),
        (0x100c, 4),
        (0x1002, 2),
        (0x1006, 2),
        (0x1001, 1),
        (0xffff_ffff_ffff_ffff, 1),
        (1 << 63, 16),
    ] {
        let t = described(&[4], &row_major_strides(&[4]), F32, ptr);
        assert_eq!(t.alignment(), align, "alignment of {ptr:#x}");
    }
}

#[test]
fn tensor_ref_extent_numel_and_packing() {
    for (case, t, numel, extent, packed) in [
        (
            "NCHW",
            described(&[2, 3, 4, 5], &row_major_strides(&[2, 3, 4, 5]), F32, 0),
            120,
            120,
            true,
        ),
        (
            "NHWC",
            described(&[2, 3, 4, 5], &channels_last_strides(&[2, 3, 4, 5]), F32, 0),
            120,
            120,
            true,
        ),
        ("transposed", described(&[3, 4], &[1, 3], F32, 0), 12, 12, true),
        ("row slice (gaps)", described(&[2, 3], &[10, 1], F32, 0), 6, 13, false),
        ("broadcast stride 0", described(&[4, 3], &[0, 1], F32, 0), 12, 3, false),
        ("overlap", described(&[2, 2], &[1, 1], F32, 0), 4, 3, false),
        (
            "scalar-like",
            described(&[1, 1, 1, 1], &row_major_strides(&[1, 1, 1, 1]), F32, 0),
            1,
            1,
            true,
        ),
        (
            "empty batch",
            described(&[0, 3, 4, 5], &row_major_strides(&[0, 3, 4, 5]), F32, 0),
            0,
            0,
            true,
        ),
    ] {
        assert_eq!(t.numel(), numel, "{case}: numel");
        assert_eq!(t.extent_elements(), extent, "{case}: extent_elements");
        assert_eq!(t.is_packed(), packed, "{case}: is_packed");
        assert_eq!(t.is_empty(), numel == 0, "{case}: is_empty");
    }
}

#[test]
fn tensor_ref_is_packed_rejects_overlap_balanced_by_gaps() {
    // Offsets a + b + 5c = {0, 1, 1, 2, 5, 6, 6, 7}: 1 and 6 twice, 3 and 4 never.
    let t = described(&[2, 2, 2], &[1, 1, 5], F32, 0);
    assert_eq!((t.numel(), t.extent_elements()), (8, 8));
    assert!(!t.is_packed(), "a view with overlaps and gaps is not packed");
}

// ------------------------------------------------------------ ConvParams / PoolParams

#[test]
fn conv_params_output_dims() {
    let p = |pad: &[i64], stride: &[i64], dil: &[i64]| ConvParams::new(pad, stride, dil, 1);
    for (case, params, x, w, y) in [
        (
            "3x3 same",
            p(&[1, 1], &[1, 1], &[1, 1]),
            vec![2, 3, 8, 8],
            vec![4, 3, 3, 3],
            vec![2, 4, 8, 8],
        ),
        (
            "stride 2",
            p(&[1, 1], &[2, 2], &[1, 1]),
            vec![1, 3, 9, 10],
            vec![4, 3, 3, 3],
            vec![1, 4, 5, 5],
        ),
        (
            "dilation 2",
            p(&[0, 0], &[1, 1], &[2, 2]),
            vec![1, 1, 10, 10],
            vec![1, 1, 3, 3],
            vec![1, 1, 6, 6],
        ),
        (
            "asymmetric",
            p(&[0, 2], &[1, 1], &[1, 1]).with_post_padding(&[1, 0]),
            vec![1, 1, 5, 7],
            vec![1, 1, 3, 3],
            vec![1, 1, 4, 7],
        ),
        ("1-D", p(&[0], &[1], &[1]), vec![2, 4, 10], vec![6, 4, 3], vec![2, 6, 8]),
        (
            "3-D",
            p(&[1, 1, 1], &[2, 2, 2], &[1, 1, 1]),
            vec![1, 2, 5, 6, 7],
            vec![3, 2, 3, 3, 3],
            vec![1, 3, 3, 3, 4],
        ),
        (
            "grouped",
            ConvParams::new(&[0, 0], &[1, 1], &[1, 1], 4),
            vec![2, 8, 6, 6],
            vec![4, 2, 3, 3],
            vec![2, 4, 4, 4],
        ),
        (
            "empty batch",
            p(&[1, 1], &[1, 1], &[1, 1]),
            vec![0, 3, 8, 8],
            vec![4, 3, 3, 3],
            vec![0, 4, 8, 8],
        ),
    ] {
        let got = params.output_dims(&x, &w).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, y, "{case}");
    }
    let q = ConvParams::new(&[1, 2], &[3, 4], &[5, 6], 2).with_post_padding(&[7, 8]);
    assert_eq!(
        (q.pre_padding, q.post_padding, q.stride, q.dilation, q.groups),
        (vec![1, 2], vec![7, 8], vec![3, 4], vec![5, 6], 2)
    );
}

#[test]
fn conv_params_output_dims_errors() {
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    let reason = invalid_argument(p.output_dims(&[1, 3, 8, 8], &[4, 3, 3]), "w rank 3", "conv", "dims");
    assert!(reason.contains("need rank 4"), "{reason}");
    let reason = invalid_argument(p.output_dims(&[1, 3, 8], &[4, 3, 3, 3]), "x rank 3", "conv", "dims");
    assert!(reason.contains("need rank 4"), "{reason}");
    let reason = invalid_argument(p.output_dims(&[1, 1, 4, 4], &[1, 1, 7, 7]), "7x7 filter", "conv", "w");
    assert!(
        reason.contains("does not fit") && reason.contains("spatial dim 0"),
        "{reason}"
    );
    let reason = invalid_argument(p.output_dims(&[1, 1, 8, 2], &[1, 1, 3, 5]), "W too small", "conv", "w");
    assert!(reason.contains("spatial dim 1"), "{reason}");
}

#[test]
fn conv_params_output_dims_rejects_bad_geometry_without_panicking() {
    let x = [1i64, 3, 8, 8];
    let w = [4i64, 3, 3, 3];
    let mut failures = Vec::new();
    for (case, p) in [
        ("stride 0", ConvParams::new(&[1, 1], &[0, 1], &[1, 1], 1)),
        ("negative stride", ConvParams::new(&[1, 1], &[-1, 1], &[1, 1], 1)),
        ("dilation 0", ConvParams::new(&[1, 1], &[1, 1], &[0, 1], 1)),
        ("short padding", ConvParams::new(&[1], &[1, 1], &[1, 1], 1)),
        ("short dilation", ConvParams::new(&[1, 1], &[1, 1], &[1], 1)),
    ] {
        if let Some(failure) = expect_invalid_argument(case, || p.output_dims(&x, &w)) {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn pool_params_output_dims() {
    for (case, p, x, y) in [
        (
            "max 2x2/2",
            PoolParams::new(PoolMode::Max, &[2, 2], &[2, 2], &[0, 0]),
            vec![1, 2, 6, 6],
            vec![1, 2, 3, 3],
        ),
        (
            "avg 3x3/1 pad 1",
            PoolParams::new(PoolMode::AvgIncludePadding, &[3, 3], &[1, 1], &[1, 1]),
            vec![2, 4, 5, 7],
            vec![2, 4, 5, 7],
        ),
        (
            "max 3x3/2 pad 1 (floor)",
            PoolParams::new(PoolMode::Max, &[3, 3], &[2, 2], &[1, 1]),
            vec![1, 1, 8, 7],
            vec![1, 1, 4, 4],
        ),
        (
            "1-D",
            PoolParams::new(PoolMode::AvgExcludePadding, &[3], &[2], &[1]),
            vec![2, 3, 7],
            vec![2, 3, 4],
        ),
        (
            "3-D",
            PoolParams::new(PoolMode::Max, &[2, 2, 2], &[2, 2, 2], &[0, 0, 0]),
            vec![1, 1, 4, 4, 6],
            vec![1, 1, 2, 2, 3],
        ),
        (
            "asymmetric",
            PoolParams {
                post_padding: vec![0, 0],
                ..PoolParams::new(PoolMode::Max, &[2, 2], &[1, 1], &[1, 0])
            },
            vec![1, 1, 5, 5],
            vec![1, 1, 5, 4],
        ),
        (
            "global",
            PoolParams::new(PoolMode::AvgIncludePadding, &[7, 7], &[1, 1], &[0, 0]),
            vec![8, 16, 7, 7],
            vec![8, 16, 1, 1],
        ),
    ] {
        let got = p.output_dims(&x).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, y, "{case}");
    }
}

#[test]
fn pool_params_output_dims_errors() {
    let p = PoolParams::new(PoolMode::Max, &[4, 4], &[1, 1], &[0, 0]);
    let reason = invalid_argument(p.output_dims(&[1, 1, 3, 3]), "4x4 on 3x3", "pool", "window");
    assert!(reason.contains("window 4 exceeds padded input 3"), "{reason}");
    let reason = invalid_argument(p.output_dims(&[1, 1, 3]), "rank 3 for 2-D", "pool", "params");
    assert!(reason.contains("needs rank 4"), "{reason}");
    let short = PoolParams {
        stride: vec![1],
        ..p.clone()
    };
    invalid_argument(short.output_dims(&[1, 1, 8, 8]), "one stride for 2-D", "pool", "params");
    let short = PoolParams {
        post_padding: vec![0],
        ..p.clone()
    };
    invalid_argument(
        short.output_dims(&[1, 1, 8, 8]),
        "one post padding for 2-D",
        "pool",
        "params",
    );
    let zero_stride = PoolParams::new(PoolMode::Max, &[2, 2], &[0, 1], &[0, 0]);
    let r = no_panic("stride 0", || zero_stride.output_dims(&[1, 1, 8, 8]));
    invalid_argument(r, "stride 0", "pool", "params");
}

#[test]
fn pool_params_output_dims_rejects_bad_windows() {
    let mut failures = Vec::new();
    for (case, p) in [
        ("window 0", PoolParams::new(PoolMode::Max, &[0, 2], &[1, 1], &[0, 0])),
        (
            "negative window",
            PoolParams::new(PoolMode::Max, &[-2, 2], &[1, 1], &[0, 0]),
        ),
        (
            "negative padding",
            PoolParams::new(PoolMode::Max, &[2, 2], &[1, 1], &[-1, 0]),
        ),
    ] {
        if let Some(failure) = expect_invalid_argument(case, || p.output_dims(&[1, 1, 4, 4])) {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ------------------------------------------------------------------ policy and errors

#[test]
fn engine_policy_defaults() {
    let p = EnginePolicy::default();
    assert!(!p.benchmark, "benchmark off");
    assert!(!p.deterministic, "deterministic off");
    assert!(!p.allow_tf32, "TF32 off: f32 means f32");
    assert!(p.forbid_down_convert, "down-conversion forbidden");
    assert_eq!(p.max_workspace, None, "no workspace cap");
    assert_eq!(p.heuristic, HeuristicMode::A);
    assert_eq!(p.autotune_top_k, 8);
    assert_eq!(
        p.signature_bits(),
        EnginePolicy::default().signature_bits(),
        "bits are a pure function of the policy"
    );
}

fn cudnn_error(code: u32) -> Error {
    Error::Cudnn {
        call: "cudnnBackendFinalize",
        status: CudnnStatus(code),
        message: "msg".into(),
        context: String::new(),
    }
}

#[test]
fn is_not_supported_only_for_unsupported_and_cudnn_3xxx() {
    for code in [3000, 3001, 3004, 3011, 3999] {
        assert!(cudnn_error(code).is_not_supported(), "Cudnn status {code}");
        assert!(CudnnStatus(code).is_not_supported(), "CudnnStatus({code})");
    }
    for code in [0, 1001, 2000, 2999, 4000, 4004, 5000, 30000] {
        assert!(!cudnn_error(code).is_not_supported(), "Cudnn status {code}");
        assert!(!CudnnStatus(code).is_not_supported(), "CudnnStatus({code})");
    }
    let unsupported = Error::Unsupported {
        graph: "graph[conv_fprop]".into(),
        reason: "no engine".into(),
    };
    assert!(unsupported.is_not_supported(), "Error::Unsupported");
    for (case, e) in [
        (
            "LibraryNotFound",
            Error::LibraryNotFound {
                library: "libcudnn (cuDNN 9)",
                searched: vec!["libcudnn.so.9".into()],
                hint: "install",
            },
        ),
        (
            "MissingSymbol",
            Error::MissingSymbol {
                library: "libcudnn",
                symbol: "cudnnBackendExecute",
                hint: "reinstall",
            },
        ),
        ("NoDevice", Error::NoDevice("none".into())),
        (
            "Cuda",
            Error::Cuda {
                op: "launch",
                message: "bad".into(),
            },
        ),
        (
            "OutOfMemory",
            Error::OutOfMemory {
                op: "alloc",
                bytes: 1 << 40,
                message: "oom".into(),
            },
        ),
        (
            "Nvrtc",
            Error::Nvrtc {
                kernel: "bias_act.cu",
                log: "error".into(),
            },
        ),
        ("InvalidGraph", Error::InvalidGraph("bad".into())),
        ("InvalidArgument", Error::invalid_arg("conv_forward", "x", "bad")),
    ] {
        assert!(!e.is_not_supported(), "{case} is not a 'not supported' error");
    }
}

#[test]
fn cudnn_status_names() {
    assert_eq!(CudnnStatus(3001).name(), "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN");
    assert_eq!(CudnnStatus(3000).name(), "CUDNN_STATUS_NOT_SUPPORTED");
    assert_eq!(CudnnStatus(0).name(), "CUDNN_STATUS_SUCCESS");
    assert_eq!(CudnnStatus(2002).name(), "CUDNN_STATUS_BAD_PARAM_NULL_POINTER");
    assert_eq!(
        CudnnStatus(4004).name(),
        "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"
    );
    for code in [3999u32, 12345, 1, u32::MAX] {
        assert_eq!(
            CudnnStatus(code).name(),
            format!("CUDNN_STATUS_{code}"),
            "unknown code {code}"
        );
    }
    assert_eq!(
        CudnnStatus(3001).to_string(),
        "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN (3001)"
    );
    assert_eq!(CudnnStatus(777).to_string(), "CUDNN_STATUS_777 (777)");
    assert!(CudnnStatus(4004).is_alloc_failure() && CudnnStatus(2).is_alloc_failure());
    assert!(!CudnnStatus(4000).is_alloc_failure() && !CudnnStatus(3001).is_alloc_failure());
}

#[test]
fn error_display_and_context() {
    let e = cudnn_error(3001)
        .with_context("op conv_fprop#0")
        .with_context("graph[conv_fprop]");
    let shown = e.to_string();
    assert_eq!(
        shown,
        "cuDNN cudnnBackendFinalize failed with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN (3001) \
         [op conv_fprop#0] [graph[conv_fprop]]: msg"
    );
    assert!(e.is_not_supported(), "context keeps the status");
    // Other variants pass through with_context unchanged.
    let e = Error::invalid_arg("conv_forward", "w", "too big").with_context("ignored");
    assert_eq!(e.to_string(), "invalid argument `w` to conv_forward: too big");
    let e = Error::InvalidGraph("graph has no nodes".into()).with_context("ignored");
    assert_eq!(e.to_string(), "invalid graph: graph has no nodes");
    let e = Error::Unsupported {
        graph: "g".into(),
        reason: "r".into(),
    };
    assert_eq!(e.to_string(), "no cuDNN engine supports g: r");
}

#[test]
fn data_type_sizes_and_float_flags() {
    let all: [(DataType, usize, bool); 9] = [
        (F32, 4, true),
        (F16, 2, true),
        (BF16, 2, true),
        (F64, 8, true),
        (DataType::I32, 4, false),
        (DataType::I64, 8, false),
        (DataType::U8, 1, false),
        (I8, 1, false),
        (DataType::Bool, 1, false),
    ];
    for (dt, size, float) in all {
        assert_eq!(dt.size(), size, "{dt:?} size");
        assert_eq!(dt.is_float(), float, "{dt:?} is_float");
    }
}
