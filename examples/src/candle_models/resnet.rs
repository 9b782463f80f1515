//! ResNet-50 (torchvision's v1.5: the stride of a downsampling bottleneck sits on its 3×3
//! convolution) written with Candle, as [`crate::models::resnet`] is with Burn: 7×7/2 stem,
//! 3×3/2 max pool, four stages of bottlenecks, global average pool, linear classifier;
//! torchvision's initialization and variable names (`conv1`, `bn1`, `layer1.0.downsample.0`,
//! `fc`, ...).
//!
//! The default variant runs this crate's Candle layers: `nn::Conv2d`, `nn::BatchNorm` trained on
//! the fused op (each bottleneck's ReLUs and its `relu(· + shortcut)` tail inside the batch
//! norm, forward and backward: `forward_relu_t` / `forward_add_relu_t`), the cuDNN pooling of
//! `CudnnExt` and `nn::Linear`. `stock` runs candle-nn's `Conv2d` and `Linear`, candle-nn's
//! `BatchNorm` in f32 (in f16/bf16, where candle-nn 0.11's training forward mixes its f32
//! statistics with the data's dtype and fails, this crate's `BatchNorm` composed of Candle ops
//! instead: the same computation), ReLU and the residual add as Candle ops, and the global
//! average pool as a Candle mean. Both variants max-pool with `cudnn_max_pool2d`: Candle 0.11's
//! own `max_pool2d` has no padding and no backward pass for overlapping windows (3×3, stride 2).

use candle_core::{DType, Device, Module, ModuleT, Result, Tensor};
use candle_nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use candle_nn::{BatchNormConfig, Conv2dConfig, Init, VarBuilder};
use cudnn_backend::candle::nn as ours;
use cudnn_backend::candle::CudnnExt;

use super::{uniform_labels, Batch, CandleModel};

/// The shape of a ResNet: bottleneck blocks per stage, base width, classes, image side.
#[derive(Clone, Debug)]
pub struct ResNetConfig {
    /// Bottleneck blocks in each of the four stages (ResNet-50: 3, 4, 6, 3).
    pub blocks: [usize; 4],
    /// Width of the first stage's bottleneck (64); each later stage doubles it.
    pub width: usize,
    /// Output classes (1000 for ImageNet).
    pub classes: usize,
    /// Side of the square synthetic images (224).
    pub image: usize,
}

impl ResNetConfig {
    /// ResNet-50 for 1000 classes on 224×224 images.
    pub fn resnet50() -> Self {
        Self {
            blocks: [3, 4, 6, 3],
            width: 64,
            classes: 1000,
            image: 224,
        }
    }

    /// A small network of the same structure (one block per stage, width 4, 10 classes, 32×32
    /// images), for tests: [`crate::models::resnet::ResNetConfig::tiny`].
    pub fn tiny() -> Self {
        Self {
            blocks: [1, 1, 1, 1],
            width: 4,
            classes: 10,
            image: 32,
        }
    }
}

/// Output channels of a bottleneck over its width.
const EXPANSION: usize = 4;

/// A convolution without bias: this crate's layer or candle-nn's.
#[derive(Clone, Debug)]
struct Conv {
    weight: Tensor,
    config: Conv2dConfig,
    stock: bool,
}

