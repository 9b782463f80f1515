//! The checked launches an optimization made recently, by launch key.
//!
//! burn-fusion serves every run of the same operations with one optimization, so a pattern
//! such as Burn's batch-norm statistics executes at every layer, each with its own shapes. A
//! cache of one launch would repack (and recheck) it whenever two such layers alternate; this
//! one keeps the last [`ENTRIES`] keys, most recent first.

/// Keys kept per optimization: more than the distinct shapes one pattern meets in a step of
/// the usual networks (one per resolution and width).
const ENTRIES: usize = 8;

/// Values by key, the most recently used first; the key buffer is reused between executions
/// so that computing a key does not allocate.
#[derive(Clone, Debug)]
pub(crate) struct LaunchCache<T> {
    entries: Vec<(Vec<i64>, T)>,
    key: Vec<i64>,
}

impl<T> Default for LaunchCache<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            key: Vec::new(),
        }
    }
}

impl<T> LaunchCache<T> {
    /// The key buffer, emptied, for this execution's key.
    pub(crate) fn key_mut(&mut self) -> &mut Vec<i64> {
        self.key.clear();
        &mut self.key
    }

    /// The value kept for the key in [`LaunchCache::key_mut`]'s buffer, moved to the front.
    pub(crate) fn get(&mut self) -> Option<&mut T> {
        let at = self.entries.iter().position(|(k, _)| *k == self.key)?;
        if at > 0 {
            let hit = self.entries.remove(at);
            self.entries.insert(0, hit);
        }
        self.entries.first_mut().map(|(_, v)| v)
    }

    /// Keeps `value` for the key in the buffer (the least recently used key goes when full).
    pub(crate) fn insert(&mut self, value: T) -> &mut T {
        let entry = self.entry(value);
        self.put(entry);
        &mut self.entries[0].1
    }

    /// Removes the entry kept for the key in the buffer, to be [`LaunchCache::put`] back.
    pub(crate) fn take(&mut self) -> Option<(Vec<i64>, T)> {
        let at = self.entries.iter().position(|(k, _)| *k == self.key)?;
        Some(self.entries.remove(at))
    }

    /// A new entry of `value` under the key in the buffer, for [`LaunchCache::put`].
    pub(crate) fn entry(&self, value: T) -> (Vec<i64>, T) {
        (self.key.clone(), value)
    }

    /// Keeps `entry` as the most recently used (the least recently used goes when full).
    pub(crate) fn put(&mut self, entry: (Vec<i64>, T)) {
        self.entries.retain(|(k, _)| *k != entry.0);
        self.entries.truncate(ENTRIES - 1);
        self.entries.insert(0, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::{LaunchCache, ENTRIES};

    fn set_key(c: &mut LaunchCache<u32>, key: &[i64]) {
        c.key_mut().extend_from_slice(key);
    }

    #[test]
    fn alternating_keys_both_stay_cached() {
        let mut c = LaunchCache::default();
        set_key(&mut c, &[1, 2]);
        assert!(c.get().is_none());
        c.insert(10);
        set_key(&mut c, &[1, 3]);
        assert!(c.get().is_none());
        c.insert(11);
        for _ in 0..3 {
            set_key(&mut c, &[1, 2]);
            assert_eq!(c.get().copied(), Some(10));
            set_key(&mut c, &[1, 3]);
            assert_eq!(c.get().copied(), Some(11));
        }
    }

    #[test]
    fn the_least_recently_used_key_goes_first() {
        let mut c = LaunchCache::default();
        for k in 0..ENTRIES as i64 {
            set_key(&mut c, &[k]);
            c.insert(k as u32);
        }
        // Key 0 used again: key 1 is now the oldest.
        set_key(&mut c, &[0]);
        assert_eq!(c.get().copied(), Some(0));
        set_key(&mut c, &[100]);
        c.insert(100);
        set_key(&mut c, &[1]);
        assert!(c.get().is_none());
        for k in [0, 2, 100] {
            set_key(&mut c, &[k]);
            assert!(c.get().is_some(), "key {k}");
        }
    }

    #[test]
    fn a_taken_entry_put_back_is_the_most_recent() {
        let mut c = LaunchCache::default();
        for k in 0..3 {
            set_key(&mut c, &[k]);
            c.insert(k as u32);
        }
        set_key(&mut c, &[0]);
        let (key, v) = c.take().expect("kept");
        assert_eq!((key.as_slice(), v), (&[0i64][..], 0));
        assert!(c.get().is_none());
        c.put((key, 5));
        assert_eq!(c.entries[0], (vec![0], 5));
        set_key(&mut c, &[9]);
        assert!(c.take().is_none());
    }

    #[test]
    fn inserting_a_kept_key_replaces_its_value() {
        let mut c = LaunchCache::default();
        set_key(&mut c, &[7]);
        c.insert(1);
        set_key(&mut c, &[7]);
        c.insert(2);
        set_key(&mut c, &[7]);
        assert_eq!(c.get().copied(), Some(2));
        assert_eq!(c.entries.len(), 1);
    }
}
