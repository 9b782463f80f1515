//! A procedurally drawn 10-class image set ("shapes"): 32×32 RGB images of a filled
//! circle, square, triangle, plus, cross, ring, hollow square, two horizontal bars, two
//! vertical bars or two dots, at a random position, size and colour over a noisy
//! background. Generated from a fixed seed, so every run (and every framework) sees the
//! same train and test sets; nothing is downloaded.

use cudnn_backend_reference::SplitMix64;

/// Image side in pixels.
pub const SIDE: usize = 32;
/// Number of classes.
pub const CLASSES: usize = 10;

/// Images (N×3×32×32, values in [-0.5, 0.5], NCHW) and their labels.
pub struct Split {
    /// Pixel values, NCHW.
    pub images: Vec<f32>,
    /// Class of each image.
    pub labels: Vec<i64>,
}

impl Split {
    /// Images `start..start + n` (NCHW) and their labels.
    pub fn batch(&self, start: usize, n: usize) -> (&[f32], &[i64]) {
        let px = 3 * SIDE * SIDE;
        (
            &self.images[start * px..(start + n) * px],
            &self.labels[start..start + n],
        )
    }
}

/// Whether pixel offset (`dx`, `dy`) from the centre, in units of the shape's half size,
/// is inside a shape of `class`.
fn inside(class: usize, dx: f64, dy: f64) -> bool {
    let r = (dx * dx + dy * dy).sqrt();
    let bar = 0.28;
    match class {
        0 => r <= 1.0,
        1 => dx.abs() <= 0.85 && dy.abs() <= 0.85,
        2 => (-0.9..=0.9).contains(&dy) && dx.abs() <= (dy + 0.9) * 0.55,
        3 => (dx.abs() <= bar && dy.abs() <= 1.0) || (dy.abs() <= bar && dx.abs() <= 1.0),
        4 => r <= 1.1 && ((dx - dy).abs() <= bar * 1.4 || (dx + dy).abs() <= bar * 1.4),
        5 => (0.65..=1.0).contains(&r),
        6 => dx.abs().max(dy.abs()) <= 0.95 && dx.abs().max(dy.abs()) >= 0.65,
        7 => dx.abs() <= 1.0 && ((dy - 0.5).abs() <= bar || (dy + 0.5).abs() <= bar),
        8 => dy.abs() <= 1.0 && ((dx - 0.5).abs() <= bar || (dx + 0.5).abs() <= bar),
        _ => ((dx - 0.55).powi(2) + dy * dy).sqrt() <= 0.4 || ((dx + 0.55).powi(2) + dy * dy).sqrt() <= 0.4,
    }
}

/// Draws `n` images with balanced classes from `seed`.
pub fn generate(n: usize, seed: u64) -> Split {
    let mut rng = SplitMix64::new(seed);
    let px = SIDE * SIDE;
    let mut images = Vec::with_capacity(n * 3 * px);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let class = (i + (rng.next_u64() % CLASSES as u64) as usize) % CLASSES;
        let half = 5.0 + rng.next_f64() * 6.0;
        let cx = half + 1.0 + rng.next_f64() * (SIDE as f64 - 2.0 * half - 2.0);
        let cy = half + 1.0 + rng.next_f64() * (SIDE as f64 - 2.0 * half - 2.0);
        let fg: [f64; 3] = std::array::from_fn(|_| 0.55 + 0.45 * rng.next_f64());
        let bg: [f64; 3] = std::array::from_fn(|_| 0.3 * rng.next_f64());
        let mut plane = vec![0f32; 3 * px];
        for y in 0..SIDE {
            for x in 0..SIDE {
                let on = inside(class, (x as f64 + 0.5 - cx) / half, (y as f64 + 0.5 - cy) / half);
                for c in 0..3 {
                    let noise = 0.15 * (rng.next_f64() - 0.5);
                    let v = if on { fg[c] } else { bg[c] } + noise;
                    plane[c * px + y * SIDE + x] = (v.clamp(0.0, 1.0) - 0.5) as f32;
                }
            }
        }
        images.extend_from_slice(&plane);
        labels.push(class as i64);
    }
    Split { images, labels }
}
