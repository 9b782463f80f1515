//! `Graph::validate`: shape/dtype inference and consistency checks, all on the CPU.

use super::{ConvAttrs, DataType, Graph, Op, PointwiseMode, ResampleAttrs, ResampleMode, TensorId};
use crate::error::{Error, Result};
use crate::types::{conv_output_size, may_overlap, packed_strides, stride_order};

/// Largest tensor rank cuDNN accepts.
pub const MAX_RANK: usize = 8;

fn err(node: &str, msg: impl std::fmt::Display) -> Error {
    Error::InvalidGraph(format!("{node}: {msg}"))
}

/// Output spatial size of a pooling window, or None when the window does not fit.
pub(crate) fn pool_out(input: i64, window: i64, pre: i64, post: i64, stride: i64) -> Option<i64> {
    let padded = input.checked_add(pre)?.checked_add(post)?;
    if padded < window {
        return None;
    }
    Some((padded - window) / stride + 1)
}

impl Graph {
    /// Infers every unknown dim, stride and dtype and checks the whole graph.
    /// Rejects, with the node and tensor named: rank mismatches, channel/group mismatches,
    /// zero/negative sizes, sizes whose element count or byte extent overflows, dtype
    /// mismatches, bad strides (negative, zero, overlapping outputs), bad alignments,
    /// dangling or doubly produced tensors.
    pub fn validate(&mut self) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(Error::InvalidGraph("graph has no nodes".into()));
        }
        let n = self.tensors.len();
        let mut producer: Vec<Option<usize>> = vec![None; n];
        for (i, node) in self.nodes.iter().enumerate() {
            for t in node.op.inputs().into_iter().chain(node.op.outputs()) {
                if t.0 >= n {
                    return Err(err(
                        &node.name,
                        format!("refers to tensor #{} which does not exist", t.0),
                    ));
                }
            }
            for t in node.op.outputs() {
                if let Some(p) = producer[t.0] {
                    return Err(err(
                        &node.name,
                        format!(
                            "tensor `{}` is already produced by {}",
                            self.tensors[t.0].name, self.nodes[p].name
                        ),
                    ));
                }
                producer[t.0] = Some(i);
            }
        }
        // Forget everything a previous validate() inferred: re-infer from the user's inputs.
        for (i, t) in self.tensors.iter_mut().enumerate() {
            if producer[i].is_some() {
                if !t.given.dims {
                    t.dims.clear();
                }
                if !t.given.strides {
                    t.strides.clear();
                }
                if !t.given.dtype {
                    t.dtype = None;
                }
            }
        }
        // Graph inputs: everything not produced by a node.
        for (i, t) in self.tensors.iter().enumerate() {
            if producer[i].is_none() {
                if t.is_virtual {
                    return Err(Error::InvalidGraph(format!(
                        "virtual tensor `{}` is not produced by any node",
                        t.name
                    )));
                }
                check_input(self, TensorId(i))?;
            }
        }
        let mut consumed = vec![false; n];
        for idx in 0..self.nodes.len() {
            let node = self.nodes[idx].clone();
            for t in node.op.inputs() {
                if let Some(p) = producer[t.0] {
                    if p >= idx {
                        return Err(err(
                            &node.name,
                            format!("input `{}` is produced later", self.tensors[t.0].name),
                        ));
                    }
                }
                consumed[t.0] = true;
            }
            self.infer_node(&node.name, &node.op)?;
        }
        for (i, t) in self.tensors.iter().enumerate() {
            if t.is_virtual && !consumed[i] && !t.may_be_unused {
                return Err(Error::InvalidGraph(format!(
                    "virtual tensor `{}` is never used: mark it as an output with set_output()",
                    t.name
                )));
            }
        }
        self.validated = true;
        Ok(())
    }

    fn dims(&self, t: TensorId) -> &[i64] {
        &self.tensors[t.0].dims
    }

    fn dtype(&self, t: TensorId) -> DataType {
        self.tensors[t.0].dtype.unwrap_or(self.intermediate_type)
    }

    fn infer_node(&mut self, node: &str, op: &Op) -> Result<()> {
        match op {
            Op::ConvFprop { x, w, y, attrs } => {
                let (xd, wd) = (self.dims(*x).to_vec(), self.dims(*w).to_vec());
                check_conv_ranks(node, attrs, &[("x", &xd), ("w", &wd)])?;
                self.same_float(node, &[("x", *x), ("w", *w)])?;
                let groups = groups(node, xd[1], wd[1], wd[0])?;
                let _ = groups;
                let out = conv_spatial(node, &xd, &wd, attrs)?;
                let mut yd = vec![xd[0], wd[0]];
                yd.extend(out);
                self.set_inferred(node, *y, yd, *x)
            }
            Op::ConvDgrad { dy, w, dx, attrs } => {
                let (dyd, wd, dxd) = (self.dims(*dy).to_vec(), self.dims(*w).to_vec(), self.dims(*dx).to_vec());
                check_conv_ranks(node, attrs, &[("dy", &dyd), ("w", &wd), ("dx", &dxd)])?;
                self.same_float(node, &[("dy", *dy), ("w", *w)])?;
                check_positive(node, "dx", &dxd)?;
                groups(node, dxd[1], wd[1], wd[0])?;
                if dyd[1] != wd[0] {
                    return Err(err(
                        node,
                        format!("dy has {} channels but w has {} filters", dyd[1], wd[0]),
                    ));
                }
                if dyd[0] != dxd[0] {
                    return Err(err(node, format!("batch mismatch: dy N={} vs dx N={}", dyd[0], dxd[0])));
                }
                let out = conv_spatial(node, &dxd, &wd, attrs)?;
                if out[..] != dyd[2..] {
                    return Err(err(
                        node,
                        format!(
                            "dx dims {dxd:?} with w {wd:?} give dy spatial {out:?}, not {:?}",
                            &dyd[2..]
                        ),
                    ));
                }
                self.set_inferred(node, *dx, dxd, *dy)
            }
            Op::ConvWgrad { x, dy, dw, attrs } => {
                let (xd, dyd, dwd) = (self.dims(*x).to_vec(), self.dims(*dy).to_vec(), self.dims(*dw).to_vec());
                check_conv_ranks(node, attrs, &[("x", &xd), ("dy", &dyd), ("dw", &dwd)])?;
                self.same_float(node, &[("x", *x), ("dy", *dy)])?;
                check_positive(node, "dw", &dwd)?;
                groups(node, xd[1], dwd[1], dwd[0])?;
                if dyd[1] != dwd[0] {
                    return Err(err(
                        node,
                        format!("dy has {} channels but dw has {} filters", dyd[1], dwd[0]),
                    ));
                }
                if dyd[0] != xd[0] {
                    return Err(err(node, format!("batch mismatch: x N={} vs dy N={}", xd[0], dyd[0])));
                }
                let out = conv_spatial(node, &xd, &dwd, attrs)?;
                if out[..] != dyd[2..] {
                    return Err(err(
                        node,
                        format!("x {xd:?} with dw {dwd:?} give dy spatial {out:?}, not {:?}", &dyd[2..]),
                    ));
                }
                self.set_inferred(node, *dw, dwd, *x)
            }
            Op::Matmul { a, b, c, .. } => {
                let (ad, bd) = (self.dims(*a).to_vec(), self.dims(*b).to_vec());
                if ad.len() < 2 || ad.len() != bd.len() {
                    return Err(err(
                        node,
                        format!("rank mismatch: a {ad:?} and b {bd:?} must have the same rank >= 2"),
                    ));
                }
                if self.tensors[a.0].is_virtual || self.tensors[b.0].is_virtual {
                    // Fused patterns multiply an f32 intermediate by an f16/bf16 input.
                    for (name, t) in [("a", *a), ("b", *b)] {
                        if !matches!(self.dtype(t), DataType::F32 | DataType::F16 | DataType::BF16) {
                            return Err(err(
                                node,
                                format!("{name} has dtype {:?}; expected f32, f16 or bf16", self.dtype(t)),
                            ));
                        }
                    }
                } else {
                    self.same_float(node, &[("a", *a), ("b", *b)])?;
                }
                let r = ad.len();
                if ad[r - 1] != bd[r - 2] {
                    return Err(err(
                        node,
                        format!(
                            "inner dims differ: a {ad:?} (K={}) vs b {bd:?} (K={})",
                            ad[r - 1],
                            bd[r - 2]
                        ),
                    ));
                }
                let mut cd = broadcast(node, &ad[..r - 2], &bd[..r - 2])?;
                cd.extend([ad[r - 2], bd[r - 1]]);
                let order: Vec<usize> = (0..cd.len()).collect();
                if self.tensors[c.0].strides.is_empty() {
                    self.tensors[c.0].strides = packed_strides(&cd, &order).to_vec();
                }
                self.set_inferred(node, *c, cd, *a)
            }
            Op::Pointwise {
                mode,
                a,
                b,
                t,
                y,
                compute,
            } => {
                let ad = self.dims(*a).to_vec();
                // Integer inputs: indices (gen-index, compare) and integer arithmetic on them.
                let int_ok = matches!(mode, PointwiseMode::CmpGe | PointwiseMode::GenIndex(_))
                    || matches!(compute, Some(DataType::I32 | DataType::I64));
                let numeric = |d: DataType| d.is_float() || (int_ok && matches!(d, DataType::I32 | DataType::I64));
                if !numeric(self.dtype(*a)) && !matches!(mode, PointwiseMode::GenIndex(_)) {
                    return Err(err(node, format!("input a has non-float dtype {:?}", self.dtype(*a))));
                }
                if let PointwiseMode::GenIndex(axis) = mode {
                    if !(0..ad.len() as i64).contains(axis) {
                        return Err(err(node, format!("index axis {axis} is outside a's rank {}", ad.len())));
                    }
                }
                let mask_dims = match (mode, t) {
                    (PointwiseMode::BinarySelect, Some(t)) => {
                        if self.dtype(*t) != DataType::Bool {
                            return Err(err(
                                node,
                                format!("the select mask has dtype {:?}, not Bool", self.dtype(*t)),
                            ));
                        }
                        Some(self.dims(*t).to_vec())
                    }
                    (PointwiseMode::BinarySelect, None) => return Err(err(node, "a select needs a mask")),
                    (_, Some(_)) => return Err(err(node, format!("{mode:?} takes no mask"))),
                    (_, None) => None,
                };
                let out_dtype = match mode {
                    PointwiseMode::GenIndex(_) => Some(DataType::I32),
                    PointwiseMode::CmpGe => Some(DataType::Bool),
                    _ => None,
                };
                if let (Some(dt), None) = (out_dtype, self.tensors[y.0].dtype) {
                    self.tensors[y.0].dtype = Some(dt);
                }
                let yd = match b {
                    Some(b) if mode.is_binary() => {
                        let bd = self.dims(*b).to_vec();
                        if !numeric(self.dtype(*b)) {
                            return Err(err(node, format!("input b has non-float dtype {:?}", self.dtype(*b))));
                        }
                        if ad.len() != bd.len() {
                            return Err(err(
                                node,
                                format!("rank mismatch: a {ad:?} vs b {bd:?} (broadcast needs equal ranks; use 1s)"),
                            ));
                        }
                        if mode.is_backward() && ad != bd {
                            return Err(err(
                                node,
                                format!("{mode:?} needs dy and x of equal dims, got {ad:?} and {bd:?}"),
                            ));
                        }
                        let yd = broadcast(node, &ad, &bd)?;
                        match &mask_dims {
                            Some(md) if md.len() != yd.len() => {
                                return Err(err(
                                    node,
                                    format!("mask rank {} differs from a's {}", md.len(), yd.len()),
                                ))
                            }
                            Some(md) => broadcast(node, &yd, md)?,
                            None => yd,
                        }
                    }
                    None if !mode.is_binary() => ad,
                    _ => {
                        return Err(err(
                            node,
                            format!("{mode:?} takes {} input(s)", if mode.is_binary() { 2 } else { 1 }),
                        ));
                    }
                };
                self.set_inferred(node, *y, yd, *a)
            }
            Op::Reduction { x, y, .. } => {
                let (xd, yd) = (self.dims(*x).to_vec(), self.dims(*y).to_vec());
                if xd.len() != yd.len() {
                    return Err(err(node, format!("rank mismatch: x {xd:?} vs y {yd:?}")));
                }
                for (i, (&a, &b)) in xd.iter().zip(&yd).enumerate() {
                    if b != a && b != 1 {
                        return Err(err(node, format!("output dim {i} is {b}: must be {a} or 1")));
                    }
                }
                self.set_inferred(node, *y, yd, *x)
            }
            Op::ResampleFwd { x, y, index, attrs } => {
                let xd = self.dims(*x).to_vec();
                check_pool(node, attrs, &xd)?;
                if !self.dtype(*x).is_float() {
                    return Err(err(node, format!("x has non-float dtype {:?}", self.dtype(*x))));
                }
                let yd = pool_dims(node, &xd, attrs)?;
                if let Some(i) = index {
                    if attrs.mode != ResampleMode::MaxPool {
                        return Err(err(node, "an index output exists only for max pooling"));
                    }
                    self.set_inferred(node, *i, yd.clone(), *x)?;
                }
                self.set_inferred(node, *y, yd, *x)
            }
            Op::ResampleBwd {
                dy,
                dx,
                x,
                y,
                index,
                attrs,
            } => {
                let (dyd, dxd) = (self.dims(*dy).to_vec(), self.dims(*dx).to_vec());
                check_pool(node, attrs, &dxd)?;
                let expect = pool_dims(node, &dxd, attrs)?;
                if expect != dyd {
                    return Err(err(node, format!("dx {dxd:?} pools to {expect:?}, but dy is {dyd:?}")));
                }
                if attrs.mode == ResampleMode::MaxPool && index.is_none() && (x.is_none() || y.is_none()) {
                    return Err(err(node, "max pool backward needs x and y, or the forward's index"));
                }
                if let Some(x) = x {
                    if self.dims(*x) != dxd.as_slice() {
                        return Err(err(
                            node,
                            format!("x dims {:?} differ from dx dims {dxd:?}", self.dims(*x)),
                        ));
                    }
                }
                if let Some(i) = index {
                    if self.dims(*i) != dyd.as_slice() {
                        return Err(err(
                            node,
                            format!("index dims {:?} differ from dy dims {dyd:?}", self.dims(*i)),
                        ));
                    }
                }
                if let Some(y) = y {
                    if self.dims(*y) != dyd.as_slice() {
                        return Err(err(
                            node,
                            format!("y dims {:?} differ from dy dims {dyd:?}", self.dims(*y)),
                        ));
                    }
                }
                self.set_inferred(node, *dx, dxd, *dy)
            }
            Op::NormForward {
                x,
                scale,
                bias,
                epsilon,
                y,
                mean,
                inv_var,
                ..
            } => {
                let xd = self.dims(*x).to_vec();
                if xd.len() < 2 {
                    return Err(err(node, format!("x {xd:?} needs rank >= 2 (rows, features..)")));
                }
                if !matches!(self.dtype(*x), DataType::F32 | DataType::F16 | DataType::BF16) {
                    return Err(err(
                        node,
                        format!("x has dtype {:?}; expected f32, f16 or bf16", self.dtype(*x)),
                    ));
                }
                let mut param_dims = xd.clone();
                param_dims[0] = 1;
                for (name, t) in std::iter::once(("scale", *scale)).chain(bias.map(|b| ("bias", b))) {
                    if self.dims(t) != param_dims.as_slice() {
                        return Err(err(
                            node,
                            format!(
                                "{name} dims {:?} must be {param_dims:?} (x's dims with the first set to 1)",
                                self.dims(t)
                            ),
                        ));
                    }
                    if !self.dtype(t).is_float() {
                        return Err(err(node, format!("{name} has non-float dtype {:?}", self.dtype(t))));
                    }
                }
                let eps = &self.tensors[epsilon.0];
                if eps.by_value.is_none() || eps.dims.iter().any(|&d| d != 1) || eps.dims.len() != xd.len() {
                    return Err(err(node, "epsilon must be a by-value scalar of x's rank"));
                }
                let mut stat_dims = vec![1i64; xd.len()];
                stat_dims[0] = xd[0];
                for t in mean.iter().chain(inv_var.iter()) {
                    self.set_inferred(node, *t, stat_dims.clone(), *x)?;
                }
                self.set_inferred(node, *y, xd, *x)
            }
            Op::Reshape { x, y } => {
                let (xd, yd) = (self.dims(*x).to_vec(), self.dims(*y).to_vec());
                if yd.is_empty() {
                    return Err(err(node, "a reshape needs its output dims"));
                }
                let (nx, ny) = (xd.iter().product::<i64>(), yd.iter().product::<i64>());
                if nx != ny {
                    return Err(err(node, format!("x {xd:?} has {nx} elements but y {yd:?} has {ny}")));
                }
                if self.tensors[y.0].dtype.is_none() {
                    self.tensors[y.0].dtype = Some(self.dtype(*x));
                }
                self.set_inferred(node, *y, yd, *x)
            }
            Op::Rng {
                seed,
                offset,
                y,
                keep_probability,
            } => {
                for (name, t) in [("seed", *seed), ("offset", *offset)] {
                    let d = self.dims(t);
                    if d.is_empty() || d.iter().any(|&n| n != 1) || self.dtype(t) != DataType::I64 {
                        return Err(err(
                            node,
                            format!("{name} {d:?} {:?}: need one I64 element", self.dtype(t)),
                        ));
                    }
                }
                if !(*keep_probability > 0.0 && *keep_probability <= 1.0) {
                    return Err(err(node, format!("keep probability {keep_probability}: need (0, 1]")));
                }
                let yd = self.dims(*y).to_vec();
                if yd.is_empty() {
                    return Err(err(node, "a random tensor needs its dims"));
                }
                self.set_inferred(node, *y, yd, *seed)
            }
        }
    }

    fn same_float(&self, node: &str, ts: &[(&str, TensorId)]) -> Result<()> {
        let (n0, t0) = ts[0];
        let d0 = self.dtype(t0);
        if !matches!(d0, DataType::F32 | DataType::F16 | DataType::BF16) {
            return Err(err(node, format!("{n0} has dtype {d0:?}; expected f32, f16 or bf16")));
        }
        for &(name, t) in &ts[1..] {
            if self.dtype(t) != d0 {
                return Err(err(
                    node,
                    format!("dtype mismatch: {n0} is {d0:?} but {name} is {:?}", self.dtype(t)),
                ));
            }
        }
        Ok(())
    }

    /// Records inferred dims of `t` (or checks preset ones), defaults dtype and strides.
    fn set_inferred(&mut self, node: &str, t: TensorId, dims: Vec<i64>, like: TensorId) -> Result<()> {
        check_positive(node, &self.tensors[t.0].name.clone(), &dims)?;
        let like_strides = self.tensors[like.0].strides.clone();
        let intermediate = self.intermediate_type;
        let like_dtype = self.dtype(like);
        let tensor = &mut self.tensors[t.0];
        if !tensor.dims.is_empty() && tensor.dims != dims {
            return Err(err(
                node,
                format!(
                    "`{}` was given dims {:?} but the op produces {dims:?}",
                    tensor.name, tensor.dims
                ),
            ));
        }
        tensor.dims = dims;
        if tensor.dtype.is_none() {
            tensor.dtype = Some(if tensor.is_virtual { intermediate } else { like_dtype });
        }
        if tensor.strides.is_empty() {
            let order = if like_strides.len() == tensor.dims.len() {
                stride_order(&like_strides)
            } else {
                (0..tensor.dims.len()).collect()
            };
            tensor.strides = packed_strides(&tensor.dims, &order).to_vec();
        }
        let name = tensor.name.clone();
        let t = tensor.clone();
        check_layout(node, &name, &t.dims, &t.strides, t.dtype.unwrap_or(intermediate))?;
        if !t.is_virtual {
            check_alignment(&name, t.alignment, t.dtype.unwrap_or(intermediate))?;
            check_no_overlap(node, &name, &t.dims, &t.strides)?;
        }
        Ok(())
    }
}

