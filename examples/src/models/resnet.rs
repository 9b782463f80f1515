//! ResNet-50 (torchvision's v1.5 architecture: the stride of a downsampling bottleneck sits
//! on its 3×3 convolution) written with stock `burn::nn` modules, as a Burn user writes it.
//! `Norm` picks Burn's `BatchNorm` (`stock`) or this crate's drop-in, which fuses the ReLU
//! and the residual add into the normalization on the cuDNN backend.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Initializer, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// The shape of a ResNet: bottleneck blocks per stage, base width, classes.
#[derive(Clone, Debug)]
pub struct ResNetConfig {
    /// Bottleneck blocks in each of the four stages (ResNet-50: 3, 4, 6, 3).
    pub blocks: [usize; 4],
    /// Width of the first stage's bottleneck (64); each later stage doubles it.
    pub width: usize,
    /// Output classes (1000 for ImageNet).
    pub classes: usize,
    /// Burn's own `BatchNorm` and `CrossEntropyLoss` (`true`) or this crate's fused drop-ins.
    pub stock: bool,
}

impl ResNetConfig {
    /// ResNet-50 for 1000 classes.
    pub fn resnet50(stock: bool) -> Self {
        Self {
            blocks: [3, 4, 6, 3],
            width: 64,
            classes: 1000,
            stock,
        }
    }

    /// A small network of the same structure (one block per stage, narrow), for tests.
    pub fn tiny(stock: bool) -> Self {
        Self {
            blocks: [1, 1, 1, 1],
            width: 4,
            classes: 10,
            stock,
        }
    }

    /// The network with torchvision's initialization: convolutions Kaiming-normal over
    /// fan-out (ReLU gain), batch norm scale 1 and shift 0, the classifier Burn's default.
    pub fn init<B: Backend>(&self, device: &B::Device) -> ResNet<B> {
        let stem = self.width;
        let mut stages = Vec::new();
        let mut cin = stem;
        for (i, &n) in self.blocks.iter().enumerate() {
            let width = self.width << i;
            let stride = if i == 0 { 1 } else { 2 };
            for b in 0..n {
                stages.push(Bottleneck::new(
                    cin,
                    width,
                    if b == 0 { stride } else { 1 },
                    self.stock,
                    device,
                ));
                cin = width * EXPANSION;
            }
        }
        ResNet {
            stem: conv(3, stem, 7, 2, 3, device),
            stem_norm: Norm::new(stem, self.stock, device),
            pool: MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            blocks: stages,
            gap: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(cin, self.classes).init(device),
        }
    }
}

/// Output channels of a bottleneck over its width.
const EXPANSION: usize = 4;

/// A `k`×`k` convolution without bias, Kaiming-normal over fan-out (torchvision's init).
fn conv<B: Backend>(cin: usize, cout: usize, k: usize, stride: usize, pad: usize, device: &B::Device) -> Conv2d<B> {
    Conv2dConfig::new([cin, cout], [k, k])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .with_bias(false)
        .with_initializer(Initializer::KaimingNormal {
            gain: std::f64::consts::SQRT_2,
            fan_out_only: true,
        })
        .init(device)
}

/// Batch norm: Burn's own (`stock`) or this crate's drop-in (same config and record).
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    stock: Option<burn::nn::BatchNorm<B>>,
    fused: Option<cudnn_backend::burn::nn::BatchNorm<B>>,
}

impl<B: Backend> Norm<B> {
    /// Burn's `BatchNorm` of `channels` when `stock`, else this crate's drop-in.
    pub fn new(channels: usize, stock: bool, device: &B::Device) -> Self {
        Self {
            stock: stock.then(|| burn::nn::BatchNormConfig::new(channels).init(device)),
            fused: (!stock).then(|| cudnn_backend::burn::nn::BatchNormConfig::new(channels).init(device)),
        }
    }

    /// Whether this is Burn's `BatchNorm` (the model's stock variant).
    pub fn is_stock(&self) -> bool {
        self.stock.is_some()
    }

    /// `norm(x)`, then `relu(· + skip)` with a skip, else `relu(·)` when `relu`.
    pub fn forward(&self, x: Tensor<B, 4>, skip: Option<Tensor<B, 4>>, relu: bool) -> Tensor<B, 4> {
        match (&self.stock, &self.fused) {
            (_, Some(bn)) => match skip {
                Some(skip) => bn.forward_add_relu(x, skip),
                None if relu => bn.forward_relu(x),
                None => bn.forward(x),
            },
            (Some(bn), None) => {
                let y = bn.forward(x);
                match skip {
                    Some(skip) => Relu::new().forward(y + skip),
                    None if relu => Relu::new().forward(y),
                    None => y,
                }
            }
            (None, None) => unreachable!("a Norm holds one of its two modules"),
        }
    }
}

/// The bottleneck block: 1×1 reduce, 3×3 (strided when downsampling), 1×1 expand, each
/// followed by batch norm; `relu(· + shortcut)` at the end, the shortcut a strided 1×1
/// convolution with batch norm where the shape changes.
#[derive(Module, Debug)]
pub struct Bottleneck<B: Backend> {
    conv1: Conv2d<B>,
    norm1: Norm<B>,
    conv2: Conv2d<B>,
    norm2: Norm<B>,
    conv3: Conv2d<B>,
    norm3: Norm<B>,
    down: Option<(Conv2d<B>, Norm<B>)>,
}

impl<B: Backend> Bottleneck<B> {
    fn new(cin: usize, width: usize, stride: usize, stock: bool, device: &B::Device) -> Self {
        let cout = width * EXPANSION;
        let down = (stride != 1 || cin != cout)
            .then(|| (conv(cin, cout, 1, stride, 0, device), Norm::new(cout, stock, device)));
        Self {
            conv1: conv(cin, width, 1, 1, 0, device),
            norm1: Norm::new(width, stock, device),
            conv2: conv(width, width, 3, stride, 1, device),
            norm2: Norm::new(width, stock, device),
            conv3: conv(width, cout, 1, 1, 0, device),
            norm3: Norm::new(cout, stock, device),
            down,
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let skip = match &self.down {
            Some((conv, norm)) => norm.forward(conv.forward(x.clone()), None, false),
            None => x.clone(),
        };
        let y = self.norm1.forward(self.conv1.forward(x), None, true);
        let y = self.norm2.forward(self.conv2.forward(y), None, true);
        self.norm3.forward(self.conv3.forward(y), Some(skip), true)
    }
}

/// ResNet: 7×7/2 stem, 3×3/2 max pool, four stages of bottlenecks, global average pool,
/// linear classifier.
#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    stem: Conv2d<B>,
    stem_norm: Norm<B>,
    pool: MaxPool2d,
    blocks: Vec<Bottleneck<B>>,
    gap: AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> ResNet<B> {
    /// Logits `[N, classes]` of images `[N, 3, H, W]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self
            .pool
            .forward(self.stem_norm.forward(self.stem.forward(x), None, true));
        for block in &self.blocks {
            x = block.forward(x);
        }
        self.head.forward(self.gap.forward(x).flatten(1, 3))
    }

    /// Whether the network holds Burn's own modules (the stock variant, which keeps Burn's
    /// loss too) rather than this crate's drop-ins.
    pub fn is_stock(&self) -> bool {
        self.stem_norm.is_stock()
    }
}
