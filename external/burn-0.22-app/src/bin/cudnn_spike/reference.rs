//! Host inputs and the float64 reference the GPU results are judged against.
//!
//! Inputs are uniform random (never zeros) from a fixed-seed SplitMix64, so every run of
//! every mode sees the same values; for bf16 runs they are rounded to bf16 on the host first,
//! so the reference convolves exactly the values the GPU reads. The reference is float64: the
//! reference crate's convolution over the whole output for the small shapes, and a direct sum
//! at a fixed random sample of output points for the large ones (each point costs C·R·S
//! products).

use burn::tensor::bf16;
use cudnn_backend_reference::{conv_forward, ConvGeometry, SplitMix64};

/// `n` values uniform in [-scale, scale), rounded to bf16 when `bf16_exact`.
pub fn random_values(rng: &mut SplitMix64, n: usize, scale: f32, bf16_exact: bool) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = rng.next_f64() as f32 * scale;
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

    /// The whole output in float64, NCHW (the reference crate's convolution).
    pub fn full(&self, x: &[f32], wt: &[f32]) -> Vec<f64> {
        let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let g = ConvGeometry {
            pre_padding: vec![self.pad; 2],
            post_padding: vec![self.pad; 2],
            stride: vec![self.stride; 2],
            dilation: vec![1; 2],
            groups: 1,
        };
        conv_forward(
            &wide(x),
            &[self.n, self.c, self.h, self.w],
            &wide(wt),
            &[self.k, self.c, self.r, self.s],
            &g,
        )
    }

    /// `count` output indices (flat, NCHW) drawn with a fixed seed: the same in every run.
    pub fn sample(&self, count: usize) -> Vec<usize> {
        let mut rng = SplitMix64::new(0x5A3D_1E5E_ED00_0001);
        (0..count.min(self.y_len()))
            .map(|_| rng.below(self.y_len() as u64) as usize)
            .collect()
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
        let mut rng = SplitMix64::new(7);
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
        let a = random_values(&mut SplitMix64::new(1), 1000, 1.0, true);
        assert_eq!(a, random_values(&mut SplitMix64::new(1), 1000, 1.0, true));
        assert!(a.iter().all(|v| v.abs() <= 1.0) && a.iter().filter(|v| **v == 0.0).count() < 5);
        assert!(a.iter().all(|&v| bf16::from_f32(v).to_f32() == v), "bf16-exact");
    }
}
