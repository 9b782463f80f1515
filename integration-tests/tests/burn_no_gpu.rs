//! The Burn backend (`cudnn_backend::burn::Cudnn`) on machines without a GPU (CI): what must
//! work without a device (names, ids, dtype support, scheme checks, empty transactions) and
//! how device-touching ops fail (a panic whose message starts with `cudnn-backend:`).
//!
//! Each test that needs the device first asks `CudnnDevice::try_open` what the machine has:
//! on a GPU machine the same tests check the success path instead of silently passing.

use std::panic::{catch_unwind, AssertUnwindSafe};

use burn_backend::ops::{FloatTensorOps, QTensorOps, TransactionOps, TransactionPrimitive};
use burn_backend::quantization::{BlockSize, QuantLevel, QuantParam, QuantScheme, QuantStore, QuantValue};
use burn_backend::{
    read_sync, Backend, BoolStore, DType, DTypeUsage, DTypeUsageSet, Device, DeviceId, FloatDType, Shape, TensorData,
};
use cudnn_backend::burn::{Cudnn, CudnnDevice, DEVICE_TYPE_ID};
use integration_tests::panic_message;

/// True when GPU 0 opens (a developer's GPU machine).
fn has_gpu() -> bool {
    CudnnDevice::default().try_open().is_ok()
}

/// Runs `f`, which must panic; returns the panic message.
#[track_caller]
fn expect_panic<R>(case: &str, f: impl FnOnce() -> R) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("{case}: returned instead of panicking"),
        Err(p) => panic_message(&*p),
    }
}

/// A named operation expected to panic.
type Case<'a> = (&'static str, Box<dyn FnOnce() + 'a>);

/// A symmetric int8 scheme with native storage and f32 scales.
fn q8(value: QuantValue, level: QuantLevel) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_level(level)
        .with_store(QuantStore::Native)
        .with_param(QuantParam::F32)
}

#[test]
fn try_open_explains_why_it_fails() {
    let device = CudnnDevice::default();
    match device.try_open() {
        Ok(dev) => assert_eq!(dev.ordinal(), 0, "GPU 0 opened as another ordinal"),
        Err(e) => {
            let shown = e.to_string();
            assert!(
                !shown.trim().is_empty(),
                "the error must say why the device cannot be opened"
            );
            let lower = shown.to_lowercase();
            assert!(
                ["search", "tried", "install", "driver", "libcuda", "no cuda", "device"]
                    .iter()
                    .any(|w| lower.contains(w)),
                "the error must name what was searched or what to do: {shown}"
            );
        }
    }
    // An ordinal no machine has always fails, with an error (not a panic).
    let far = CudnnDevice::new(999);
    let r = catch_unwind(AssertUnwindSafe(|| far.try_open().map(|_| ())));
    match r {
        Ok(Err(e)) => assert!(!e.to_string().trim().is_empty()),
        Ok(Ok(())) => panic!("GPU 999 cannot exist"),
        Err(p) => panic!(
            "try_open panicked instead of returning an error: {}",
            panic_message(&*p)
        ),
    }
}

#[test]
fn device_ops_panic_with_backend_prefix() {
    if has_gpu() {
        let t = Cudnn::float_zeros(Shape::new([2, 3]), &CudnnDevice::default(), FloatDType::F32);
        let data = read_sync(Cudnn::float_into_data(t)).expect("float_into_data");
        assert_eq!(data.to_vec::<f32>().unwrap(), vec![0.0; 6]);
        return;
    }
    let device = CudnnDevice::default();
    let cases: Vec<Case<'_>> = vec![
        (
            "float_zeros",
            Box::new(|| drop(Cudnn::float_zeros(Shape::new([2, 3]), &device, FloatDType::F32))),
        ),
        (
            "float_from_data",
            Box::new(|| drop(Cudnn::float_from_data(TensorData::from([1.0f32, 2.0]), &device))),
        ),
        (
            "q_from_data",
            Box::new(|| {
                let scheme = q8(QuantValue::Q8S, QuantLevel::Tensor);
                let data = TensorData::quantized(vec![1i8, -2, 3, 127], [2, 2], scheme, &[0.5]);
                drop(Cudnn::q_from_data(data, &device))
            }),
        ),
    ];
    for (case, f) in cases {
        let msg = expect_panic(case, f);
        assert!(msg.starts_with("cudnn-backend:"), "{case}: panic message `{msg}`");
    }
}

