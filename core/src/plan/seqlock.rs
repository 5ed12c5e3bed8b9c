//! Four words behind a sequence lock: readers copy them without writing anything shared (a
//! torn read is reported, never returned); a writer that finds the slot being written skips.
//! The selection cache's slots and the typed-key memo are arrays of these.

use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Four words and their sequence number (even: stable; odd: being written; 0: never written).
#[derive(Debug, Default)]
pub(crate) struct SeqWords {
    seq: AtomicU64,
    words: [AtomicU64; 4],
}

impl SeqWords {
    /// The words, unless never written or written while being read.
    #[inline]
    pub(crate) fn read(&self) -> Option<[u64; 4]> {
        let before = self.seq.load(Ordering::Acquire);
        if before == 0 || before & 1 == 1 {
            return None;
        }
        let w: [u64; 4] = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == before).then_some(w)
    }

    /// Stores `w`; false (nothing written) when another writer holds the slot.
    pub(crate) fn write(&self, w: [u64; 4]) -> bool {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 || self.seq.compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        fence(Ordering::Release);
        for (slot, v) in self.words.iter().zip(w) {
            slot.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reads_nothing_until_written_then_the_last_write() {
        let s = SeqWords::default();
        assert_eq!(s.read(), None);
        assert!(s.write([1, 2, 3, 4]));
        assert!(s.write([5, 6, 7, 8]));
        assert_eq!(s.read(), Some([5, 6, 7, 8]));
    }
}
