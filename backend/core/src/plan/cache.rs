//! Plan and engine-choice caches.
//!
//! * [`PlanLru`]: a per-handle LRU of built plans, `signature → plan`. Built plans are not shared
//!   between threads: each pooled handle owns one `PlanLru`, so lookups take no lock.
//! * [`ChoiceCache`]: a bounded map `signature → EngineChoice` shared by all threads, with single
//!   flight (concurrent misses on one signature run one build). Its contents can be persisted
//!   with [`super::persist`].
//! * [`CacheStats`]: shared atomic counters for both.
//!
//! Keys are [`Signature`]s: the canonical signature bytes of a graph with a 64-bit hash computed
//! once, so hashing a key in a map costs nothing and equality compares bytes only on a hash match.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Default capacity of a [`PlanLru`] (plans per handle). A plan holds device-side state, so the
/// bound keeps memory in check while covering the distinct graphs of typical models.
pub const DEFAULT_PLAN_CACHE_CAPACITY: usize = 1024;

/// Default capacity of a [`ChoiceCache`] (engine choices per process). Choices are small.
pub const DEFAULT_CHOICE_CACHE_CAPACITY: usize = 16384;

/// Canonical signature bytes of a graph, with a precomputed 64-bit hash.
///
/// Cloning is cheap (the bytes are shared). `Hash` writes only the precomputed hash; `Eq`
/// compares the hash, then the bytes. The hash is deterministic (same bytes → same hash in every
/// process), but is not cryptographic.
#[derive(Clone)]
pub struct Signature {
    hash: u64,
    bytes: Arc<[u8]>,
}

/// Key of a cached plan or engine choice (alias of [`Signature`]).
pub type SignatureKey = Signature;

impl Signature {
    /// Builds a signature from owned bytes, hashing them once.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self::from_arc(bytes.into())
    }

    /// Builds a signature by copying `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self::from_arc(bytes.into())
    }

    /// Builds a signature from shared bytes, hashing them once.
    pub fn from_arc(bytes: Arc<[u8]>) -> Self {
        Self {
            hash: hash_bytes(&bytes),
            bytes,
        }
    }

    /// The signature bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The precomputed 64-bit hash of the bytes.
    pub fn hash64(&self) -> u64 {
        self.hash
    }

    /// Number of signature bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the signature has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl PartialEq for Signature {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for Signature {}

impl Hash for Signature {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({:016x}, {} bytes)", self.hash, self.bytes.len())
    }
}

impl From<Vec<u8>> for Signature {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl From<&[u8]> for Signature {
    fn from(bytes: &[u8]) -> Self {
        Self::from_bytes(bytes)
    }
}

/// Deterministic 64-bit hash: 8-byte words folded with a multiply-rotate, then a strong finalizer.
fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = (bytes.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K).rotate_left(29);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K).rotate_left(29);
    }
    // splitmix64 finalizer
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// Hasher for maps keyed by [`Signature`]: passes the precomputed hash through.
///
/// Other writes (not used by `Signature`) are folded in so it stays a valid hasher.
#[derive(Default, Clone, Copy, Debug)]
pub struct SignatureHasher(u64);

impl Hasher for SignatureHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = (self.0.rotate_left(5) ^ hash_bytes(bytes)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = if self.0 == 0 {
            value
        } else {
            (self.0.rotate_left(5) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
    }
}

/// `BuildHasher` for maps keyed by [`Signature`].
pub type BuildSignatureHasher = BuildHasherDefault<SignatureHasher>;

/// Shared hit/miss/build/eviction counters of the plan and choice caches.
///
/// All counters are relaxed atomics: cheap, and exact once the updating threads are quiescent.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// [`PlanLru::get`] calls that found a plan.
    pub plan_hits: AtomicU64,
    /// [`PlanLru::get`] calls that found nothing.
    pub plan_misses: AtomicU64,
    /// Plans evicted from a [`PlanLru`] to make room (capacity pressure only).
    pub plan_evictions: AtomicU64,
    /// [`ChoiceCache`] lookups that found a choice immediately.
    pub choice_hits: AtomicU64,
    /// [`ChoiceCache`] lookups that found nothing at first (they then built or waited).
    pub choice_misses: AtomicU64,
    /// Builder invocations by [`ChoiceCache::get_or_build`] (successful or not).
    pub choice_builds: AtomicU64,
    /// Callers of [`ChoiceCache::get_or_build`] that waited for another caller's build.
    pub choice_waits: AtomicU64,
    /// Choices evicted from a [`ChoiceCache`] to make room.
    pub choice_evictions: AtomicU64,
    /// Total time spent in builders run by [`ChoiceCache::get_or_build`], in nanoseconds.
    pub build_time_ns: AtomicU64,
    /// Repeated executions captured into CUDA graphs.
    pub replay_captures: AtomicU64,
    /// Captures that failed (the plan then runs without replay).
    pub replay_failures: AtomicU64,
    /// Executions served by launching a captured graph.
    pub replay_launches: AtomicU64,
}

