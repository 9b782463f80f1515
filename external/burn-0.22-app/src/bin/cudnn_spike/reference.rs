//! Host inputs and the float64 reference the GPU results are judged against.
//!
//! Inputs are uniform random (never zeros) from a fixed-seed SplitMix64, so every run of
//! every mode sees the same values; for bf16 runs they are rounded to bf16 on the host first,
//! so the reference convolves exactly the values the GPU reads. The reference is a direct
//! float64 convolution: over the whole output for the small shapes, and over a fixed random
//! sample of output points for the large ones (each point costs C·R·S products).

use burn::tensor::bf16;

/// SplitMix64: small, seedable, the same sequence on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-scale, scale).
    pub fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * unit - 1.0) * scale
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `n` values uniform in [-scale, scale), rounded to bf16 when `bf16_exact`.
pub fn random_values(rng: &mut Rng, n: usize, scale: f32, bf16_exact: bool) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = rng.uniform(scale);
            if bf16_exact {
                bf16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect()
}

/// An NCHW convolution without bias or groups: x `[n, c, h, w]`, weights `[k, c, r, s]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: usize,
    pub pad: usize,
}

impl ConvShape {
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.pad - self.r) / self.stride + 1
    }

    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.pad - self.s) / self.stride + 1
    }

    pub fn x_len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }

    pub fn w_len(&self) -> usize {
        self.k * self.c * self.r * self.s
    }

    pub fn y_len(&self) -> usize {
        self.n * self.k * self.out_h() * self.out_w()
    }

    /// A short label, e.g. `64->64 3x3 s1 56x56`.
    pub fn label(&self) -> String {
        format!(
            "{}->{} {}x{} s{} {}x{}",
            self.c, self.k, self.r, self.s, self.stride, self.h, self.w
        )
    }

    /// One output element `y[n, k, oh, ow]` in float64.
    pub fn point(&self, x: &[f32], wt: &[f32], n: usize, k: usize, oh: usize, ow: usize) -> f64 {
        let mut acc = 0f64;
        for c in 0..self.c {
            for i in 0..self.r {
                let ih = (oh * self.stride + i) as isize - self.pad as isize;
                if ih < 0 || ih >= self.h as isize {
                    continue;
                }
                for j in 0..self.s {
                    let iw = (ow * self.stride + j) as isize - self.pad as isize;
                    if iw < 0 || iw >= self.w as isize {
                        continue;
                    }
                    let xv = x[((n * self.c + c) * self.h + ih as usize) * self.w + iw as usize];
                    let wv = wt[((k * self.c + c) * self.r + i) * self.s + j];
                    acc += xv as f64 * wv as f64;
                }
            }
        }
        acc
    }

    /// The whole output in float64, NCHW.
    pub fn full(&self, x: &[f32], wt: &[f32]) -> Vec<f64> {
        let (oh, ow) = (self.out_h(), self.out_w());
        let mut y = Vec::with_capacity(self.y_len());
        for n in 0..self.n {
            for k in 0..self.k {
                for i in 0..oh {
                    for j in 0..ow {
                        y.push(self.point(x, wt, n, k, i, j));
                    }
                }
            }
        }
        y
    }

    /// `count` output indices (flat, NCHW) drawn with a fixed seed: the same in every run.
    pub fn sample(&self, count: usize) -> Vec<usize> {
        let mut rng = Rng::new(0x5A3D_1E5E_ED00_0001);
        (0..count.min(self.y_len())).map(|_| rng.below(self.y_len())).collect()
    }

    /// The float64 value of flat output index `idx`.
    pub fn at(&self, x: &[f32], wt: &[f32], idx: usize) -> f64 {
        let (oh, ow) = (self.out_h(), self.out_w());
        let j = idx % ow;
        let i = (idx / ow) % oh;
        let k = (idx / (ow * oh)) % self.k;
        let n = idx / (ow * oh * self.k);
        self.point(x, wt, n, k, i, j)
    }
}

/// ‖got − want‖₂ / ‖want‖₂.
pub fn rel_l2(got: impl Iterator<Item = f64>, want: impl Iterator<Item = f64>) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.zip(want) {
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// ‖v‖₂ in float64: a stable summary of a whole output, comparable across runs.
pub fn l2(v: &[f32]) -> f64 {
    v.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_hand_computed_convolution() {
        // y[i, j] = x[i, j] - x[i + 1, j + 1] = -4 over x = 1..9 (3x3).
        let s = ConvShape {
            n: 1,
            c: 1,
            h: 3,
            w: 3,
            k: 1,
            r: 2,
            s: 2,
            stride: 1,
            pad: 0,
        };
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        assert_eq!(s.full(&x, &[1.0, 0.0, 0.0, -1.0]), vec![-4.0; 4]);
    }

    #[test]
    fn padding_and_stride() {
        // A 3x3 window of ones at stride 2 over a padded 2x2 of ones covers the four inputs once.
        let s = ConvShape {
            n: 1,
            c: 1,
            h: 2,
            w: 2,
            k: 1,
            r: 3,
            s: 3,
            stride: 2,
            pad: 1,
        };
        assert_eq!((s.out_h(), s.out_w()), (1, 1));
        assert_eq!(s.full(&[1.0; 4], &[1.0; 9]), vec![4.0]);
    }

    #[test]
    fn sampled_points_are_points_of_the_full_output() {
        let s = ConvShape {
            n: 2,
            c: 3,
            h: 7,
            w: 5,
            k: 4,
            r: 3,
            s: 3,
            stride: 2,
            pad: 1,
        };
        let mut rng = Rng::new(7);
        let x = random_values(&mut rng, s.x_len(), 1.0, false);
        let w = random_values(&mut rng, s.w_len(), 0.5, true);
        let full = s.full(&x, &w);
        assert_eq!(full.len(), s.y_len());
        let picks = s.sample(64);
        assert_eq!(picks, s.sample(64), "the sample is the same in every run");
        for i in picks {
            assert_eq!(s.at(&x, &w, i), full[i]);
        }
    }

    #[test]
    fn inputs_repeat_and_are_not_zero() {
        let a = random_values(&mut Rng::new(1), 1000, 1.0, true);
        assert_eq!(a, random_values(&mut Rng::new(1), 1000, 1.0, true));
        assert!(a.iter().all(|v| v.abs() <= 1.0) && a.iter().filter(|v| **v == 0.0).count() < 5);
        assert!(a.iter().all(|&v| bf16::from_f32(v).to_f32() == v), "bf16-exact");
        assert!(rel_l2(a.iter().map(|&v| v as f64), a.iter().map(|&v| v as f64)) == 0.0);
    }
}
