//! The call ids a session has recorded, as this node remembers them: enough to answer "is this
//! call new?" without a store read, in memory that does not grow with the session's length.
//!
//! A call id is unique within a session, so before a call runs the node must know whether its
//! id is recorded (a retry: return the record, run nothing; other arguments: 409). Keeping every
//! id in a map cost ~0.9 KB per call — ~900 MB for a session of a million calls. What the node
//! needs from memory is only the *negative* answer: a retry needs its record from the store
//! anyway, while a new call (the common case) must not pay a store read. So the ids are kept as a
//! Bloom filter — no false negatives, about 1 % false positives — whose size grows with the
//! session up to a cap ([`crate::Limits::call_index_max_bytes`], 4 MiB by default):
//!
//! - `New`: the filter has never seen the id. The call runs with no store read.
//! - `Maybe`: the id is recorded, or a false positive. The store answers exactly, through its
//!   `(session_id, call_id)` index, in the read that a retry makes anyway.
//!
//! While a runtime's filter is being filled from the store (right after the runtime is made,
//! in the background, a page of ids at a time), every answer is `Maybe`: exact, at the price of a
//! read. This module must not decide anything about a call beyond that answer; the store is the
//! record.
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Ids the first layer of a filter holds at its target error rate: a short session costs
/// ~1.4 KB. Each later layer holds [`GROWTH`] times more.
const FIRST_LAYER_IDS: u64 = 1024;

/// How much larger each layer is than the one before: few layers (six for a million ids), so a
/// lookup probes few of them.
const GROWTH: u64 = 4;

/// False-positive rate of the first layer; each later layer halves it, so that the filter as a
/// whole stays under twice this (1 %) however many layers it has.
const FIRST_LAYER_ERROR: f64 = 0.005;

/// What the index knows about a call id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Never recorded in this session: run it, no store read needed.
    New,
    /// Perhaps recorded: ask the store.
    Maybe,
}

/// One session's call ids: a scalable Bloom filter, and whether it holds every recorded id yet.
pub(crate) struct CallIndex {
    filter: Mutex<Filter>,
    /// Set once the filter holds every id recorded before the runtime was made (ids recorded
    /// since are added as they are recorded). Until then every answer is [`Seen::Maybe`].
    complete: AtomicBool,
}

impl CallIndex {
    /// The index of a session that has no recorded call yet (or whose ids will all be added).
    pub(crate) fn complete(max_bytes: usize) -> Self {
        Self {
            filter: Mutex::new(Filter::new(max_bytes)),
            complete: AtomicBool::new(true),
        }
    }

    /// The index of a session whose recorded ids are still to be loaded ([`CallIndex::add_all`],
    /// then [`CallIndex::mark_complete`]).
    pub(crate) fn loading(max_bytes: usize) -> Self {
        Self {
            filter: Mutex::new(Filter::new(max_bytes)),
            complete: AtomicBool::new(false),
        }
    }

    pub(crate) fn seen(&self, call_id: &str) -> Seen {
        if !self.complete.load(Ordering::Acquire) {
            return Seen::Maybe;
        }
        match self.filter.lock() {
            Ok(f) if !f.may_contain(call_id) => Seen::New,
            _ => Seen::Maybe,
        }
    }

    /// Remembers a recorded call id.
    pub(crate) fn add(&self, call_id: &str) {
        if let Ok(mut f) = self.filter.lock() {
            f.insert(call_id);
        }
    }

    /// Remembers a page of recorded call ids (while loading).
    pub(crate) fn add_all<'a>(&self, call_ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut f) = self.filter.lock() {
            for id in call_ids {
                f.insert(id);
            }
        }
    }

    pub(crate) fn mark_complete(&self) {
        self.complete.store(true, Ordering::Release);
    }

    /// Bytes the filter holds (its bit arrays).
    pub(crate) fn bytes(&self) -> usize {
        self.filter.lock().map_or(0, |f| f.bytes())
    }
}

/// A scalable Bloom filter (Almeida et al., 2007): layers of growing size and tightening error
/// rate; an id is added to the newest layer, and looked for in all of them. A new layer is made
/// when the newest one is full, unless it would take the filter past `max_bytes`: then the
/// newest layer keeps taking ids beyond its capacity and the false-positive rate rises (more
/// calls ask the store), but memory does not.
struct Filter {
    /// Two independent keyed hashes (SipHash with random keys: ids a client chooses cannot be
    /// aimed at one bit pattern); bit `i` of an id is `h1 + i·h2` (Kirsch–Mitzenmacher).
    hashers: (std::hash::RandomState, std::hash::RandomState),
    layers: Vec<Layer>,
    max_bytes: usize,
}

struct Layer {
    bits: Box<[u64]>,
    /// Number of bits (`bits.len() * 64`).
    m: u64,
    /// Bits set per id.
    k: u32,
    /// Ids this layer holds at its target error rate.
    capacity: u64,
    ids: u64,
}