#[test]
fn sync_reports_an_error_instead_of_panicking() {
    let device = CudnnDevice::new(999);
    let why = device.try_open().err().map(|e| e.to_string()).unwrap_or_default();
    let r = catch_unwind(AssertUnwindSafe(|| Cudnn::sync(&device)));
    match r {
        // The error carries the reason the device cannot be opened.
        Ok(Err(e)) => assert!(!why.is_empty() && format!("{e:?}").contains(&why), "{e:?} vs {why}"),
        Ok(Ok(())) => panic!("sync of GPU 999 succeeded"),
        Err(p) => panic!("sync panicked: {}", panic_message(&*p)),
    }
    // Cleanup of a device that cannot be opened is a no-op.
    Cudnn::memory_cleanup(&device);
}

#[test]
fn dtype_usage_answers_without_a_device() {
    // GPU 999 never exists: answering must not open it.
    let device = CudnnDevice::new(999);
    let general = DTypeUsage::general();
    let accelerated = general | DTypeUsage::Accelerated;
    let expected: Vec<(DType, DTypeUsageSet)> = vec![
        (DType::F64, general),
        (DType::F32, accelerated),
        (DType::Flex32, general),
        (DType::F16, accelerated),
        (DType::BF16, accelerated),
        (DType::I64, general),
        (DType::I32, general),
        (DType::I16, DTypeUsageSet::empty()),
        (DType::I8, general),
        (DType::U64, DTypeUsageSet::empty()),
        (DType::U32, DTypeUsageSet::empty()),
        (DType::U16, DTypeUsageSet::empty()),
        (DType::U8, general),
        (DType::Bool(BoolStore::Native), general),
        (DType::Bool(BoolStore::U8), general),
        (DType::Bool(BoolStore::U32), DTypeUsageSet::empty()),
        (DType::QFloat(q8(QuantValue::Q8S, QuantLevel::Tensor)), general),
        (DType::QFloat(QuantScheme::default()), general),
        (
            DType::QFloat(QuantScheme::default().with_store(QuantStore::PackedU32(1))),
            DTypeUsageSet::empty(),
        ),
    ];
    for (dtype, want) in expected {
        let got = catch_unwind(AssertUnwindSafe(|| Cudnn::dtype_usage(&device, dtype)))
            .unwrap_or_else(|p| panic!("dtype_usage({dtype:?}) panicked: {}", panic_message(&*p)));
        assert_eq!(got, want, "dtype_usage({dtype:?})");
        if got.contains(DTypeUsage::Arithmetic) {
            assert!(
                got.contains(DTypeUsage::Storage),
                "{dtype:?}: arithmetic without storage"
            );
        }
    }
}

#[test]
fn supported_quantization_schemes() {
    let device = CudnnDevice::default();
    let supported = |scheme: QuantScheme| Cudnn::dtype_usage(&device, DType::QFloat(scheme)) == DTypeUsage::general();
    for value in [QuantValue::Q8S, QuantValue::Q8F] {
        for level in [
            QuantLevel::Tensor,
            QuantLevel::Block(BlockSize::new([32])),
            QuantLevel::Block(BlockSize::new([2, 16])),
        ] {
            assert!(supported(q8(value, level)), "{value:?} {level:?} must be supported");
            // Burn's default packed storage and every param type (scales kept in f32, as
            // burn-ndarray keeps them) are too; packing along another dim is not.
            let packed = q8(value, level).with_store(QuantStore::PackedU32(0));
            assert!(supported(packed), "{packed:?} must be supported");
            for param in [QuantParam::F16, QuantParam::BF16, QuantParam::UE8M0, QuantParam::UE4M3] {
                let scheme = packed.with_param(param);
                assert!(supported(scheme), "{scheme:?} must be supported");
            }
            let outer = q8(value, level).with_store(QuantStore::PackedU32(1));
            assert!(!supported(outer), "{outer:?} must not be supported");
        }
    }
    for value in [
        QuantValue::Q4F,
        QuantValue::Q4S,
        QuantValue::Q2F,
        QuantValue::Q2S,
        QuantValue::E4M3,
        QuantValue::E5M2,
        QuantValue::E2M1,
    ] {
        let scheme = q8(value, QuantLevel::Tensor);
        assert!(!supported(scheme), "{value:?} must not be supported");
    }
    assert!(!supported(q8(QuantValue::Q8S, QuantLevel::Block(BlockSize::new([0])))));
}