fn check_input(g: &Graph, id: TensorId) -> Result<()> {
    let t = &g.tensors[id.0];
    let dtype = t
        .dtype
        .ok_or_else(|| Error::InvalidGraph(format!("input `{}` has no dtype", t.name)))?;
    if t.dims.is_empty() || t.dims.len() > MAX_RANK {
        return Err(Error::InvalidGraph(format!(
            "input `{}` has rank {} (must be 1..={MAX_RANK})",
            t.name,
            t.dims.len()
        )));
    }
    check_positive("input", &t.name, &t.dims)?;
    check_layout("input", &t.name, &t.dims, &t.strides, dtype)?;
    if t.by_value.is_none() {
        check_alignment(&t.name, t.alignment, dtype)?;
    }
    Ok(())
}

fn check_positive(node: &str, name: &str, dims: &[i64]) -> Result<()> {
    if let Some((i, d)) = dims.iter().enumerate().find(|(_, &d)| d <= 0) {
        return Err(err(
            node,
            format!("`{name}` has dim {i} = {d}; every dim must be >= 1 (empty tensors never reach cuDNN)"),
        ));
    }
    Ok(())
}

fn check_layout(node: &str, name: &str, dims: &[i64], strides: &[i64], dtype: DataType) -> Result<()> {
    if strides.len() != dims.len() {
        return Err(err(
            node,
            format!("`{name}` has {} strides for {} dims", strides.len(), dims.len()),
        ));
    }
    if let Some((i, s)) = strides.iter().enumerate().find(|(_, &s)| s <= 0) {
        return Err(err(
            node,
            format!("`{name}` has stride {i} = {s}; strides must be >= 1"),
        ));
    }
    let overflow = || {
        err(
            node,
            format!("`{name}` dims {dims:?} / strides {strides:?} overflow a 64-bit byte extent"),
        )
    };
    let mut extent = 1i64;
    let mut numel = 1i64;
    for (&d, &s) in dims.iter().zip(strides) {
        numel = numel.checked_mul(d).ok_or_else(overflow)?;
        extent = (d - 1)
            .checked_mul(s)
            .and_then(|v| v.checked_add(extent))
            .ok_or_else(overflow)?;
    }
    extent.checked_mul(dtype.size() as i64).ok_or_else(overflow)?;
    numel.checked_mul(dtype.size() as i64).ok_or_else(overflow)?;
    Ok(())
}

