//! The reduction fusers: elementwise runs ending in sums or means as one generated kernel
//! (`fuser`), and chains of sums over the leading dims (a linear layer's bias gradient) as one
//! reduction (`leading_sum`).

mod fuser;
mod leading_sum;

pub(crate) use fuser::{ReduceFuser, ReduceOptimization};
pub(crate) use leading_sum::{LeadingSumFuser, LeadingSumOptimization};