#[test]
fn q_from_data_rejects_unsupported_schemes_before_touching_the_device() {
    // GPU 999 never exists: these must fail on the scheme, not on the device.
    let device = CudnnDevice::new(999);
    let q4 = q8(QuantValue::Q4S, QuantLevel::Tensor);
    let data = TensorData::quantized(vec![1i8, -2, 3, 4], [4], q4, &[0.5]);
    let msg = expect_panic("q_from_data Q4S", || Cudnn::q_from_data(data, &device));
    assert!(
        msg.starts_with("cudnn-backend: quantization scheme") && msg.contains("not supported by q_from_data"),
        "{msg}"
    );
    assert!(msg.contains("supported: symmetric Q8F/Q8S"), "{msg}");

    let msg = expect_panic("q_from_data of float data", || {
        Cudnn::q_from_data(TensorData::from([1.0f32, 2.0]), &device)
    });
    assert!(msg.starts_with("cudnn-backend: q_from_data:"), "{msg}");

    // A block size that does not divide the tensor.
    let block = q8(QuantValue::Q8S, QuantLevel::Block(BlockSize::new([4])));
    let data = TensorData::quantized(vec![1i8; 6], [6], block, &[0.5]);
    let msg = expect_panic("q_from_data bad block", || Cudnn::q_from_data(data, &device));
    assert!(
        msg.starts_with("cudnn-backend: q_from_data:") && msg.contains("block"),
        "{msg}"
    );
}

#[test]
fn quantized_round_trip_on_gpu_or_device_error() {
    let scheme = q8(QuantValue::Q8S, QuantLevel::Block(BlockSize::new([2])));
    let data = TensorData::quantized(vec![1i8, -2, 3, 127, 0, -127], [2, 3], scheme, &[0.5, 0.25, 0.0]);
    let device = CudnnDevice::default();
    if !has_gpu() {
        let msg = expect_panic("q_from_data without GPU", || Cudnn::q_from_data(data, &device));
        assert!(msg.starts_with("cudnn-backend:"), "{msg}");
        return;
    }
    let q = Cudnn::q_from_data(data.clone(), &device);
    let back = read_sync(Cudnn::q_into_data(q)).expect("q_into_data");
    assert_eq!(back.dtype, data.dtype);
    assert_eq!(back.shape, data.shape);
    assert_eq!(back.as_bytes(), data.as_bytes());
}

#[test]
fn empty_transaction_needs_no_device() {
    let tr = TransactionPrimitive::<Cudnn>::new(vec![], vec![], vec![], vec![]);
    let data = read_sync(Cudnn::tr_execute(tr)).expect("empty transaction");
    assert!(data.read_floats.is_empty() && data.read_qfloats.is_empty());
    assert!(data.read_ints.is_empty() && data.read_bools.is_empty());
}

#[test]
fn names_and_device_ids() {
    assert_eq!(Cudnn::name(&CudnnDevice::new(3)), "cudnn<gpu:3>");
    assert_eq!(Cudnn::name(&CudnnDevice::default()), "cudnn<gpu:0>");
    assert_eq!(CudnnDevice::default(), CudnnDevice::new(0));

    let device = CudnnDevice::new(3);
    let id = device.to_id();
    assert_eq!(id.type_id, DEVICE_TYPE_ID);
    assert_eq!(id.index_id, 3);
    assert_eq!(<CudnnDevice as Device>::from_id(id), device);
    let other = DeviceId {
        type_id: DEVICE_TYPE_ID,
        index_id: 7,
    };
    assert_eq!(<CudnnDevice as Device>::from_id(other).to_id(), other);

    // No device of another backend's type; ours counts the GPUs (none here).
    assert_eq!(Cudnn::device_count(DEVICE_TYPE_ID.wrapping_add(1)), 0);
    let count = Cudnn::device_count(DEVICE_TYPE_ID);
    assert_eq!(count > 0, has_gpu(), "device_count {count} disagrees with try_open");
}