fn check_alignment(name: &str, alignment: u32, dtype: DataType) -> Result<()> {
    let ok = alignment.is_power_of_two() && alignment <= 16 && alignment as usize >= dtype.size();
    if !ok {
        return Err(Error::InvalidGraph(format!(
            "`{name}` is unaligned: pointer alignment {alignment} bytes for {dtype:?} (needs a power of two >= {} and <= 16)",
            dtype.size()
        )));
    }
    Ok(())
}

fn check_no_overlap(node: &str, name: &str, dims: &[i64], strides: &[i64]) -> Result<()> {
    if may_overlap(dims, strides) {
        return Err(err(
            node,
            format!("output `{name}` strides {strides:?} overlap for dims {dims:?}"),
        ));
    }
    Ok(())
}

fn check_conv_ranks(node: &str, attrs: &ConvAttrs, ts: &[(&str, &[i64])]) -> Result<()> {
    let s = attrs.spatial();
    if !(1..=3).contains(&s) {
        return Err(err(node, format!("{s} spatial dims (1, 2 or 3 supported)")));
    }
    for (what, len) in [
        ("pre_padding", attrs.geometry.pre_padding.len()),
        ("post_padding", attrs.geometry.post_padding.len()),
        ("dilation", attrs.geometry.dilation.len()),
    ] {
        if len != s {
            return Err(err(node, format!("{what} has {len} entries for {s} spatial dims")));
        }
    }
    if attrs
        .geometry
        .stride
        .iter()
        .chain(&attrs.geometry.dilation)
        .any(|&v| v < 1)
    {
        return Err(err(node, "stride and dilation must be >= 1"));
    }
    if attrs
        .geometry
        .pre_padding
        .iter()
        .chain(&attrs.geometry.post_padding)
        .any(|&v| v < 0)
    {
        return Err(err(node, "padding must be >= 0"));
    }
    for (name, d) in ts {
        if d.len() != s + 2 {
            return Err(err(
                node,
                format!(
                    "rank mismatch: `{name}` has dims {d:?}, expected rank {} for {s}-D conv",
                    s + 2
                ),
            ));
        }
    }
    Ok(())
}

