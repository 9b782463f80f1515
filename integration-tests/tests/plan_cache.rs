//! CPU tests of `cudnn_backend::plan::cache`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use cudnn_backend::plan::cache::{
    CacheStats, ChoiceCache, EngineChoice, Outcome, PlanLru, Signature, StatsSnapshot, DEFAULT_PLAN_CACHE_CAPACITY,
};

fn sig(n: u32) -> Signature {
    Signature::new(format!("graph-{n}").into_bytes())
}

fn choice(engine_id: i64) -> EngineChoice {
    EngineChoice {
        engine_id,
        knobs: vec![(1, engine_id), (3, 0)],
        workspace_bytes: 4096 * engine_id as u64,
        measured_ms: Some(0.25),
    }
}

#[test]
fn signature_hash_and_equality() {
    let a = Signature::new(b"abcdefghijk".to_vec());
    let b = Signature::from_bytes(b"abcdefghijk");
    assert_eq!(a, b);
    assert_eq!(a.hash64(), b.hash64());
    assert_eq!(a.as_bytes(), b"abcdefghijk");
    assert_eq!(a.len(), 11);
    let h = |s: &Signature| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    assert_eq!(h(&a), h(&b));
    assert_ne!(a, Signature::from_bytes(b"abcdefghijl"));
    assert!(Signature::from_bytes(b"").is_empty());
    // Hashes of many distinct short keys are distinct.
    let hashes: HashSet<u64> = (0..10_000u32)
        .map(|i| Signature::new(i.to_le_bytes().to_vec()).hash64())
        .collect();
    assert_eq!(hashes.len(), 10_000);
}

#[test]
fn lru_order_and_eviction_counting() {
    let stats = CacheStats::new();
    let mut lru = PlanLru::new(3, stats.clone());
    assert_eq!(lru.capacity(), 3);
    assert!(lru.insert(sig(1), "a").is_none());
    assert!(lru.insert(sig(2), "b").is_none());
    assert!(lru.insert(sig(3), "c").is_none());
    assert_eq!(lru.get(&sig(1)), Some(&mut "a")); // 1 is now most recent
    let evicted = lru.insert(sig(4), "d").unwrap();
    assert_eq!(evicted, (sig(2), "b"));
    assert_eq!(lru.len(), 3);
    assert!(lru.get(&sig(2)).is_none());
    assert_eq!(lru.keys_lru_first(), vec![sig(3), sig(1), sig(4)]);
    // Replacing is not an eviction.
    assert_eq!(lru.insert(sig(3), "c2"), Some((sig(3), "c")));
    assert_eq!(lru.keys_lru_first(), vec![sig(1), sig(4), sig(3)]);
    assert_eq!(lru.peek(&sig(1)), Some(&"a"));
    assert_eq!(lru.remove(&sig(4)), Some("d"));
    assert_eq!(lru.len(), 2);
    let s = stats.snapshot();
    assert_eq!(s.plan_hits, 1);
    assert_eq!(s.plan_misses, 1);
    assert_eq!(s.plan_evictions, 1);
}

#[test]
fn lru_capacity_change() {
    let stats = CacheStats::new();
    let mut lru = PlanLru::with_default_capacity(stats.clone());
    assert_eq!(lru.capacity(), DEFAULT_PLAN_CACHE_CAPACITY);
    for i in 0..5 {
        lru.insert(sig(i), i);
    }
    lru.get(&sig(0));
    let evicted = lru.set_capacity(2);
    let keys: Vec<_> = evicted.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![sig(1), sig(2), sig(3)]);
    assert_eq!(lru.keys_lru_first(), vec![sig(4), sig(0)]);
    assert_eq!(stats.snapshot().plan_evictions, 3);
    lru.set_capacity(10);
    for i in 10..18 {
        lru.insert(sig(i), i);
    }
    assert_eq!(lru.len(), 10);
    // Capacity 0 disables caching.
    lru.set_capacity(0);
    assert!(lru.is_empty());
    assert_eq!(lru.insert(sig(1), 1), Some((sig(1), 1)));
    assert!(lru.is_empty());
}

