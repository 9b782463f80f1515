//! CPU tests of `cudnn_backend::handle::pool` with a fake handle kind.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, OnceLock};
use std::thread;
use std::time::Duration;

use cudnn_backend::handle::pool::{DeviceThreadHandlePool, HandleKind};

#[derive(Default)]
struct Counters {
    creates: AtomicUsize,
    binds: AtomicUsize,
    drops: AtomicUsize,
    /// Creations to fail before succeeding again.
    fail_creates: AtomicUsize,
    /// Binds to fail before succeeding again.
    fail_binds: AtomicUsize,
    creating_now: AtomicUsize,
    max_creating: AtomicUsize,
    /// Set while the very first creation runs.
    first_in_progress: AtomicBool,
    /// Set if any creation overlapped the very first one.
    first_overlapped: AtomicBool,
}

#[derive(Default)]
struct FakeKind {
    c: Arc<Counters>,
    create_sleep: Duration,
}

#[derive(Debug, PartialEq)]
struct FakeError(&'static str);

struct FakeHandle {
    id: usize,
    device: usize,
    in_use: Arc<AtomicBool>,
    c: Arc<Counters>,
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        self.c.drops.fetch_add(1, Ordering::SeqCst);
    }
}

impl HandleKind for FakeKind {
    type Handle = FakeHandle;
    type Stream = u64;
    type Error = FakeError;

    fn create(&self, device: usize) -> Result<FakeHandle, FakeError> {
        let c = &self.c;
        let now = c.creating_now.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_creating.fetch_max(now, Ordering::SeqCst);
        if c.first_in_progress.load(Ordering::SeqCst) {
            c.first_overlapped.store(true, Ordering::SeqCst);
        }
        let is_first = c.creates.load(Ordering::SeqCst) == 0 && now == 1;
        if is_first {
            c.first_in_progress.store(true, Ordering::SeqCst);
        }
        if !self.create_sleep.is_zero() {
            thread::sleep(self.create_sleep);
        }
        if is_first {
            if c.creating_now.load(Ordering::SeqCst) != 1 {
                c.first_overlapped.store(true, Ordering::SeqCst);
            }
            c.first_in_progress.store(false, Ordering::SeqCst);
        }
        let fail = c
            .fail_creates
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        c.creating_now.fetch_sub(1, Ordering::SeqCst);
        if fail {
            return Err(FakeError("create failed"));
        }
        let id = c.creates.fetch_add(1, Ordering::SeqCst);
        Ok(FakeHandle {
            id,
            device,
            in_use: Arc::new(AtomicBool::new(false)),
            c: c.clone(),
        })
    }