impl Layer {
    /// A layer for `capacity` ids at false-positive rate `error`, the bit array rounded up to
    /// whole 64-bit words, and cut to `max_bytes` (at least one word) when it would exceed it.
    fn new(capacity: u64, error: f64, max_bytes: usize) -> Self {
        let ln2 = std::f64::consts::LN_2;
        let bits_per_id = -error.ln() / (ln2 * ln2);
        let m_wanted = (capacity as f64 * bits_per_id).ceil() as u64;
        let max_words = u64::try_from(max_bytes / 8).unwrap_or(u64::MAX);
        let words = m_wanted.div_ceil(64).min(max_words).max(1);
        let k = (bits_per_id * ln2).round().clamp(1.0, 32.0) as u32;
        Self {
            bits: vec![0u64; usize::try_from(words).unwrap_or(usize::MAX)].into_boxed_slice(),
            m: words * 64,
            k,
            capacity,
            ids: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.bits.len() * 8
    }

    /// The bit positions of an id: `k` values spread over `0..m` by multiply-shift (no
    /// division).
    fn positions(m: u64, k: u32, (h1, h2): (u64, u64)) -> impl Iterator<Item = usize> {
        (0..u64::from(k)).map(move |i| {
            let h = h1.wrapping_add(i.wrapping_mul(h2));
            // Below `m`, which indexes an array in memory: it fits a usize.
            ((u128::from(h) * u128::from(m)) >> 64) as usize
        })
    }

    fn insert(&mut self, h: (u64, u64)) {
        for p in Self::positions(self.m, self.k, h) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
        self.ids += 1;
    }

    fn may_contain(&self, h: (u64, u64)) -> bool {
        Self::positions(self.m, self.k, h).all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }
}

impl Filter {
    fn new(max_bytes: usize) -> Self {
        Self {
            hashers: Default::default(),
            layers: Vec::new(),
            max_bytes,
        }
    }

    fn hash(&self, id: &str) -> (u64, u64) {
        // h2 odd: the k positions of an id never collapse onto one another.
        (self.hashers.0.hash_one(id), self.hashers.1.hash_one(id) | 1)
    }

    fn bytes(&self) -> usize {
        self.layers.iter().map(Layer::bytes).sum()
    }

    fn insert(&mut self, id: &str) {
        let h = self.hash(id);
        if self.layers.last().is_none_or(|l| l.ids >= l.capacity) {
            let n = self.layers.len() as i32;
            let capacity = FIRST_LAYER_IDS.saturating_mul(GROWTH.saturating_pow(n as u32));
            // Past the memory cap the newest layer takes the ids (its error rate rises); the
            // first layer is always made, cut to the cap if need be.
            let error = FIRST_LAYER_ERROR * 0.5f64.powi(n);
            if self.layers.is_empty() {
                self.layers
                    .push(Layer::new(capacity, error, self.max_bytes));
            } else {
                let next = Layer::new(capacity, error, usize::MAX);
                if self.bytes() + next.bytes() <= self.max_bytes {
                    self.layers.push(next);
                }
            }
        }
        if let Some(layer) = self.layers.last_mut() {
            layer.insert(h);
        }
    }

    fn may_contain(&self, id: &str) -> bool {
        let h = self.hash(id);
        // Newest first: a retry is most often of a recent call.
        self.layers.iter().rev().any(|l| l.may_contain(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn every_recorded_id_is_maybe_and_most_unseen_ids_are_new() {
        let index = CallIndex::complete(4 * MIB);
        for i in 0..100_000 {
            index.add(&format!("toolu_{i:08}"));
        }
        for i in 0..100_000 {
            assert_eq!(index.seen(&format!("toolu_{i:08}")), Seen::Maybe, "{i}");
        }
        let false_positives = (0..100_000)
            .filter(|i| index.seen(&format!("call_{i:08}")) == Seen::Maybe)
            .count();
        // Designed for under 1 %; 2 % leaves room for chance.
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }

    #[test]
    fn a_million_ids_take_a_few_megabytes() {
        let index = CallIndex::complete(4 * MIB);
        for i in 0..1_000_000 {
            index.add(&format!("toolu_{i:08}"));
        }
        let bytes = index.bytes();
        assert!(bytes <= 4 * MIB, "{bytes}");
        assert!(bytes > MIB, "sized for its ids: {bytes}");
        let false_positives = (0..100_000)
            .filter(|i| index.seen(&format!("call_{i:08}")) == Seen::Maybe)
            .count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }

    #[test]
    fn past_its_memory_cap_the_filter_stops_growing_and_still_has_no_false_negatives() {
        let index = CallIndex::complete(16 * 1024);
        for i in 0..50_000 {
            index.add(&format!("id-{i}"));
        }
        assert!(index.bytes() <= 16 * 1024, "{}", index.bytes());
        for i in 0..50_000 {
            assert_eq!(index.seen(&format!("id-{i}")), Seen::Maybe, "{i}");
        }
    }

    #[test]
    fn a_cap_below_one_layer_keeps_the_filter_to_it_without_false_negatives() {
        let index = CallIndex::complete(8);
        for i in 0..100 {
            index.add(&format!("id-{i}"));
        }
        assert_eq!(index.bytes(), 8);
        for i in 0..100 {
            assert_eq!(index.seen(&format!("id-{i}")), Seen::Maybe, "{i}");
        }
    }

    #[test]
    fn a_short_session_costs_a_few_kilobytes() {
        let index = CallIndex::complete(4 * MIB);
        for i in 0..1_000 {
            index.add(&format!("toolu_{i}"));
        }
        assert!(index.bytes() <= 2 * 1024, "{}", index.bytes());
    }

    #[test]
    fn an_empty_index_says_new_and_a_loading_one_says_maybe() {
        let empty = CallIndex::complete(4 * MIB);
        assert_eq!(empty.seen("a"), Seen::New);
        assert_eq!(empty.bytes(), 0);
        let loading = CallIndex::loading(4 * MIB);
        assert_eq!(loading.seen("a"), Seen::Maybe);
        loading.add_all(["b", "c"]);
        assert_eq!(loading.seen("a"), Seen::Maybe, "not complete yet");
        loading.mark_complete();
        assert_eq!(loading.seen("a"), Seen::New, "complete now");
        assert_eq!(loading.seen("b"), Seen::Maybe);
        assert_eq!(loading.seen("c"), Seen::Maybe);
    }
}
