//! 2,000 short-lived threads, each running one convolution and exiting: the pool creates no
//! more cuDNN handles than the peak number of live threads. Needs a CUDA GPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudnn_backend::graph::DataType;
use cudnn_backend::handle::cudnn_pool;
use cudnn_backend::ops::{self, ConvParams};
use cudnn_backend::reference::SplitMix64;
use cudnn_backend::Device;
use integration_tests::{poisoned, random, strides, Layout};

const THREADS: usize = 2000;
const LIVE_AT_ONCE: usize = 24;

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_thousand_threads_create_at_most_peak_live_handles() {
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
                    ops::conv_forward(s, &x.t, &w.t, &y.t, &p).expect("conv");
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