    fn bind_stream(&self, _handle: &mut FakeHandle, _stream: u64) -> Result<(), FakeError> {
        if self
            .c
            .fail_binds
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(FakeError("bind failed"));
        }
        self.c.binds.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Marks a handle in use for its lifetime; panics if it already was (two owners at once).
struct InUse(Arc<AtomicBool>);

impl InUse {
    fn enter(h: &FakeHandle) -> Self {
        assert!(
            !h.in_use.swap(true, Ordering::SeqCst),
            "handle {} held by two users at once",
            h.id
        );
        InUse(h.in_use.clone())
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn pool() -> (Arc<DeviceThreadHandlePool<FakeKind>>, Arc<Counters>) {
    pool_with_sleep(Duration::ZERO)
}

fn pool_with_sleep(sleep: Duration) -> (Arc<DeviceThreadHandlePool<FakeKind>>, Arc<Counters>) {
    let c = Arc::new(Counters::default());
    let kind = FakeKind {
        c: c.clone(),
        create_sleep: sleep,
    };
    (Arc::new(DeviceThreadHandlePool::new(kind)), c)
}

fn use_once(pool: &DeviceThreadHandlePool<FakeKind>, device: usize) -> usize {
    pool.with_handle(device, 7, |h| {
        let _g = InUse::enter(h);
        assert_eq!(h.device, device);
        h.id
    })
    .unwrap()
}

#[test]
fn ten_thousand_threads_in_waves_of_16_create_at_most_16() {
    let (pool, c) = pool();
    for _ in 0..10_000 / 16 {
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let pool = pool.clone();
                thread::spawn(move || {
                    use_once(&pool, 0);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    assert!(pool.created(0) <= 16, "created {}", pool.created(0));
    assert_eq!(pool.available(0), pool.created(0));
    assert_eq!(c.creates.load(Ordering::SeqCst), pool.created(0));
    assert_eq!(c.drops.load(Ordering::SeqCst), 0);
}

#[test]
fn thread_on_two_devices_returns_both() {
    let (pool, _c) = pool();
    let p = pool.clone();
    thread::spawn(move || {
        use_once(&p, 0);
        use_once(&p, 1);
        assert_eq!(p.available(0), 0);
        assert_eq!(p.available(1), 0);
    })
    .join()
    .unwrap();
    assert_eq!(pool.created(0), 1);
    assert_eq!(pool.created(1), 1);
    assert_eq!(pool.available(0), 1);
    assert_eq!(pool.available(1), 1);
    let stats = pool.stats();
    assert_eq!(stats.created, 2);
    assert_eq!(stats.available, 2);
    assert_eq!(stats.devices.len(), 2);
    assert_eq!(stats.devices[0].device, 0);
    assert_eq!(stats.devices[1].device, 1);
}

#[test]
fn handles_are_reused_after_threads_exit() {
    let (pool, c) = pool();
    let wave = |pool: &Arc<DeviceThreadHandlePool<FakeKind>>| {
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    use_once(&pool, 3);
                    barrier.wait();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    };
    wave(&pool);
    let first = pool.created(3);
    assert!((1..=8).contains(&first));
    assert_eq!(pool.available(3), first);
    wave(&pool);
    assert_eq!(pool.created(3), first, "second wave created handles");
    assert_eq!(c.creates.load(Ordering::SeqCst), first);
}

#[test]
fn sixty_four_threads_hammering_get_distinct_handles() {
    let (pool, _c) = pool();
    let barrier = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|i| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for n in 0..300 {
                    let device = (i + n) % 2;
                    pool.with_handle(device, (n % 3) as u64, |h| {
                        let _g = InUse::enter(h);
                        assert_eq!(h.device, device);
                        std::hint::black_box(h.id);
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for d in 0..2 {
        assert!(pool.created(d) <= 64, "device {d}: {}", pool.created(d));
        assert_eq!(pool.available(d), pool.created(d));
    }
}

#[test]
fn bind_stream_only_when_stream_changes() {
    let (pool, c) = pool();
    let p = pool.clone();
    thread::spawn(move || {
        let binds = || c.binds.load(Ordering::SeqCst);
        p.with_handle(0, 1, |_| ()).unwrap();
        assert_eq!(binds(), 1, "first use binds");
        p.with_handle(0, 1, |_| ()).unwrap();
        assert_eq!(binds(), 1, "same stream: no rebind");
        p.with_handle(0, 2, |_| ()).unwrap();
        assert_eq!(binds(), 2, "stream changed");
        p.with_handle(0, 2, |_| ()).unwrap();
        assert_eq!(binds(), 2);
        // A failed bind propagates and forces a rebind next time.
        c.fail_binds.store(1, Ordering::SeqCst);
        assert_eq!(p.with_handle(0, 3, |_| ()).unwrap_err(), FakeError("bind failed"));
        p.with_handle(0, 3, |_| ()).unwrap();
        assert_eq!(binds(), 3);
        assert_eq!(p.created(0), 1);
    })
    .join()
    .unwrap();
    // The bound stream travels with the handle: another thread on stream 3 does not rebind.
    let c2 = pool.kind().c.clone();
    let p = pool.clone();
    thread::spawn(move || {
        p.with_handle(0, 3, |_| ()).unwrap();
        assert_eq!(c2.binds.load(Ordering::SeqCst), 3);
    })
    .join()
    .unwrap();
}

#[test]
fn first_handle_is_created_alone() {
    let (pool, c) = pool_with_sleep(Duration::from_millis(50));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                pool.with_handle(5, 0, |h| {
                    let _g = InUse::enter(h);
                    // Hold the handle so other threads must create their own.
                    thread::sleep(Duration::from_millis(20));
                })
                .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        !c.first_overlapped.load(Ordering::SeqCst),
        "another creation ran during the first one"
    );
    assert!(pool.created(5) >= 2);
    // After the first, creations run in parallel.
    assert!(c.max_creating.load(Ordering::SeqCst) >= 2);
}

#[test]
fn nested_with_handle_gets_a_different_handle() {
    let (pool, _c) = pool();
    let p = pool.clone();
    thread::spawn(move || {
        let (outer, inner) = p
            .with_handle(0, 1, |h1| {
                let _g1 = InUse::enter(h1);
                let inner = p
                    .with_handle(0, 1, |h2| {
                        let _g2 = InUse::enter(h2);
                        // Deeper nesting too.
                        let deepest = p.with_handle(0, 1, |h3| h3.id).unwrap();
                        assert_ne!(deepest, h2.id);
                        h2.id
                    })
                    .unwrap();
                (h1.id, inner)
            })
            .unwrap();
        assert_ne!(outer, inner);
        assert_eq!(p.created(0), 3);
        assert_eq!(p.available(0), 2, "nested handles go back to the pool");
        // The thread keeps its own handle.
        assert_eq!(use_once(&p, 0), outer);
    })
    .join()
    .unwrap();
    assert_eq!(pool.available(0), 3);
}

#[test]
fn create_error_propagates_and_later_call_succeeds() {
    let (pool, c) = pool();
    c.fail_creates.store(1, Ordering::SeqCst);
    let err = pool.with_handle(0, 1, |_| ()).unwrap_err();
    assert_eq!(err, FakeError("create failed"));
    assert_eq!(pool.created(0), 0);
    assert_eq!(pool.available(0), 0);
    assert_eq!(pool.with_handle(0, 1, |h| h.id).unwrap(), 0);
    assert_eq!(pool.created(0), 1);

    // A failing first creation does not strand threads waiting for it.
    let (pool, c) = pool_with_sleep(Duration::from_millis(20));
    c.fail_creates.store(1, Ordering::SeqCst);
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut errors = 0;
                loop {
                    match pool.with_handle(1, 0, |h| h.id) {
                        Ok(_) => return errors,
                        Err(_) => errors += 1,
                    }
                    assert!(errors < 3);
                }
            })
        })
        .collect();
    let errors: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(errors, 1);
    assert!(pool.created(1) >= 1 && pool.created(1) <= 4);
}

#[test]
fn panic_inside_f_does_not_lose_the_handle() {
    let (pool, c) = pool();
    let p = pool.clone();
    thread::spawn(move || {
        let first = use_once(&p, 0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.with_handle(0, 7, |h| {
                let _g = InUse::enter(h);
                panic!("boom");
            })
        }));
        assert!(r.is_err());
        assert_eq!(use_once(&p, 0), first, "thread keeps its handle");
        // Panic in a nested call: the nested handle goes back to the pool.
        let r = catch_unwind(AssertUnwindSafe(|| {
            p.with_handle(0, 7, |_| p.with_handle(0, 7, |_| panic!("nested boom")))
        }));
        assert!(r.is_err());
        assert_eq!(p.created(0), 2);
        assert_eq!(p.available(0), 1);
        assert_eq!(use_once(&p, 0), first);
    })
    .join()
    .unwrap();
    assert_eq!(pool.available(0), 2);
    assert_eq!(c.drops.load(Ordering::SeqCst), 0);
}

#[test]
fn dropped_pool_leaks_handles_and_thread_exit_is_quiet() {
    let (pool, c) = pool();
    let (tx, rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let p = pool.clone();
    let t = thread::spawn(move || {
        use_once(&p, 0);
        drop(p);
        ready_tx.send(()).unwrap();
        rx.recv().unwrap();
        // Window destructor runs at exit, after the pool is gone.
    });
    ready_rx.recv().unwrap(); // t holds its handle before the others start
    use_once(&pool, 0); // test thread's own handle
    let p2 = pool.clone();
    thread::spawn(move || {
        use_once(&p2, 0);
    })
    .join()
    .unwrap();
    assert_eq!(pool.available(0), 1);
    drop(pool);
    tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(c.drops.load(Ordering::SeqCst), 0, "handles must never be dropped");
}

static STATIC_POOL: OnceLock<DeviceThreadHandlePool<FakeKind>> = OnceLock::new();
static TEARDOWN_OK: AtomicBool = AtomicBool::new(false);

struct UsesPoolOnDrop;

impl Drop for UsesPoolOnDrop {
    fn drop(&mut self) {
        if let Some(pool) = STATIC_POOL.get() {
            let r = pool.with_handle(0, 9, |h| {
                let _g = InUse::enter(h);
                h.id
            });
            TEARDOWN_OK.store(r.is_ok(), Ordering::SeqCst);
        }
    }
}

thread_local! {
    static LATE: UsesPoolOnDrop = const { UsesPoolOnDrop };
}

#[test]
fn with_handle_during_thread_teardown_falls_back_to_pool() {
    let pool = STATIC_POOL.get_or_init(|| DeviceThreadHandlePool::new(FakeKind::default()));
    thread::spawn(|| {
        // Registered before the pool's window, so (usually) destroyed after it.
        LATE.with(|_| ());
        let pool = STATIC_POOL.get().unwrap();
        use_once(pool, 0);
    })
    .join()
    .unwrap();
    assert!(TEARDOWN_OK.load(Ordering::SeqCst));
    let created = pool.created(0);
    assert!((1..=2).contains(&created));
    assert_eq!(pool.available(0), created, "nothing lost at teardown");
}