/// Plain copy of [`CacheStats`] at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`CacheStats::plan_hits`].
    pub plan_hits: u64,
    /// See [`CacheStats::plan_misses`].
    pub plan_misses: u64,
    /// See [`CacheStats::plan_evictions`].
    pub plan_evictions: u64,
    /// See [`CacheStats::choice_hits`].
    pub choice_hits: u64,
    /// See [`CacheStats::choice_misses`].
    pub choice_misses: u64,
    /// See [`CacheStats::choice_builds`].
    pub choice_builds: u64,
    /// See [`CacheStats::choice_waits`].
    pub choice_waits: u64,
    /// See [`CacheStats::choice_evictions`].
    pub choice_evictions: u64,
    /// See [`CacheStats::build_time_ns`].
    pub build_time_ns: u64,
    /// See [`CacheStats::replay_captures`].
    pub replay_captures: u64,
    /// See [`CacheStats::replay_failures`].
    pub replay_failures: u64,
    /// See [`CacheStats::replay_launches`].
    pub replay_launches: u64,
}

impl CacheStats {
    /// New zeroed counters, ready to share.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Reads all counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            plan_hits: r(&self.plan_hits),
            plan_misses: r(&self.plan_misses),
            plan_evictions: r(&self.plan_evictions),
            choice_hits: r(&self.choice_hits),
            choice_misses: r(&self.choice_misses),
            choice_builds: r(&self.choice_builds),
            choice_waits: r(&self.choice_waits),
            choice_evictions: r(&self.choice_evictions),
            build_time_ns: r(&self.build_time_ns),
            replay_captures: r(&self.replay_captures),
            replay_failures: r(&self.replay_failures),
            replay_launches: r(&self.replay_launches),
        }
    }

    /// Sets all counters to zero.
    pub fn reset(&self) {
        for c in [
            &self.plan_hits,
            &self.plan_misses,
            &self.plan_evictions,
            &self.choice_hits,
            &self.choice_misses,
            &self.choice_builds,
            &self.choice_waits,
            &self.choice_evictions,
            &self.build_time_ns,
            &self.replay_captures,
            &self.replay_failures,
            &self.replay_launches,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

const NIL: usize = usize::MAX;

struct Node<V> {
    key: Signature,
    value: V,
    prev: usize,
    next: usize,
}

/// Index-linked LRU core (no unsafe): nodes in a `Vec`, a map from key to node index, and a
/// doubly linked recency list through indices. `head` is the most recently used node.
struct Lru<V> {
    map: HashMap<Signature, usize, BuildSignatureHasher>,
    nodes: Vec<Node<V>>,
    head: usize,
    tail: usize,
    capacity: usize,
}

impl<V> Lru<V> {
    fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::default(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn touch(&mut self, i: usize) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn find(&self, key: &Signature) -> Option<usize> {
        self.map.get(key).copied()
    }

    /// Removes node `i` (already anywhere in the list) and returns its key and value.
    fn remove_index(&mut self, i: usize) -> (Signature, V) {
        self.unlink(i);
        let last = self.nodes.len() - 1;
        if i != last {
            // The last node moves to index `i`: fix its neighbours and its map entry.
            let (prev, next) = (self.nodes[last].prev, self.nodes[last].next);
            if prev == NIL {
                self.head = i;
            } else {
                self.nodes[prev].next = i;
            }
            if next == NIL {
                self.tail = i;
            } else {
                self.nodes[next].prev = i;
            }
            if let Some(slot) = self.map.get_mut(&self.nodes[last].key) {
                *slot = i;
            }
        }
        let node = self.nodes.swap_remove(i);
        self.map.remove(&node.key);
        (node.key, node.value)
    }

    fn pop_lru(&mut self) -> Option<(Signature, V)> {
        (self.tail != NIL).then(|| self.remove_index(self.tail))
    }

    /// Inserts or replaces; returns (entry that left, whether it was a capacity eviction).
    fn insert(&mut self, key: Signature, value: V) -> Option<((Signature, V), bool)> {
        if let Some(i) = self.find(&key) {
            let old = std::mem::replace(&mut self.nodes[i].value, value);
            self.touch(i);
            return Some(((key, old), false));
        }
        if self.capacity == 0 {
            return Some(((key, value), false));
        }
        let evicted = if self.nodes.len() >= self.capacity {
            self.pop_lru()
        } else {
            None
        };
        let i = self.nodes.len();
        self.nodes.push(Node {
            key: key.clone(),
            value,
            prev: NIL,
            next: NIL,
        });
        self.map.insert(key, i);
        self.push_front(i);
        evicted.map(|e| (e, true))
    }

    fn set_capacity(&mut self, capacity: usize) -> Vec<(Signature, V)> {
        self.capacity = capacity;
        let mut evicted = Vec::new();
        while self.nodes.len() > capacity {
            match self.pop_lru() {
                Some(e) => evicted.push(e),
                None => break,
            }
        }
        evicted
    }

    fn clear(&mut self) {
        self.map.clear();
        self.nodes.clear();
        self.head = NIL;
        self.tail = NIL;
    }

    /// Keys and values from least to most recently used.
    fn iter_lru_first(&self) -> impl Iterator<Item = (&Signature, &V)> {
        let mut i = self.tail;
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let node = &self.nodes[i];
            i = node.prev;
            Some((&node.key, &node.value))
        })
    }
}

/// Per-handle LRU cache `signature → V` (for cuDNN: built execution plans).
///
/// Not synchronized: it lives inside a handle that one thread owns at a time. `get`, `insert`
/// and `remove` are O(1) (one map lookup plus index-linked list updates). Hits, misses and
/// capacity evictions are counted in the shared [`CacheStats`] given at construction.
pub struct PlanLru<V> {
    lru: Lru<V>,
    stats: Arc<CacheStats>,
}

impl<V> PlanLru<V> {
    /// New empty cache holding at most `capacity` entries (0 disables caching).
    pub fn new(capacity: usize, stats: Arc<CacheStats>) -> Self {
        Self {
            lru: Lru::new(capacity),
            stats,
        }
    }

    /// New empty cache with [`DEFAULT_PLAN_CACHE_CAPACITY`].
    pub fn with_default_capacity(stats: Arc<CacheStats>) -> Self {
        Self::new(DEFAULT_PLAN_CACHE_CAPACITY, stats)
    }

    /// Looks up `key`, marking it most recently used; counts a hit or a miss.
    pub fn get(&mut self, key: &Signature) -> Option<&mut V> {
        match self.lru.find(key) {
            Some(i) => {
                bump(&self.stats.plan_hits);
                self.lru.touch(i);
                Some(&mut self.lru.nodes[i].value)
            }
            None => {
                bump(&self.stats.plan_misses);
                None
            }
        }
    }

    /// Looks up `key` without changing recency or counters.
    pub fn peek(&self, key: &Signature) -> Option<&V> {
        self.lru.find(key).map(|i| &self.lru.nodes[i].value)
    }

    /// Whether `key` is cached (no recency or counter change).
    pub fn contains(&self, key: &Signature) -> bool {
        self.lru.find(key).is_some()
    }

    /// Inserts `value` under `key` as most recently used.
    ///
    /// Returns the entry that left the cache, if any: the previous value under `key` (a
    /// replacement, not counted as an eviction), or the least recently used entry evicted to make
    /// room (counted in `plan_evictions`). With capacity 0 the new entry itself is returned.
    pub fn insert(&mut self, key: Signature, value: V) -> Option<(Signature, V)> {
        let (entry, evicted) = self.lru.insert(key, value)?;
        if evicted {
            bump(&self.stats.plan_evictions);
        }
        Some(entry)
    }

    /// Returns the cached value for `key` (a hit), or builds, inserts and returns it (a miss).
    /// A builder error is returned and nothing is inserted. Needing a place for the value, this
    /// method treats capacity 0 as capacity 1.
    pub fn get_or_try_insert_with<E>(
        &mut self,
        key: &Signature,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<&mut V, E> {
        if let Some(i) = self.lru.find(key) {
            bump(&self.stats.plan_hits);
            self.lru.touch(i);
            return Ok(&mut self.lru.nodes[i].value);
        }
        bump(&self.stats.plan_misses);
        let value = build()?;
        while self.lru.len() >= self.lru.capacity.max(1) {
            if self.lru.pop_lru().is_none() {
                break;
            }
            bump(&self.stats.plan_evictions);
        }
        let i = self.lru.nodes.len();
        self.lru.nodes.push(Node {
            key: key.clone(),
            value,
            prev: NIL,
            next: NIL,
        });
        self.lru.map.insert(key.clone(), i);
        self.lru.push_front(i);
        Ok(&mut self.lru.nodes[i].value)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &Signature) -> Option<V> {
        let i = self.lru.find(key)?;
        Some(self.lru.remove_index(i).1)
    }

    /// Removes and returns the least recently used entry (not counted as an eviction).
    pub fn pop_lru(&mut self) -> Option<(Signature, V)> {
        self.lru.pop_lru()
    }

    /// Number of cached entries.
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.lru.len() == 0
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.lru.capacity
    }

    /// Changes the capacity; entries beyond it are evicted (least recently used first, counted
    /// in `plan_evictions`) and returned.
    pub fn set_capacity(&mut self, capacity: usize) -> Vec<(Signature, V)> {
        let evicted = self.lru.set_capacity(capacity);
        self.stats
            .plan_evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        evicted
    }

    /// Removes all entries (not counted as evictions).
    pub fn clear(&mut self) {
        self.lru.clear();
    }

    /// Keys from least to most recently used.
    pub fn keys_lru_first(&self) -> Vec<Signature> {
        self.lru.iter_lru_first().map(|(k, _)| k.clone()).collect()
    }

    /// The shared counters this cache reports into.
    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.stats
    }
}