#[test]
fn lru_get_or_try_insert_with() {
    let stats = CacheStats::new();
    let mut lru = PlanLru::new(2, stats.clone());
    let builds = AtomicUsize::new(0);
    let build = |v: u32| {
        builds.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(v)
    };
    assert_eq!(*lru.get_or_try_insert_with(&sig(1), || build(1)).unwrap(), 1);
    assert_eq!(*lru.get_or_try_insert_with(&sig(1), || build(9)).unwrap(), 1);
    assert!(lru.get_or_try_insert_with(&sig(2), || Err(())).is_err());
    assert!(!lru.contains(&sig(2)));
    lru.get_or_try_insert_with(&sig(2), || build(2)).unwrap();
    lru.get_or_try_insert_with(&sig(3), || build(3)).unwrap();
    assert_eq!(lru.keys_lru_first(), vec![sig(2), sig(3)]);
    assert_eq!(builds.load(Ordering::SeqCst), 3);
    let s = stats.snapshot();
    assert_eq!((s.plan_hits, s.plan_misses, s.plan_evictions), (1, 4, 1));
}

/// Randomized comparison with a simple model (a Vec ordered least to most recent).
#[test]
fn lru_matches_model_under_random_operations() {
    let stats = CacheStats::new();
    let mut lru = PlanLru::new(8, stats);
    let mut model: Vec<(u32, u64)> = Vec::new();
    let mut cap = 8usize;
    let mut seed: u64 = 0x1234_5678;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    for step in 0..20_000u64 {
        let k = next() % 20;
        match next() % 10 {
            0..=3 => {
                let got = lru.get(&sig(k)).map(|v| *v);
                let want = model.iter().position(|e| e.0 == k).map(|p| {
                    let e = model.remove(p);
                    model.push(e);
                    e.1
                });
                assert_eq!(got, want, "step {step}");
            }
            4..=7 => {
                lru.insert(sig(k), step);
                if let Some(p) = model.iter().position(|e| e.0 == k) {
                    model.remove(p);
                } else if model.len() >= cap && cap > 0 {
                    model.remove(0);
                }
                if cap > 0 {
                    model.push((k, step));
                }
            }
            8 => {
                let got = lru.remove(&sig(k));
                let want = model.iter().position(|e| e.0 == k).map(|p| model.remove(p).1);
                assert_eq!(got, want);
            }
            _ => {
                if next() % 20 == 0 {
                    cap = (next() % 12) as usize;
                    lru.set_capacity(cap);
                    while model.len() > cap {
                        model.remove(0);
                    }
                }
            }
        }
        assert_eq!(lru.len(), model.len());
    }
    let keys: Vec<_> = model.iter().map(|e| sig(e.0)).collect();
    assert_eq!(lru.keys_lru_first(), keys);
}

#[test]
fn single_flight_64_threads_one_build() {
    let stats = CacheStats::new();
    let cache = Arc::new(ChoiceCache::new(100, stats.clone()));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(64));
    let key = sig(42);
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (cache, builds, barrier, key) = (cache.clone(), builds.clone(), barrier.clone(), key.clone());
            thread::spawn(move || {
                barrier.wait();
                let (value, outcome) = cache
                    .get_or_build(&key, || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(20));
                        Ok::<_, String>(choice(7))
                    })
                    .unwrap();
                assert_eq!(value, choice(7));
                outcome
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let built = outcomes.iter().filter(|o| **o == Outcome::Built).count();
    assert_eq!(built, 1);
    let s = stats.snapshot();
    assert_eq!(s.choice_builds, 1);
    assert_eq!(s.choice_waits + s.choice_hits, 63);
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Waited).count() as u64,
        s.choice_waits
    );
    assert!(s.build_time_ns >= 20_000_000);
    assert_eq!(cache.len(), 1);
}

