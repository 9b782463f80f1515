//! ViT-B/16 (86M), written with stock `burn::nn` as a Burn user writes it: 16×16 patches
//! embedded by a convolution of kernel and stride 16, a learned class token, learned position
//! embeddings, pre-norm encoder layers, a final layer norm and a linear head on the class
//! token. Dropout is 0 (timm's default and DeiT's recipe; the ViT paper's ImageNet runs used
//! 0.1); GELU is the exact (erf) one; layer norms take ViT's epsilon 1e-6.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::transformer::{linear, normal_init, AttentionMask, Layer, LayerConfig, Norm};
use super::{ImageBatch, TrainModel};

/// The shape of a Vision Transformer.
#[derive(Clone, Debug)]
pub struct VitConfig {
    /// Image side (square images, 3 channels).
    pub image: usize,
    /// Patch side; `image` is a multiple of it.
    pub patch: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Output classes.
    pub classes: usize,
    /// Burn's own `LayerNorm`, `MultiHeadAttention` and `CrossEntropyLoss` (`true`) or this
    /// crate's drop-ins.
    pub stock: bool,
}

impl VitConfig {
    /// ViT-B/16 for ImageNet: 224×224 images, 16×16 patches (196 and a class token), 12
    /// layers, width 768, 12 heads, MLP 3072, 1000 classes.
    pub fn vit_b16(stock: bool) -> Self {
        Self {
            image: 224,
            patch: 16,
            layers: 12,
            d_model: 768,
            heads: 12,
            d_ff: 3072,
            classes: 1000,
            stock,
        }
    }

    /// A small ViT of the same structure (32×32 images, 8×8 patches, 2 layers, width 32,
    /// 4 heads, 10 classes), for tests.
    pub fn tiny(stock: bool) -> Self {
        Self {
            image: 32,
            patch: 8,
            layers: 2,
            d_model: 32,
            heads: 4,
            d_ff: 128,
            classes: 10,
            stock,
        }
    }

    /// Tokens per image: the patches and the class token.
    pub fn tokens(&self) -> usize {
        (self.image / self.patch).pow(2) + 1
    }

    /// The configuration of each layer: pre-norm, no dropout, epsilon 1e-6.
    pub fn layer(&self) -> LayerConfig {
        LayerConfig {
            d_model: self.d_model,
            heads: self.heads,
            d_ff: self.d_ff,
            dropout: 0.0,
            epsilon: 1e-6,
            pre_norm: true,
            stock: self.stock,
        }
    }

    /// The network with ViT's initialization (normal 0.02 for the patch embedding, the class
    /// token, the positions and every linear layer; zero biases; layer norms 1/0).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Vit<B> {
        let layer = self.layer();
        let mut patches = Conv2dConfig::new([3, self.d_model], [self.patch, self.patch])
            .with_stride([self.patch, self.patch])
            .with_initializer(normal_init())
            .init(device);
        patches.bias = Some(burn::module::Initializer::Zeros.init([self.d_model], device));
        Vit {
            patches,
            class_token: normal_init().init([1, 1, self.d_model], device),
            positions: normal_init().init([1, self.tokens(), self.d_model], device),
            layers: (0..self.layers).map(|_| layer.init(device)).collect(),
            norm: Norm::new(self.d_model, layer.epsilon, self.stock, device),
            head: linear(self.d_model, self.classes, device),
        }
    }
}

/// A Vision Transformer (see the module docs).
#[derive(Module, Debug)]
pub struct Vit<B: Backend> {
    patches: Conv2d<B>,
    class_token: Param<Tensor<B, 3>>,
    positions: Param<Tensor<B, 3>>,
    layers: Vec<Layer<B>>,
    norm: Norm<B>,
    head: Linear<B>,
}

impl<B: Backend> Vit<B> {
    /// Logits `[N, classes]` of images `[N, 3, H, W]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let n = images.dims()[0];
        // [N, d, H/p, W/p] → [N, patches, d]
        let patches = self.patches.forward(images).flatten::<3>(2, 3).swap_dims(1, 2);
        let d = patches.dims()[2];
        let class = self.class_token.val().expand([n, 1, d]);
        let mut x = Tensor::cat(vec![class, patches], 1) + self.positions.val();
        let mask = AttentionMask::none();
        for layer in &self.layers {
            x = layer.forward(x, &mask);
        }
        let x = self.norm.forward(x);
        self.head.forward(x.slice([0..n, 0..1]).reshape([n, d]))
    }
}

impl<B: Backend> TrainModel<B> for Vit<B> {
    type Config = VitConfig;
    type Batch = ImageBatch<B>;
    const UNIT: &'static str = "images";

    fn init(config: &Self::Config, device: &B::Device) -> Self {
        config.init(device)
    }

    fn synthetic_batch(config: &Self::Config, n: usize, device: &B::Device) -> Self::Batch {
        ImageBatch::synthetic(n, config.image, config.classes, device)
    }

    fn loss(&self, batch: &Self::Batch) -> Tensor<B, 1> {
        batch.loss(self.forward(batch.images.clone()), self.norm.is_stock())
    }

    fn batch_to_data(batch: &Self::Batch) -> Vec<TensorData> {
        batch.to_data()
    }

    fn batch_from_data(data: Vec<TensorData>, device: &B::Device) -> Self::Batch {
        ImageBatch::from_data(data, device)
    }
}