fn groups(node: &str, c: i64, c_per_group: i64, k: i64) -> Result<i64> {
    if c_per_group <= 0 || c % c_per_group != 0 {
        return Err(err(
            node,
            format!("channel/group mismatch: input has {c} channels, filter has {c_per_group} per group"),
        ));
    }
    let g = c / c_per_group;
    if k % g != 0 {
        return Err(err(
            node,
            format!("channel/group mismatch: {k} filters not divisible into {g} groups"),
        ));
    }
    Ok(g)
}

fn conv_spatial(node: &str, xd: &[i64], wd: &[i64], a: &ConvAttrs) -> Result<Vec<i64>> {
    (0..a.spatial())
        .map(|i| {
            conv_output_size(
                xd[i + 2],
                wd[i + 2],
                a.geometry.pre_padding[i],
                a.geometry.post_padding[i],
                a.geometry.stride[i],
                a.geometry.dilation[i],
            )
            .filter(|&o| o >= 1)
            .ok_or_else(|| {
                err(
                    node,
                    format!(
                        "spatial dim {i}: filter {} (dilation {}) exceeds padded input {} + {} + {}",
                        wd[i + 2],
                        a.geometry.dilation[i],
                        xd[i + 2],
                        a.geometry.pre_padding[i],
                        a.geometry.post_padding[i]
                    ),
                )
            })
        })
        .collect()
}