#[test]
fn different_keys_build_in_parallel() {
    let cache = Arc::new(ChoiceCache::new(100, CacheStats::new()));
    let running = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let start = Instant::now();
    let threads: Vec<_> = (0..8u32)
        .map(|i| {
            let (cache, running, max_running, barrier) =
                (cache.clone(), running.clone(), max_running.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let (_, outcome) = cache
                    .get_or_build(&sig(i), || {
                        let n = running.fetch_add(1, Ordering::SeqCst) + 1;
                        max_running.fetch_max(n, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(100));
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, ()>(choice(i as i64))
                    })
                    .unwrap();
                assert_eq!(outcome, Outcome::Built);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        max_running.load(Ordering::SeqCst) >= 2,
        "builds of different keys never overlapped"
    );
    let _ = start; // wall time is not asserted: a loaded machine stretches it
    assert_eq!(cache.len(), 8);
    assert_eq!(cache.stats().snapshot().choice_builds, 8);
}

#[test]
fn builder_error_does_not_hang_waiters() {
    let stats = CacheStats::new();
    let cache = Arc::new(ChoiceCache::new(100, stats.clone()));
    let attempts = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (cache, attempts, barrier) = (cache.clone(), attempts.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                cache.get_or_build(&sig(1), || {
                    let n = attempts.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(30));
                    if n == 0 {
                        Err("first build fails")
                    } else {
                        Ok(choice(3))
                    }
                })
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1);
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "one failure, one retry");
    for r in results.iter().flatten() {
        assert_eq!(r.0, choice(3));
    }
    assert_eq!(stats.snapshot().choice_builds, 2);
}

#[test]
fn builder_panic_does_not_hang_waiters() {
    let cache = Arc::new(ChoiceCache::new(100, CacheStats::new()));
    // The other threads start only once thread 0 is inside its builder, so thread 0 is
    // always the builder and they are always waiters (no timing assumption).
    let building = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (cache, building) = (cache.clone(), building.clone());
            thread::spawn(move || {
                if i == 0 {
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        cache.get_or_build(&sig(9), || -> Result<EngineChoice, ()> {
                            building.wait();
                            thread::sleep(Duration::from_millis(30));
                            panic!("builder panicked")
                        })
                    }));
                    r.is_err()
                } else {
                    building.wait();
                    let (v, _) = cache.get_or_build(&sig(9), || Ok::<_, ()>(choice(4))).unwrap();
                    v == choice(4)
                }
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap());
    }
    assert_eq!(cache.get(&sig(9)), Some(choice(4)));
}

#[test]
fn bounded_choice_cache_evicts() {
    let stats = CacheStats::new();
    let cache = ChoiceCache::new(4, stats.clone());
    for i in 0..10 {
        cache.insert(sig(i), choice(i as i64));
    }
    assert_eq!(cache.len(), 4);
    assert_eq!(cache.capacity(), 4);
    assert_eq!(stats.snapshot().choice_evictions, 6);
    assert_eq!(cache.get(&sig(6)), Some(choice(6))); // refresh 6
    cache.insert(sig(10), choice(10)); // evicts 7
    let keys: Vec<_> = cache.snapshot().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![sig(8), sig(9), sig(6), sig(10)]);
    assert_eq!(cache.insert(sig(8), choice(80)), Some(choice(8)));
    assert_eq!(cache.remove(&sig(9)), Some(choice(9)));
    cache.set_capacity(1);
    assert_eq!(cache.len(), 1);
    cache.clear();
    assert!(cache.is_empty());
}

#[test]
fn stats_snapshot_values_and_reset() {
    let stats = CacheStats::new();
    let cache = ChoiceCache::new(2, stats.clone());
    let mut lru: PlanLru<u8> = PlanLru::new(1, stats.clone());
    assert!(cache.get(&sig(1)).is_none()); // miss
    let (_, o) = cache.get_or_build(&sig(1), || Ok::<_, ()>(choice(1))).unwrap();
    assert_eq!(o, Outcome::Built); // miss + build
    let (_, o) = cache.get_or_build(&sig(1), || Ok::<_, ()>(choice(2))).unwrap();
    assert_eq!(o, Outcome::Hit);
    cache.insert(sig(2), choice(2));
    cache.insert(sig(3), choice(3)); // evicts 1
    lru.insert(sig(1), 1);
    lru.get(&sig(1));
    lru.get(&sig(2));
    lru.insert(sig(2), 2);
    let s = stats.snapshot();
    assert_eq!(s.plan_hits, 1);
    assert_eq!(s.plan_misses, 1);
    assert_eq!(s.plan_evictions, 1);
    assert_eq!(s.choice_hits, 1);
    assert_eq!(s.choice_misses, 2);
    assert_eq!(s.choice_builds, 1);
    assert_eq!(s.choice_waits, 0);
    assert_eq!(s.choice_evictions, 1);
    stats.reset();
    assert_eq!(stats.snapshot(), StatsSnapshot::default());
}