impl<V> fmt::Debug for PlanLru<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanLru")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The engine configuration chosen for a graph signature (by heuristics or autotuning).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineChoice {
    /// Global engine index.
    pub engine_id: i64,
    /// Knob settings as `(knob type, value)` pairs.
    pub knobs: Vec<(i64, i64)>,
    /// Workspace the plan needs, in bytes.
    pub workspace_bytes: u64,
    /// Measured execution time in milliseconds, if autotuned.
    pub measured_ms: Option<f32>,
}

/// How [`ChoiceCache::get_or_build`] obtained its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Found in the cache at once.
    Hit,
    /// Built by this caller's builder.
    Built,
    /// Built by another caller while this one waited.
    Waited,
}

struct ChoiceInner {
    lru: Lru<EngineChoice>,
    /// Signatures whose build is in flight.
    building: HashMap<Signature, (), BuildSignatureHasher>,
}

/// Bounded map `signature → EngineChoice` shared by all threads, with single-flight builds.
///
/// Eviction is least-recently-used (a `get` or hit refreshes an entry). When several threads
/// miss on the same signature at once, one runs its builder while the others block, then all
/// receive the built value.
///
/// **Builder failure:** the error (or panic) goes to the caller whose builder failed; waiting
/// callers are woken and, finding no value, each retries with its own builder, one at a time
/// (single flight again). Nobody hangs.
pub struct ChoiceCache {
    inner: Mutex<ChoiceInner>,
    built: Condvar,
    stats: Arc<CacheStats>,
}

