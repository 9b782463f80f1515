//! Drop-in modules for `burn::nn`: change only the import. Each has the same config fields
//! and record as Burn's, stays generic over any Burn backend, and takes the fused path on
//! `Cudnn` and `Autodiff<Cudnn>`.

mod attention;
mod batch_norm;
pub mod loss;
mod norm;
mod transformer;

pub use attention::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig, MultiHeadAttentionRecord};
pub use batch_norm::{BatchNorm, BatchNormConfig, BatchNormRecord};
pub use norm::{LayerNorm, LayerNormConfig, LayerNormRecord, RmsNorm, RmsNormConfig, RmsNormRecord};
pub use transformer::{
    TransformerDecoder, TransformerDecoderConfig, TransformerDecoderInput, TransformerDecoderLayer,
    TransformerDecoderLayerRecord, TransformerDecoderRecord, TransformerEncoder, TransformerEncoderConfig,
    TransformerEncoderInput, TransformerEncoderLayer, TransformerEncoderLayerRecord, TransformerEncoderRecord,
};
