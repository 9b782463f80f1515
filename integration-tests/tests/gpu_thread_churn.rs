//! 2,000 short-lived threads, each running one convolution and exiting: the pool creates no
//! more cuDNN handles than the peak number of live threads. Workspaces of dropped streams
//! are released on request. Needs a CUDA GPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudnn_backend::graph::DataType;
use cudnn_backend::ops::{self, ConvParams};
use cudnn_backend::plan::cudnn_pool;
use cudnn_backend::runtime::{release_unused_workspaces, workspace_bytes};
use cudnn_backend::Device;
use cudnn_backend_reference::SplitMix64;
use integration_tests::{poisoned, random, strides, Layout};

const THREADS: usize = 2000;
const LIVE_AT_ONCE: usize = 24;

/// The tests run one at a time: the churn test counts the handles the whole process creates.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_thousand_threads_create_at_most_peak_live_handles() {
    let _serial = one_at_a_time();
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let s = dev.stream().clone();
    let mut rng = SplitMix64::new(5);
    let (xd, wd) = ([1i64, 8, 8, 8], [8i64, 8, 3, 3]);
    let x = Arc::new(random(&s, &mut rng, &xd, &strides(&xd, Layout::Nchw), DataType::F32));
    let w = Arc::new(random(&s, &mut rng, &wd, &strides(&wd, Layout::Nchw), DataType::F32));
    let live = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let before = cudnn_pool().created(0);
    let mut done = 0;
    while done < THREADS {
        let wave: Vec<_> = (0..LIVE_AT_ONCE.min(THREADS - done))
            .map(|_| {
                let (x, w, live, peak, dev) = (x.clone(), w.clone(), live.clone(), peak.clone(), dev.clone());
                std::thread::spawn(move || {
                    let n = live.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    let s = dev.stream();
                    let y = poisoned(s, &xd, &strides(&xd, Layout::Nchw), DataType::F32);
                    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
                    ops::conv_forward(s, &x.t, &w.t, &y.m, &p).expect("conv");
                    s.synchronize().expect("sync");
                    live.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        done += wave.len();
        for t in wave {
            t.join().expect("thread panicked");
        }
    }
    let created = cudnn_pool().created(0) - before;
    let peak = peak.load(Ordering::SeqCst);
    println!(
        "churn: {THREADS} threads, peak live {peak}, handles created {created}, available {}",
        cudnn_pool().available(0)
    );
    assert!(
        created <= peak,
        "created {created} handles for a peak of {peak} live threads"
    );
}

/// Streams that ran convolutions and were dropped leave workspaces behind until a new stream
/// arrives; `release_unused_workspaces` frees them at once, and the live stream keeps its own.
#[test]
#[ignore = "needs a CUDA GPU"]
fn workspaces_of_dropped_streams_are_released() {
    let _serial = one_at_a_time();
    let dev = Device::new(0).expect("needs a CUDA GPU");
    let keep = dev.context().new_stream().unwrap();
    let mut rng = SplitMix64::new(6);
    // A filter gradient on a cuDNN engine: its engines need workspace.
    let (dt, layout) = integration_tests::cudnn_conv_dtype();
    let (xd, wd) = ([8i64, 32, 30, 30], [32i64, 32, 3, 3]);
    let x = random(&keep, &mut rng, &xd, &strides(&xd, layout), dt);
    let dy = random(&keep, &mut rng, &xd, &strides(&xd, layout), dt);
    let dw = poisoned(&keep, &wd, &strides(&wd, layout), dt);
    let p = ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
    ops::conv_backward_filter(&keep, &x.t, &dy.t, &dw.m, &p).expect("conv");
    keep.synchronize().unwrap();
    // All four stay alive until the end: a new stream drops the slots of dead ones.
    let streams: Vec<_> = (0..4).map(|_| dev.context().new_stream().unwrap()).collect();
    let mut held = 0;
    for s in &streams {
        ops::conv_backward_filter(s, &x.t, &dy.t, &dw.m, &p).expect("conv");
        s.synchronize().unwrap();
        held += workspace_bytes(s);
    }
    drop(streams);
    let kept = workspace_bytes(&keep);
    assert!(held > 0, "the convolution used no workspace: the test shows nothing");
    let released = release_unused_workspaces(0);
    println!("workspaces: {held} bytes held by 4 dropped streams, {released} released, {kept} kept by the live stream");
    assert!(
        released >= held,
        "released {released} of the {held} bytes the dropped streams held"
    );
    assert_eq!(workspace_bytes(&keep), kept, "the live stream lost its workspace");
}