impl Conv {
    /// A `k`×`k` convolution, Kaiming-normal over fan-out (ReLU gain: torchvision's init).
    fn new(cin: usize, cout: usize, k: usize, stride: usize, pad: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        let init = Init::Kaiming {
            dist: NormalOrUniform::Normal,
            fan: FanInOut::FanOut,
            non_linearity: NonLinearity::ReLU,
        };
        Ok(Self {
            weight: vb.get_with_hints((cout, cin, k, k), "weight", init)?,
            config: Conv2dConfig {
                padding: pad,
                stride,
                ..Default::default()
            },
            stock,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.stock {
            candle_nn::Conv2d::new(self.weight.clone(), None, self.config).forward(x)
        } else {
            ours::Conv2d::from_weights(self.weight.clone(), None, self.config).forward(x)
        }
    }
}

/// Batch norm: this crate's layer (fused in training unless stock) or candle-nn's.
#[derive(Clone, Debug)]
enum Norm {
    Ours(ours::BatchNorm),
    Stock(candle_nn::BatchNorm),
}

impl Norm {
    /// Batch norm of `channels` (PyTorch's epsilon 1e-5 and momentum 0.1, scale 1, shift 0).
    fn new(channels: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        let config = BatchNormConfig::default();
        Ok(match (stock, vb.dtype()) {
            (true, DType::F32) => Norm::Stock(candle_nn::batch_norm(channels, config, vb)?),
            (true, _) => Norm::Ours(ours::batch_norm(channels, config, vb)?.with_fused_training(false)),
            (false, _) => Norm::Ours(ours::batch_norm(channels, config, vb)?),
        })
    }

    /// `norm(x)`, then `relu(· + skip)` with a skip, else `relu(·)` when `relu`.
    fn forward(&self, x: &Tensor, skip: Option<&Tensor>, relu: bool, train: bool) -> Result<Tensor> {
        match self {
            Norm::Ours(bn) => match skip {
                Some(skip) => bn.forward_add_relu_t(x, skip, train),
                None if relu => bn.forward_relu_t(x, train),
                None => bn.forward_t(x, train),
            },
            Norm::Stock(bn) => {
                let y = bn.forward_t(x, train)?;
                match skip {
                    Some(skip) => (y + skip)?.relu(),
                    None if relu => y.relu(),
                    None => Ok(y),
                }
            }
        }
    }
}

/// The bottleneck block: 1×1 reduce, 3×3 (strided when downsampling), 1×1 expand, each
/// followed by batch norm; `relu(· + shortcut)` at the end, the shortcut a strided 1×1
/// convolution with batch norm where the shape changes.
#[derive(Clone, Debug)]
struct Bottleneck {
    conv1: Conv,
    bn1: Norm,
    conv2: Conv,
    bn2: Norm,
    conv3: Conv,
    bn3: Norm,
    downsample: Option<(Conv, Norm)>,
}

impl Bottleneck {
    fn new(cin: usize, width: usize, stride: usize, stock: bool, vb: VarBuilder) -> Result<Self> {
        let cout = width * EXPANSION;
        let downsample = if stride != 1 || cin != cout {
            Some((
                Conv::new(cin, cout, 1, stride, 0, stock, vb.pp("downsample.0"))?,
                Norm::new(cout, stock, vb.pp("downsample.1"))?,
            ))
        } else {
            None
        };
        Ok(Self {
            conv1: Conv::new(cin, width, 1, 1, 0, stock, vb.pp("conv1"))?,
            bn1: Norm::new(width, stock, vb.pp("bn1"))?,
            conv2: Conv::new(width, width, 3, stride, 1, stock, vb.pp("conv2"))?,
            bn2: Norm::new(width, stock, vb.pp("bn2"))?,
            conv3: Conv::new(width, cout, 1, 1, 0, stock, vb.pp("conv3"))?,
            bn3: Norm::new(cout, stock, vb.pp("bn3"))?,
            downsample,
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let skip = match &self.downsample {
            Some((conv, norm)) => norm.forward(&conv.forward(x)?, None, false, train)?,
            None => x.clone(),
        };
        let y = self.bn1.forward(&self.conv1.forward(x)?, None, true, train)?;
        let y = self.bn2.forward(&self.conv2.forward(&y)?, None, true, train)?;
        self.bn3.forward(&self.conv3.forward(&y)?, Some(&skip), true, train)
    }
}

/// ResNet (see the module docs).
#[derive(Clone, Debug)]
pub struct ResNet {
    conv1: Conv,
    bn1: Norm,
    blocks: Vec<Bottleneck>,
    fc_weight: Tensor,
    fc_bias: Tensor,
    stock: bool,
}

impl ResNet {
    /// The network of `config` with torchvision's initialization (convolutions
    /// Kaiming-normal over fan-out, batch norms 1/0, the classifier uniform over
    /// ±1/√fan-in), its variables from `vb`; `stock` as the module docs say.
    pub fn new(config: &ResNetConfig, stock: bool, vb: VarBuilder) -> Result<Self> {
        let stem = config.width;
        let mut blocks = Vec::new();
        let mut cin = stem;
        for (i, &n) in config.blocks.iter().enumerate() {
            let width = config.width << i;
            let stride = if i == 0 { 1 } else { 2 };
            for b in 0..n {
                let vb = vb.pp(format!("layer{}.{b}", i + 1));
                blocks.push(Bottleneck::new(cin, width, if b == 0 { stride } else { 1 }, stock, vb)?);
                cin = width * EXPANSION;
            }
        }
        let bound = 1.0 / (cin as f64).sqrt();
        let head = Init::Uniform { lo: -bound, up: bound };
        Ok(Self {
            conv1: Conv::new(3, stem, 7, 2, 3, stock, vb.pp("conv1"))?,
            bn1: Norm::new(stem, stock, vb.pp("bn1"))?,
            blocks,
            fc_weight: vb.get_with_hints((config.classes, cin), "fc.weight", head)?,
            fc_bias: vb.get_with_hints(config.classes, "fc.bias", head)?,
            stock,
        })
    }

    /// Logits `(N, classes)` in f32 of images `(N, 3, H, W)` in the variables' dtype; `train`
    /// normalizes with batch statistics (and updates the running ones).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let x = self.bn1.forward(&self.conv1.forward(x)?, None, true, train)?;
        let mut x = x.cudnn_max_pool2d([3, 3], [2, 2], [1, 1])?;
        for block in &self.blocks {
            x = block.forward(&x, train)?;
        }
        let (w, b) = (self.fc_weight.clone(), Some(self.fc_bias.clone()));
        let logits = if self.stock {
            let pooled = x.flatten_from(2)?.mean(2)?;
            candle_nn::Linear::new(w, b).forward(&pooled)?
        } else {
            let (_, _, h, wd) = x.dims4()?;
            let pooled = x.cudnn_avg_pool2d([h, wd], [h, wd], [0, 0], true)?.flatten_from(1)?;
            ours::Linear::new(w, b).forward(&pooled)?
        };
        logits.to_dtype(DType::F32)
    }
}

impl CandleModel for ResNet {
    type Config = ResNetConfig;
    const UNIT: &'static str = "images";
    const BATCH: usize = 64;
    const LR: f64 = 1e-3;
    const WEIGHT_DECAY: f64 = 0.0;

    fn new(config: &Self::Config, stock: bool, vb: VarBuilder) -> Result<Self> {
        ResNet::new(config, stock, vb)
    }

    /// `n` standard-normal images with labels uniform over the classes.
    fn synthetic_batch(config: &Self::Config, n: usize, dtype: DType, device: &Device) -> Result<Batch> {
        let side = config.image;
        Ok(Batch {
            inputs: Tensor::randn(0f32, 1.0, (n, 3, side, side), device)?.to_dtype(dtype)?,
            targets: uniform_labels(&[n], config.classes, device)?,
        })
    }

    fn units_per_sample(_: &Self::Config) -> usize {
        1
    }

    /// Mean cross-entropy of the logits against the labels.
    fn loss(&self, batch: &Batch) -> Result<Tensor> {
        candle_nn::loss::cross_entropy(&self.forward(&batch.inputs, true)?, &batch.targets)
    }
}
