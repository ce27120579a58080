//! A bit per address (or port) of a range: the allocator's in-memory view of what is taken.
//!
//! It is a hint, kept current from the allocation keys in storage: the storage transaction
//! (`Absent` compare on the key) is what guarantees an address is never handed out twice.

/// A fixed-size bitmap with a wrapping search for a clear bit.
#[derive(Debug, Clone)]
pub struct Bitmap {
    words: Vec<u64>,
    size: usize,
}

impl Bitmap {
    /// `size` clear bits.
    pub fn new(size: usize) -> Self {
        Bitmap {
            words: vec![0; size.div_ceil(64)],
            size,
        }
    }

    /// Sets or clears bit `i` (ignored when out of range).
    pub fn set(&mut self, i: usize, taken: bool) {
        if i >= self.size {
            return;
        }
        let (word, bit) = (i / 64, i % 64);
        if taken {
            self.words[word] |= 1 << bit;
        } else {
            self.words[word] &= !(1 << bit);
        }
    }

    /// Whether bit `i` is set.
    #[cfg(test)]
    pub fn get(&self, i: usize) -> bool {
        i < self.size && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Clears every bit.
    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    /// The first clear bit in `low..=high` at or after `start`, wrapping around to `low`.
    /// Skips full words, so a crowded range costs one step per 64 bits, not per bit.
    pub fn find_clear(&self, low: usize, high: usize, start: usize) -> Option<usize> {
        if low > high || high >= self.size {
            return None;
        }
        let start = start.clamp(low, high);
        self.scan(start, high)
            .or_else(|| self.scan(low, start.saturating_sub(1).max(low)))
            .filter(|i| *i >= low && *i <= high)
    }

    fn scan(&self, from: usize, to: usize) -> Option<usize> {
        let mut i = from;
        while i <= to {
            let word = self.words[i / 64];
            if word == u64::MAX && i.is_multiple_of(64) && i + 63 <= to {
                i += 64;
                continue;
            }
            if word & (1 << (i % 64)) == 0 {
                return Some(i);
            }
            i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_next_clear_bit_and_wraps() {
        let mut bitmap = Bitmap::new(200);
        for i in 0..200 {
            bitmap.set(i, true);
        }
        bitmap.set(10, false);
        assert_eq!(bitmap.find_clear(0, 199, 150), Some(10));
        assert_eq!(bitmap.find_clear(11, 199, 150), None);
        bitmap.set(170, false);
        assert_eq!(bitmap.find_clear(0, 199, 150), Some(170));
        assert!(bitmap.get(11) && !bitmap.get(10));
    }

    #[test]
    fn a_full_bitmap_has_no_clear_bit() {
        let mut bitmap = Bitmap::new(65_536);
        for i in 0..65_536 {
            bitmap.set(i, true);
        }
        assert_eq!(bitmap.find_clear(1, 65_534, 30_000), None);
    }
}