impl ChoiceCache {
    /// New empty cache holding at most `capacity` choices (0 disables storing).
    pub fn new(capacity: usize, stats: Arc<CacheStats>) -> Self {
        Self {
            inner: Mutex::new(ChoiceInner {
                lru: Lru::new(capacity),
                building: HashMap::default(),
            }),
            built: Condvar::new(),
            stats,
        }
    }

    /// New empty cache with [`DEFAULT_CHOICE_CACHE_CAPACITY`].
    pub fn with_default_capacity(stats: Arc<CacheStats>) -> Self {
        Self::new(DEFAULT_CHOICE_CACHE_CAPACITY, stats)
    }

    fn lock(&self) -> MutexGuard<'_, ChoiceInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns the choice for `key`, building it with `build` on a miss (single flight).
    ///
    /// The builder runs without the cache lock held. Its value is inserted and returned with
    /// [`Outcome::Built`]; callers that waited for it get [`Outcome::Waited`]. On a builder error
    /// see the type docs.
    pub fn get_or_build<E>(
        &self,
        key: &Signature,
        build: impl FnOnce() -> Result<EngineChoice, E>,
    ) -> Result<(EngineChoice, Outcome), E> {
        let mut inner = self.lock();
        let mut waited = false;
        loop {
            if let Some(i) = inner.lru.find(key) {
                inner.lru.touch(i);
                let value = inner.lru.nodes[i].value.clone();
                if waited {
                    return Ok((value, Outcome::Waited));
                }
                bump(&self.stats.choice_hits);
                return Ok((value, Outcome::Hit));
            }
            if !waited {
                bump(&self.stats.choice_misses);
            }
            if inner.building.contains_key(key) {
                if !waited {
                    bump(&self.stats.choice_waits);
                    waited = true;
                }
                inner = self.built.wait(inner).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            break;
        }
        // This caller builds.
        inner.building.insert(key.clone(), ());
        drop(inner);
        let mut flight = Flight {
            cache: self,
            key,
            value: None,
        };
        bump(&self.stats.choice_builds);
        let start = Instant::now();
        let result = build();
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.build_time_ns.fetch_add(ns, Ordering::Relaxed);
        match result {
            Ok(value) => {
                flight.value = Some(value.clone());
                drop(flight);
                Ok((value, Outcome::Built))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a choice for `key` is cached (no recency refresh, no counting).
    pub fn contains(&self, key: &Signature) -> bool {
        self.lock().lru.find(key).is_some()
    }

    /// Looks up `key` (refreshing its recency); counts a hit or a miss.
    pub fn get(&self, key: &Signature) -> Option<EngineChoice> {
        let mut inner = self.lock();
        match inner.lru.find(key) {
            Some(i) => {
                inner.lru.touch(i);
                bump(&self.stats.choice_hits);
                Some(inner.lru.nodes[i].value.clone())
            }
            None => {
                bump(&self.stats.choice_misses);
                None
            }
        }
    }

    /// Inserts or replaces the choice for `key`; returns the previous choice for `key`, if any.
    /// A capacity eviction is counted in `choice_evictions`.
    pub fn insert(&self, key: Signature, choice: EngineChoice) -> Option<EngineChoice> {
        let mut inner = self.lock();
        self.insert_locked(&mut inner, key, choice)
    }

    fn insert_locked(&self, inner: &mut ChoiceInner, key: Signature, choice: EngineChoice) -> Option<EngineChoice> {
        match inner.lru.insert(key, choice) {
            Some(((_, old), false)) => Some(old),
            Some((_, true)) => {
                bump(&self.stats.choice_evictions);
                None
            }
            None => None,
        }
    }

    /// Inserts many entries in order (later entries become more recently used), e.g. the output
    /// of [`super::persist::TuningFile::load`].
    pub fn extend(&self, entries: impl IntoIterator<Item = (Signature, EngineChoice)>) {
        let mut inner = self.lock();
        for (k, v) in entries {
            self.insert_locked(&mut inner, k, v);
        }
    }

    /// Removes the choice for `key`.
    pub fn remove(&self, key: &Signature) -> Option<EngineChoice> {
        let mut inner = self.lock();
        let i = inner.lru.find(key)?;
        Some(inner.lru.remove_index(i).1)
    }

    /// Number of stored choices.
    pub fn len(&self) -> usize {
        self.lock().lru.len()
    }

    /// Whether no choice is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maximum number of stored choices.
    pub fn capacity(&self) -> usize {
        self.lock().lru.capacity
    }

    /// Changes the capacity, evicting least recently used choices beyond it (counted).
    pub fn set_capacity(&self, capacity: usize) {
        let evicted = self.lock().lru.set_capacity(capacity);
        self.stats
            .choice_evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
    }

    /// Removes all stored choices (builds in flight still insert their result).
    pub fn clear(&self) {
        self.lock().lru.clear();
    }

    /// All stored choices, least recently used first (re-inserting them in this order, e.g. with
    /// [`ChoiceCache::extend`], restores the recency order).
    pub fn snapshot(&self) -> Vec<(Signature, EngineChoice)> {
        self.lock()
            .lru
            .iter_lru_first()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The shared counters this cache reports into.
    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.stats
    }
}

impl fmt::Debug for ChoiceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("ChoiceCache")
            .field("len", &inner.lru.len())
            .field("capacity", &inner.lru.capacity)
            .field("building", &inner.building.len())
            .finish()
    }
}

/// Ends a single-flight build: inserts the value (if any), clears the in-flight mark and wakes
/// waiters — also when the builder failed or panicked.
struct Flight<'a> {
    cache: &'a ChoiceCache,
    key: &'a Signature,
    value: Option<EngineChoice>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        inner.building.remove(self.key);
        if let Some(value) = self.value.take() {
            self.cache.insert_locked(&mut inner, self.key.clone(), value);
        }
        drop(inner);
        self.cache.built.notify_all();
    }
}