fn check_pool(node: &str, a: &ResampleAttrs, xd: &[i64]) -> Result<()> {
    let s = a.spatial();
    if !(1..=3).contains(&s) || xd.len() != s + 2 {
        return Err(err(node, format!("rank mismatch: x {xd:?} for a {s}-D window")));
    }
    if a.stride.len() != s || a.pre_padding.len() != s || a.post_padding.len() != s {
        return Err(err(
            node,
            "window, stride and paddings must have one entry per spatial dim",
        ));
    }
    if a.window.iter().chain(&a.stride).any(|&v| v < 1) {
        return Err(err(node, "window and stride must be >= 1"));
    }
    for i in 0..s {
        if a.pre_padding[i] < 0
            || a.post_padding[i] < 0
            || a.pre_padding[i] >= a.window[i]
            || a.post_padding[i] >= a.window[i]
        {
            return Err(err(
                node,
                format!("padding of spatial dim {i} must be in 0..window ({})", a.window[i]),
            ));
        }
    }
    Ok(())
}

fn pool_dims(node: &str, xd: &[i64], a: &ResampleAttrs) -> Result<Vec<i64>> {
    let mut out = xd[..2].to_vec();
    for i in 0..a.spatial() {
        let o = pool_out(xd[i + 2], a.window[i], a.pre_padding[i], a.post_padding[i], a.stride[i])
            .filter(|&o| o >= 1)
            .ok_or_else(|| {
                err(
                    node,
                    format!(
                        "window {} exceeds padded input {} in spatial dim {i}",
                        a.window[i],
                        xd[i + 2]
                    ),
                )
            })?;
        out.push(o);
    }
    Ok(out)
}

fn broadcast(node: &str, a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (&x, &y))| match (x, y) {
            _ if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(err(node, format!("dims {a:?} and {b:?} do not broadcast at axis {i}"))),
        })
        .collect()
}
