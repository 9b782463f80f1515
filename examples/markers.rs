//! The procedural sequence task of the transformer examples (`train_transformer`,
//! `train_candle_transformer`): each sequence of background tokens hides one marker token more
//! often than the others, and the class is that marker (chance 10%).

/// Tokens: markers `0..CLASSES`, background `CLASSES..VOCAB`.
pub const VOCAB: usize = 64;
/// Classes (one marker token each).
pub const CLASSES: usize = 10;

/// The procedural set: `n` sequences of `seq` tokens and their classes.
pub struct Set {
    /// `n * seq` tokens, row-major.
    pub tokens: Vec<i64>,
    /// `n` classes.
    pub labels: Vec<i64>,
}

/// Background tokens `CLASSES..VOCAB`; marker `c` (the class) appears `seq / 10` times, every
/// other marker fewer times (0 to `seq / 20`), at random positions.
pub fn generate(n: usize, seq: usize, seed: u64) -> Set {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let (mut tokens, mut labels) = (Vec::with_capacity(n * seq), Vec::with_capacity(n));
    for _ in 0..n {
        let class = next(CLASSES);
        let mut s: Vec<i64> = (0..seq).map(|_| (CLASSES + next(VOCAB - CLASSES)) as i64).collect();
        for marker in 0..CLASSES {
            let count = if marker == class { seq / 10 } else { next(seq / 20 + 1) };
            for _ in 0..count {
                s[next(seq)] = marker as i64;
            }
        }
        // A later marker may overwrite an earlier one: recount and label the majority.
        let mut counts = [0usize; CLASSES];
        s.iter()
            .filter(|&&t| (t as usize) < CLASSES)
            .for_each(|&t| counts[t as usize] += 1);
        let label = (0..CLASSES).max_by_key(|&c| (counts[c], c == class)).unwrap_or(class);
        tokens.extend(s);
        labels.push(label as i64);
    }
    Set { tokens, labels }
}
