//! The elementwise fuser: collects a run of float/bool elementwise operations of one output
//! shape (inputs may broadcast) into a [`kernels::fused::Program`](crate::ops::fused::Program).
//! Fills (`ones`, `zeros`, `full`) are constants of the run; a reshape of a tensor made before
//! the run, or a sum or mean of one over a dim of size 1, is read as a view of it, and so is a
//! swap or permutation of its dims (in a run that stays plain: inputs keep their strides,
//! burn-autodiff's `reshape`, `swap_dims`, product chains need no copy); values whose
//! shapes differ only in dims of size 1 (`[C]` and `[1, C, 1, 1]`) make a *flat* run, in one
//! element order; values of one smaller shape that broadcasts to the run's (batch-norm
//! statistics beside the normalization) make a *mixed* run, the small values computed by
//! every thread and stored once each.
//!
//! It sees burn-fusion's *relative* operations: tensor ids and dims are numbered within the
//! stream (dim id 0 is size 1) and scalars are indices into the execution context, so one
//! fused program serves every later run of the same pattern, whatever its sizes and scalar
//! values.

use std::collections::{HashMap, HashSet};

use burn_backend::DType;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{
    BaseOperationIr, BoolOperationIr, FloatOperationIr, NumericOperationIr, OperationIr, ScalarIr, TensorId, TensorIr,
    TensorStatus,
};

use crate::burn::fusion::elementwise::optimization::ElementwiseOptimization;
use crate::burn::fusion::engine::run::{last_use, Axes, FusedInput, FusedScalar, FusedView};
use crate::burn::fusion::CudnnOptimization;
use crate::burn::CudnnDevice;
use crate::graph::DataType;
use crate::ops::elementwise::{BinaryOp, CompareOp, UnaryOp};
use crate::ops::fused::{FusedOp, Program, Value, MAX_INPUTS, MAX_OPS, MAX_OUTPUTS, MAX_SCALARS};

/// An operand of one described operation.
enum Arg<'a> {
    Tensor(&'a TensorIr),
    /// A scalar, rounded to the given float dtype before use.
    Scalar(ScalarIr, DType),
}

/// What one operation computes (before its operands are resolved to program values).
enum Kind {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `args[0] ? args[1] : args[2]`.
    Select,
    /// The value itself: a fill's scalar, a sum or mean over a dim of size 1, or a reshape
    /// of a value of a flat run.
    Identity,
    Clamp,
    Round(DataType),
    FromBool,
    Not,
    And,
    Or,
}

/// One fusable operation: what it computes, its operands, its output.
struct Desc<'a> {
    kind: Kind,
    args: Vec<Arg<'a>>,
    out: &'a TensorIr,
}

fn float_storage(dtype: DType) -> Option<DataType> {
    match dtype {
        DType::F32 | DType::Flex32 => Some(DataType::F32),
        DType::F16 => Some(DataType::F16),
        DType::BF16 => Some(DataType::BF16),
        _ => None,
    }
}

/// Storage type of a tensor the fused kernels can read or write.
fn storage(dtype: DType) -> Option<DataType> {
    match dtype {
        DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8) => Some(DataType::Bool),
        _ => float_storage(dtype),
    }
}

fn unary(u: &burn_ir::UnaryOpIr, op: UnaryOp) -> Desc<'_> {
    Desc {
        kind: Kind::Unary(op),
        args: vec![Arg::Tensor(&u.input)],
        out: &u.out,
    }
}

fn binary(b: &burn_ir::BinaryOpIr, kind: Kind) -> Desc<'_> {
    Desc {
        kind,
        args: vec![Arg::Tensor(&b.lhs), Arg::Tensor(&b.rhs)],
        out: &b.out,
    }
}

fn scalar(s: &burn_ir::ScalarOpIr, kind: Kind) -> Desc<'_> {
    Desc {
        kind,
        args: vec![Arg::Tensor(&s.lhs), Arg::Scalar(s.rhs, s.lhs.dtype)],
        out: &s.out,
    }
}

/// A tensor of `out`'s shape filled with `value`.
fn constant(out: &TensorIr, value: f64) -> Desc<'_> {
    Desc {
        kind: Kind::Identity,
        args: vec![Arg::Scalar(ScalarIr::Float(value), out.dtype)],
        out,
    }
}

/// Whether dim `axis` of `t` has size 1 (relative dim id 0).
pub(crate) fn size_one(t: &TensorIr, axis: usize) -> bool {
    t.shape.get(axis) == Some(&0)
}

/// `(input, output)` of an operation whose output holds its input's elements in the same
/// order: a float reshape, or a float sum or mean over a dim of size 1.
fn same_elements(op: &OperationIr) -> Option<(&TensorIr, &TensorIr)> {
    match op {
        OperationIr::BaseFloat(BaseOperationIr::Reshape(r)) => Some((&r.input, &r.out)),
        OperationIr::NumericFloat(_, NumericOperationIr::SumDim(r) | NumericOperationIr::MeanDim(r))
            if size_one(&r.input, r.axis) =>
        {
            Some((&r.input, &r.out))
        }
        _ => None,
    }
}

/// `(input, output, axes)` of a float swap of two dims or permutation (dim `i` of the output
/// is dim `axes[i]` of the input).
fn permutation(op: &OperationIr) -> Option<(&TensorIr, &TensorIr, Axes)> {
    match op {
        OperationIr::BaseFloat(BaseOperationIr::SwapDims(s)) => {
            let rank = s.input.shape.len();
            if s.dim1 >= rank || s.dim2 >= rank {
                return None;
            }
            let mut axes: Axes = (0..rank).collect();
            axes.swap(s.dim1, s.dim2);
            Some((&s.input, &s.out, axes))
        }
        OperationIr::BaseFloat(BaseOperationIr::Permute(p)) => {
            let rank = p.input.shape.len();
            let mut seen = [false; 64];
            let valid = p.axes.len() == rank
                && rank <= seen.len()
                && p.axes
                    .iter()
                    .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true));
            valid.then(|| (&p.input, &p.out, p.axes.iter().copied().collect()))
        }
        _ => None,
    }
}

/// Relative dims of the value `op` makes, when it is an elementwise operation the fuser takes.
pub(crate) fn output_shape(op: &OperationIr) -> Option<Vec<usize>> {
    describe(op).map(|d| d.out.shape.iter().copied().collect())
}

/// The fusable description of `op`, or `None`.
fn describe(op: &OperationIr) -> Option<Desc<'_>> {
    use BinaryOp as B;
    use CompareOp as C;
    Some(match op {
        OperationIr::NumericFloat(_, n) => match n {
            NumericOperationIr::Add(b) => binary(b, Kind::Binary(B::Add)),
            NumericOperationIr::AddScalar(s) => scalar(s, Kind::Binary(B::Add)),
            NumericOperationIr::Sub(b) => binary(b, Kind::Binary(B::Sub)),
            NumericOperationIr::SubScalar(s) => scalar(s, Kind::Binary(B::Sub)),
            NumericOperationIr::Mul(b) => binary(b, Kind::Binary(B::Mul)),
            NumericOperationIr::MulScalar(s) => scalar(s, Kind::Binary(B::Mul)),
            NumericOperationIr::Div(b) => binary(b, Kind::Binary(B::Div)),
            NumericOperationIr::DivScalar(s) => scalar(s, Kind::Binary(B::Div)),
            NumericOperationIr::Rem(b) => binary(b, Kind::Binary(B::Rem)),
            NumericOperationIr::RemScalar(s) => scalar(s, Kind::Binary(B::Rem)),
            NumericOperationIr::Abs(u) => unary(u, UnaryOp::Abs),
            NumericOperationIr::Greater(b) => binary(b, Kind::Compare(C::Gt)),
            NumericOperationIr::GreaterElem(s) => scalar(s, Kind::Compare(C::Gt)),
            NumericOperationIr::GreaterEqual(b) => binary(b, Kind::Compare(C::Ge)),
            NumericOperationIr::GreaterEqualElem(s) => scalar(s, Kind::Compare(C::Ge)),
            NumericOperationIr::Lower(b) => binary(b, Kind::Compare(C::Lt)),
            NumericOperationIr::LowerElem(s) => scalar(s, Kind::Compare(C::Lt)),
            NumericOperationIr::LowerEqual(b) => binary(b, Kind::Compare(C::Le)),
            NumericOperationIr::LowerEqualElem(s) => scalar(s, Kind::Compare(C::Le)),
            NumericOperationIr::Full(f) => Desc {
                kind: Kind::Identity,
                args: vec![Arg::Scalar(f.value, f.out.dtype)],
                out: &f.out,
            },
            NumericOperationIr::SumDim(r) | NumericOperationIr::MeanDim(r) if size_one(&r.input, r.axis) => Desc {
                kind: Kind::Identity,
                args: vec![Arg::Tensor(&r.input)],
                out: &r.out,
            },
            NumericOperationIr::Clamp(c) => Desc {
                kind: Kind::Clamp,
                args: vec![
                    Arg::Tensor(&c.tensor),
                    Arg::Scalar(c.min, c.tensor.dtype),
                    Arg::Scalar(c.max, c.tensor.dtype),
                ],
                out: &c.out,
            },
            _ => return None,
        },
        OperationIr::Float(_, f) => match f {
            FloatOperationIr::Exp(u) => unary(u, UnaryOp::Exp),
            FloatOperationIr::Log(u) => unary(u, UnaryOp::Log),
            FloatOperationIr::Log1p(u) => unary(u, UnaryOp::Log1p),
            FloatOperationIr::Erf(u) => unary(u, UnaryOp::Erf),
            FloatOperationIr::Sqrt(u) => unary(u, UnaryOp::Sqrt),
            FloatOperationIr::Cos(u) => unary(u, UnaryOp::Cos),
            FloatOperationIr::Sin(u) => unary(u, UnaryOp::Sin),
            FloatOperationIr::Tan(u) => unary(u, UnaryOp::Tan),
            FloatOperationIr::Tanh(u) => unary(u, UnaryOp::Tanh),
            FloatOperationIr::Recip(u) => unary(u, UnaryOp::Recip),
            FloatOperationIr::Round(u) => unary(u, UnaryOp::Round),
            FloatOperationIr::Floor(u) => unary(u, UnaryOp::Floor),
            FloatOperationIr::Ceil(u) => unary(u, UnaryOp::Ceil),
            FloatOperationIr::Trunc(u) => unary(u, UnaryOp::Trunc),
            FloatOperationIr::PowfScalar(s) => scalar(s, Kind::Binary(B::Pow)),
            FloatOperationIr::Powf(b) => binary(b, Kind::Binary(B::Pow)),
            _ => return None,
        },
        OperationIr::BaseFloat(b) => match b {
            // A reshape of a value of the run (one made before it is a view): the identity,
            // taken when the run can be flat.
            BaseOperationIr::Reshape(r) => Desc {
                kind: Kind::Identity,
                args: vec![Arg::Tensor(&r.input)],
                out: &r.out,
            },
            BaseOperationIr::Equal(b) => binary(b, Kind::Compare(C::Eq)),
            BaseOperationIr::EqualElem(s) => scalar(s, Kind::Compare(C::Eq)),
            BaseOperationIr::Cast(c) => Desc {
                kind: Kind::Round(float_storage(c.out.dtype)?),
                args: vec![Arg::Tensor(&c.input)],
                out: &c.out,
            },
            BaseOperationIr::MaskWhere(m) => Desc {
                kind: Kind::Select,
                args: vec![Arg::Tensor(&m.mask), Arg::Tensor(&m.value), Arg::Tensor(&m.tensor)],
                out: &m.out,
            },
            BaseOperationIr::Ones(c) => constant(&c.out, 1.0),
            BaseOperationIr::Zeros(c) => constant(&c.out, 0.0),
            BaseOperationIr::MaskFill(m) => Desc {
                kind: Kind::Select,
                args: vec![
                    Arg::Tensor(&m.mask),
                    Arg::Scalar(m.value, m.tensor.dtype),
                    Arg::Tensor(&m.tensor),
                ],
                out: &m.out,
            },
            _ => return None,
        },
        OperationIr::Bool(b) => match b {
            BoolOperationIr::IntoFloat(c) => Desc {
                kind: Kind::FromBool,
                args: vec![Arg::Tensor(&c.input)],
                out: &c.out,
            },
            BoolOperationIr::Not(u) => Desc {
                kind: Kind::Not,
                args: vec![Arg::Tensor(&u.input)],
                out: &u.out,
            },
            BoolOperationIr::And(b) => binary(b, Kind::And),
            BoolOperationIr::Or(b) => binary(b, Kind::Or),
            _ => return None,
        },
        _ => return None,
    })
}

/// An input of the chain: a tensor made outside it.
#[derive(Clone, Debug)]
struct InputSlot {
    id: TensorId,
    storage: DataType,
    last_use: bool,
}

/// A reshape, or a sum or mean over a dim of size 1, or a permutation of the dims (a swap),
/// of a tensor made before the run (or of an earlier view): its output is a view of that
/// tensor, made when the run executes.
#[derive(Clone, Debug)]
struct ViewSlot {
    out: TensorId,
    source: TensorId,
    source_last_use: bool,
    /// The permutation (dim `i` of the view is dim `axes[i]` of its source); `None`: a
    /// reshape.
    axes: Option<Axes>,
}

/// Collects elementwise operations into one fused program (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct ElementwiseFuser {
    status: FuserStatus,
    /// Every absorbed operation, drops included (the optimization's state).
    absorbed: Vec<OperationIr>,
    /// Relative dims of every output in the chain.
    shape: Option<Vec<usize>>,
    inputs: Vec<InputSlot>,
    /// Tensors made in the chain: register and dtype.
    registers: HashMap<TensorId, (u16, DType)>,
    /// Tensors made in the chain in order.
    made: Vec<TensorId>,
    /// Tensors made in the chain whose last use is in it (or that were dropped): not stored.
    consumed: HashSet<TensorId>,
    /// Tensors made outside the chain and dropped inside it.
    dropped: Vec<TensorId>,
    /// Absorbed views of tensors made outside the chain, in order.
    views: Vec<ViewSlot>,
    /// Views whose last use is in the chain (or that were dropped): not registered.
    consumed_views: HashSet<TensorId>,
    scalars: Vec<FusedScalar>,
    ops: Vec<FusedOp>,
    /// The run reads an input broadcast against its shape.
    broadcast: bool,
    /// The run holds values whose shapes differ only in dims of size 1 (such as `[C]` and
    /// `[1, C, 1, 1]`): one element order for all, every input read as a view of one shape.
    flat: bool,
    /// The run as it was before its trailing permuted views (swaps no operation of the run
    /// has followed yet): burn-fusion is offered the run without them, so a swap that starts
    /// another pattern (Burn's composed linear weight gradient, `xᵀ` then a matmul) stays for
    /// that pattern's fuser.
    before_views: Option<Box<ElementwiseFuser>>,
    /// Whether the run may become flat, and its mixed runs read lower-rank inputs as the
    /// small shape (the reduction fuser's prologue may not: its kernel reads every input
    /// broadcast against the iteration shape).
    allow_flat: bool,
    /// A *mixed* run: values of the run's shape beside values of this smaller shape that
    /// broadcasts to it (Burn's batch-norm statistics `[1, C, 1, 1]`, and the `[C]` running
    /// statistics read as them, beside the `[N, C, H, W]` normalization): the small values
    /// are computed by every thread and stored once per element (see
    /// [`crate::ops::fused::Program::small_outputs`]).
    mixed: Option<Mixed>,
    /// The values of the small shape (or of a lower rank with its non-unit dims).
    small_values: HashSet<TensorId>,
    /// Relative dims of the values made in the run and of its inputs.
    shapes: HashMap<TensorId, Vec<usize>>,
    /// The device the run executes on: a run that reads no tensor (fills and arithmetic on
    /// them) launches there. Without it such a run is never ready.
    device: Option<CudnnDevice>,
}

/// `shape` without its dims of size 1 (relative dim id 0).
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 0).collect()
}

/// Whether `a` broadcasts to `b`: the same rank, each dim equal or of size 1.
fn broadcasts_to(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || x == 0)
}

/// The small shape of a mixed run, and the tensors whose dims its execution reads: one of
/// the run's shape and one of the small shape (of the run's rank).
#[derive(Clone, Debug)]
struct Mixed {
    small: Vec<usize>,
    refs: (TensorId, TensorId),
}

/// How an operation joins a mixed run (see [`ElementwiseFuser::mixed_join`]).
struct MixedJoin {
    /// The run's shape after the operation.
    run: Vec<usize>,
    /// The mixed run after it.
    mixed: Mixed,
    /// The operation's value has the small shape.
    out_small: bool,
    /// Every value made so far becomes small (the run grows to the operation's shape).
    promote: bool,
}

impl Default for ElementwiseFuser {
    fn default() -> Self {
        Self {
            status: FuserStatus::Open,
            absorbed: Vec::new(),
            shape: None,
            inputs: Vec::new(),
            registers: HashMap::new(),
            made: Vec::new(),
            consumed: HashSet::new(),
            dropped: Vec::new(),
            views: Vec::new(),
            consumed_views: HashSet::new(),
            before_views: None,
            scalars: Vec::new(),
            ops: Vec::new(),
            broadcast: false,
            flat: false,
            allow_flat: true,
            mixed: None,
            small_values: HashSet::new(),
            shapes: HashMap::new(),
            device: None,
        }
    }
}

impl ElementwiseFuser {
    /// The fuser of the runs that execute on `device`.
    pub(crate) fn on(device: CudnnDevice) -> Self {
        Self {
            device: Some(device),
            ..Self::default()
        }
    }

    /// The optimization these operations make on `device` (used to rebuild one from its
    /// state too).
    pub(crate) fn from_operations(ops: &[OperationIr], device: Option<CudnnDevice>) -> Option<ElementwiseOptimization> {
        let mut f = Self {
            device,
            ..Self::default()
        };
        for op in ops {
            f.fuse(op);
        }
        (f.absorbed.len() == ops.len() && !f.ops.is_empty() && f.has_device()).then(|| f.build())
    }

    /// Whether the run knows where it executes: on the device of a tensor it reads, else on
    /// the fuser's device.
    fn has_device(&self) -> bool {
        !self.inputs.is_empty() || self.device.is_some()
    }

    /// A fuser whose runs never become flat and whose mixed runs take only operands of the
    /// run's rank (for a prologue that a reduction reads with broadcast strides).
    pub(crate) fn without_flat_runs() -> Self {
        Self {
            allow_flat: false,
            ..Self::default()
        }
    }

    /// The view the run holds as tensor `id`, if any.
    fn view(&self, id: TensorId) -> Option<&ViewSlot> {
        self.views.iter().find(|v| v.out == id)
    }

    fn is_view(&self, id: TensorId) -> bool {
        self.view(id).is_some()
    }

    /// Whether the run holds a permuted view (its inputs are then read with their own
    /// strides, never as another shape: the run stays plain).
    fn has_permuted_view(&self) -> bool {
        self.views.iter().any(|v| v.axes.is_some())
    }

    /// Takes `out` as a view of `source` (a reshape, or the permutation `axes`) when `source`
    /// is made before the run (a view of a value of the run would need the value stored
    /// first). A permutation only in a plain run, and no reshape of a permuted view (it would
    /// need a copy). A permutation does not start a run: before the run's first operation it
    /// is taken only of a view the run holds (burn-autodiff's `reshape`, `swap_dims`), so a
    /// bare swap (attention's `kᵀ` before its matmul) does not hold burn-fusion's block open
    /// while the operations of other blocks go by unfused.
    fn try_view(&mut self, source: &TensorIr, out: &TensorIr, axes: Option<Axes>) -> bool {
        if self.registers.contains_key(&source.id) || storage(source.dtype).is_none() || out.dtype != source.dtype {
            return false;
        }
        let source_view = self.view(source.id);
        let permuted_source = source_view.is_some_and(|v| v.axes.is_some());
        let leading = self.ops.is_empty() && source_view.is_none();
        if axes.is_some() && (self.flat || self.mixed.is_some() || leading) || axes.is_none() && permuted_source {
            return false;
        }
        let source_last_use = last_use(source);
        if source_last_use && self.is_view(source.id) {
            self.consumed_views.insert(source.id);
        }
        self.views.push(ViewSlot {
            out: out.id,
            source: source.id,
            source_last_use,
            axes,
        });
        true
    }

    fn outputs_pending(&self) -> usize {
        self.made.len() - self.consumed.len()
    }

    /// Adds `op` if it fits; false (and no change) otherwise.
    pub(crate) fn try_add(&mut self, op: &OperationIr) -> bool {
        if let Some((source, out)) = same_elements(op) {
            if !self.registers.contains_key(&source.id) {
                return self.try_view(source, out, None);
            }
        }
        if let Some((source, out, axes)) = permutation(op) {
            return self.try_view(source, out, Some(axes));
        }
        let Some(d) = describe(op) else { return false };
        if storage(d.out.dtype).is_none() || self.ops.len() >= MAX_OPS || self.outputs_pending() >= MAX_OUTPUTS {
            return false;
        }
        let out_shape: Vec<usize> = d.out.shape.iter().copied().collect();
        let fit = if self.mixed.is_some() {
            None
        } else {
            self.fits(&d, &out_shape)
        };
        // A permuted view is read with its own strides: the run never becomes flat or mixed.
        let plain_only = self.has_permuted_view();
        match fit {
            Some((true, _)) if plain_only => false,
            Some(flat_broadcast) => self.push(&d, out_shape, None, flat_broadcast),
            None if plain_only => false,
            None => match self.mixed_join(&d, &out_shape) {
                Some(m) => self.push(&d, out_shape, Some(m), (false, true)),
                None => false,
            },
        }
    }

    /// The run's `(flat, broadcast)` with `d` (of shape `out_shape`) in a plain or flat run,
    /// or `None` when its shapes do not fit one. A value or input of another shape than the
    /// run's makes the run flat (its non-unit dims must agree); an input broadcast against it
    /// makes it a broadcast run; a run is never both.
    fn fits(&self, d: &Desc, out_shape: &[usize]) -> Option<(bool, bool)> {
        let (mut flat, mut broadcast) = (self.flat, self.broadcast);
        let may_flatten =
            |a: &[usize], b: &[usize], broadcast: bool| self.allow_flat && !broadcast && squeezed(a) == squeezed(b);
        if let Some(s) = self.shape.as_ref().filter(|s| s.as_slice() != out_shape) {
            if !may_flatten(s, out_shape, broadcast) {
                return None;
            }
            flat = true;
        }
        if let (Arg::Tensor(t), Kind::Identity) = (&d.args[0], &d.kind) {
            // A reshape of a value of the run keeps its elements in order only in a flat run.
            if self.registers.contains_key(&t.id) && t.shape != d.out.shape {
                if !may_flatten(&t.shape, out_shape, broadcast) {
                    return None;
                }
                flat = true;
            }
        }
        for a in &d.args {
            if let Arg::Tensor(t) = a {
                if self.registers.contains_key(&t.id) || t.shape.as_slice() == out_shape {
                    continue;
                }
                // Relative dim id 0 is size 1: broadcast.
                if broadcasts_to(&t.shape, out_shape) && !flat {
                    broadcast = true;
                } else if may_flatten(&t.shape, out_shape, broadcast) {
                    flat = true;
                } else {
                    return None;
                }
            }
        }
        Some((flat, broadcast))
    }

    /// How `d` (of shape `out`) joins the run as a mixed run, if it can: the run already
    /// mixed, a value of a smaller shape beside a plain run's (or a larger one, making the
    /// run's values small), or a value larger than a flat run's whose one shape of its rank
    /// becomes the small shape. An operation on the small values reads nothing of the run's
    /// shape.
    fn mixed_join(&self, d: &Desc, out: &[usize]) -> Option<MixedJoin> {
        let run = self.shape.as_ref()?;
        let first = *self.made.first()?;
        let (run, small, out_small, promote, refs) = match (&self.mixed, self.flat) {
            (Some(Mixed { small, refs }), _) => {
                let out_small = out == small.as_slice() || (out.len() < run.len() && squeezed(out) == squeezed(small));
                if !out_small && out != run.as_slice() {
                    return None;
                }
                (run.clone(), small.clone(), out_small, false, *refs)
            }
            (None, false) if out != run.as_slice() && broadcasts_to(out, run) => {
                (run.clone(), out.to_vec(), true, false, (first, d.out.id))
            }
            (None, false) if out != run.as_slice() && broadcasts_to(run, out) => {
                (out.to_vec(), run.clone(), false, true, (d.out.id, first))
            }
            (None, true) => {
                // The flat run's one shape of the new value's rank, that broadcasts to it.
                let mut of_rank = self.shapes.iter().filter(|(_, s)| s.len() == out.len());
                let (&id, small) = of_rank.next()?;
                if of_rank.any(|(_, s)| s != small) || small.as_slice() == out || !broadcasts_to(small, out) {
                    return None;
                }
                (out.to_vec(), small.clone(), false, true, (d.out.id, id))
            }
            _ => return None,
        };
        let small_operand = |t: &TensorIr| {
            if self.registers.contains_key(&t.id) {
                promote || self.small_values.contains(&t.id)
            } else {
                broadcasts_to(&t.shape, &small)
                    || (self.allow_flat && t.shape.len() < run.len() && squeezed(&t.shape) == squeezed(&small))
            }
        };
        for a in &d.args {
            let Arg::Tensor(t) = a else { continue };
            let fits = if out_small {
                small_operand(t)
            } else {
                self.registers.contains_key(&t.id) || broadcasts_to(&t.shape, &run) || small_operand(t)
            };
            if !fits {
                return None;
            }
        }
        Some(MixedJoin {
            run,
            mixed: Mixed { small, refs },
            out_small,
            promote,
        })
    }

    /// Adds `d` (of shape `out_shape`) once its shapes fit: `mixed` for a
    /// mixed run, else the run's new `(flat, broadcast)`. False (and no change) when the
    /// program's input or scalar room runs out.
    fn push(
        &mut self,
        d: &Desc,
        out_shape: Vec<usize>,
        mixed: Option<MixedJoin>,
        (flat, broadcast): (bool, bool),
    ) -> bool {
        let mut new_inputs = 0;
        let mut new_scalars = 0;
        for a in &d.args {
            match a {
                Arg::Tensor(t) => {
                    if self.registers.contains_key(&t.id) {
                        continue;
                    }
                    if storage(t.dtype).is_none() {
                        return false;
                    }
                    if !self.inputs.iter().any(|i| i.id == t.id) {
                        new_inputs += 1;
                    }
                }
                Arg::Scalar(s, dtype) => {
                    if matches!(s, ScalarIr::Bool(_)) || float_storage(*dtype).is_none() {
                        return false;
                    }
                    new_scalars += 1;
                }
            }
        }
        if self.inputs.len() + new_inputs > MAX_INPUTS || self.scalars.len() + new_scalars > MAX_SCALARS {
            return false;
        }
        match mixed {
            Some(m) => {
                if m.promote {
                    self.small_values.extend(self.made.iter().copied());
                }
                if m.out_small {
                    self.small_values.insert(d.out.id);
                }
                self.shape = Some(m.run);
                self.mixed = Some(m.mixed);
                (self.flat, self.broadcast) = (false, true);
            }
            None => (self.flat, self.broadcast) = (flat, broadcast),
        }
        let mut values = Vec::with_capacity(d.args.len());
        for a in &d.args {
            values.push(match a {
                Arg::Tensor(t) => self.operand(t),
                Arg::Scalar(s, dtype) => {
                    self.scalars.push(FusedScalar {
                        value: *s,
                        round_to: *dtype,
                    });
                    Value::Scalar((self.scalars.len() - 1) as u8)
                }
            });
        }
        let fused = match d.kind {
            // Only parameterless unary ops are described (the program's validation checks it).
            Kind::Unary(u) => FusedOp::Unary(u.code(), values[0]),
            Kind::Binary(b) => FusedOp::Binary(b, values[0], values[1]),
            Kind::Compare(c) => FusedOp::Compare(c, values[0], values[1]),
            Kind::Select => FusedOp::Select(values[0], values[1], values[2]),
            // Rounding to f32 is the identity.
            Kind::Identity => FusedOp::Round(values[0], DataType::F32),
            Kind::Clamp => FusedOp::Clamp(values[0], values[1], values[2]),
            Kind::Round(to) => FusedOp::Round(values[0], to),
            Kind::FromBool => FusedOp::FromBool(values[0]),
            Kind::Not => FusedOp::Not(values[0]),
            Kind::And => FusedOp::And(values[0], values[1]),
            Kind::Or => FusedOp::Or(values[0], values[1]),
        };
        self.ops.push(fused);
        self.registers
            .insert(d.out.id, ((self.ops.len() - 1) as u16, d.out.dtype));
        self.made.push(d.out.id);
        self.shapes.insert(d.out.id, out_shape.clone());
        self.shape.get_or_insert(out_shape);
        true
    }

    /// The program value of tensor `t`, registering a new input or a last use.
    pub(crate) fn operand(&mut self, t: &TensorIr) -> Value {
        let last_use = t.status == TensorStatus::ReadWrite;
        if let Some(&(r, _)) = self.registers.get(&t.id) {
            if last_use {
                self.consumed.insert(t.id);
            }
            return Value::Reg(r);
        }
        if last_use && self.is_view(t.id) {
            self.consumed_views.insert(t.id);
        }
        if let Some(k) = self.inputs.iter().position(|i| i.id == t.id) {
            self.inputs[k].last_use |= last_use;
            return Value::Input(k as u8);
        }
        self.inputs.push(InputSlot {
            id: t.id,
            storage: storage(t.dtype).unwrap_or(DataType::F32),
            last_use,
        });
        self.shapes.insert(t.id, t.shape.iter().copied().collect());
        Value::Input((self.inputs.len() - 1) as u8)
    }

    /// Whether tensor `id` is made by the run or already one of its inputs.
    pub(crate) fn knows(&self, id: TensorId) -> bool {
        self.registers.contains_key(&id) || self.inputs.iter().any(|i| i.id == id)
    }

    /// Whether the program reads at least one tensor (the reduction fuser's runs launch on
    /// the device of a tensor they read).
    pub(crate) fn has_inputs(&self) -> bool {
        !self.inputs.is_empty()
    }

    /// Whether one more input fits the program.
    pub(crate) fn has_input_room(&self) -> bool {
        self.inputs.len() < MAX_INPUTS
    }

    /// How many operations the program has.
    pub(crate) fn operation_count(&self) -> usize {
        self.ops.len()
    }

    /// Whether `op` may follow a reduction over `full` in the run: an elementwise operation
    /// whose operands and value broadcast to `full`, and not a view of a tensor made before
    /// the run (the reduction's result, which such an operation may read, exists only once
    /// the run has executed).
    pub(crate) fn fits_epilogue(&self, op: &OperationIr, full: &[usize]) -> bool {
        if let Some((source, _)) = same_elements(op) {
            if !self.registers.contains_key(&source.id) {
                return false;
            }
        }
        let Some(d) = describe(op) else { return false };
        broadcasts_to(&d.out.shape, full)
            && d.args.iter().all(|a| match a {
                Arg::Tensor(t) => broadcasts_to(&t.shape, full),
                Arg::Scalar(..) => true,
            })
    }

    /// The mixed run's small shape (relative dims, the run's rank) when a value of it would
    /// be stored (read after the run).
    pub(crate) fn stored_small_shape(&self) -> Option<&[usize]> {
        let mixed = self.mixed.as_ref()?;
        self.made
            .iter()
            .any(|id| !self.consumed.contains(id) && self.small_values.contains(id))
            .then_some(mixed.small.as_slice())
    }

    /// Relative dims of the run's values (`None` before the first operation).
    pub(crate) fn run_shape(&self) -> Option<&[usize]> {
        self.shape.as_deref()
    }

    /// A drop of tensor `t` inside the run: a value or view of the run is then not stored, a
    /// tensor made outside has its handle released when the run executes.
    pub(crate) fn drop_tensor(&mut self, t: &TensorIr) {
        if self.is_view(t.id) {
            self.consumed_views.insert(t.id);
        } else if self.registers.contains_key(&t.id) {
            self.consumed.insert(t.id);
        } else {
            self.dropped.push(t.id);
        }
    }

    pub(crate) fn build(&self) -> ElementwiseOptimization {
        let outputs: Vec<(TensorId, u16, DType)> = self
            .made
            .iter()
            .filter(|id| !self.consumed.contains(id))
            .map(|id| {
                let (r, dtype) = self.registers[id];
                (*id, r, dtype)
            })
            .collect();
        let program = Program {
            inputs: self.inputs.iter().map(|i| i.storage).collect(),
            scalars: self.scalars.len(),
            ops: self.ops.clone(),
            outputs: outputs
                .iter()
                .map(|&(_, r, dtype)| (r, storage(dtype).unwrap_or(DataType::F32)))
                .collect(),
            small_outputs: outputs
                .iter()
                .enumerate()
                .filter(|(_, (id, _, _))| self.mixed.is_some() && self.small_values.contains(id))
                .fold(0u16, |m, (j, _)| m | 1 << j),
        };
        ElementwiseOptimization {
            program,
            inputs: self
                .inputs
                .iter()
                .map(|i| FusedInput {
                    id: i.id,
                    last_use: i.last_use,
                })
                .collect(),
            outputs: outputs.iter().map(|&(id, _, dtype)| (id, dtype)).collect(),
            dropped: self.dropped.clone(),
            views: self
                .views
                .iter()
                .map(|v| FusedView {
                    out: v.out,
                    source: v.source,
                    source_last_use: v.source_last_use,
                    keep: !self.consumed_views.contains(&v.out),
                    axes: v.axes.clone(),
                })
                .collect(),
            scalars: self.scalars.clone(),
            flat: self.flat,
            mixed: self.mixed.as_ref().map(|m| m.refs),
            device: self.device,
            operations: self.absorbed.clone(),
            function: None,
            unbuildable: false,
            packed: Default::default(),
        }
    }
}

impl ElementwiseFuser {
    /// The run burn-fusion is offered: without its trailing permuted views.
    fn offered(&self) -> &ElementwiseFuser {
        self.before_views.as_deref().unwrap_or(self)
    }
}

impl OperationFuser<CudnnOptimization> for ElementwiseFuser {
    fn fuse(&mut self, op: &OperationIr) {
        if self.status == FuserStatus::Closed {
            return;
        }
        let swap = permutation(op).is_some();
        let before = (swap && self.before_views.is_none()).then(|| Box::new(self.clone()));
        let added = match op {
            OperationIr::Drop(t) if !self.ops.is_empty() => {
                self.drop_tensor(t);
                true
            }
            OperationIr::Drop(_) => false,
            _ => self.try_add(op),
        };
        if added {
            self.absorbed.push(op.clone());
            if before.is_some() {
                self.before_views = before;
            } else if !swap && !matches!(op, OperationIr::Drop(_)) {
                // An operation after the swaps: they are inside the run now.
                self.before_views = None;
            }
        } else {
            self.status = FuserStatus::Closed;
        }
    }

    fn finish(&mut self) -> CudnnOptimization {
        CudnnOptimization::Elementwise(self.offered().build())
    }

    fn reset(&mut self) {
        // burn-fusion resets a fuser before each new block: where it runs stays.
        *self = Self {
            device: self.device,
            allow_flat: self.allow_flat,
            ..Self::default()
        };
    }

    fn status(&self) -> FuserStatus {
        self.status
    }

    fn properties(&self) -> FuserProperties {
        let run = self.offered();
        FuserProperties {
            score: run.ops.len() as u64,
            // Runs of two or more: a run of one operation taken alone gave wrong results in
            // the conformance suite (`float_trunc` computed like the case before it), not
            // yet explained, so single operations stay on the backend's own kernels.
            ready: run.ops.len() >= 2 && run.has_device(),
        }
    }

    fn len(&self) -> usize {
        self.offered().absorbed.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<CudnnOptimization>> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::BoolStore;
    use burn_ir::{BinaryOpIr, CastOpIr, MaskFillOpIr, ScalarOpIr, ShapeOpIr, UnaryOpIr};

    use super::*;

    use crate::burn::fusion::test_ir::t;

    const RO: TensorStatus = TensorStatus::ReadOnly;
    const RW: TensorStatus = TensorStatus::ReadWrite;
    const NEW: TensorStatus = TensorStatus::NotInit;
    const BOOL: DType = DType::Bool(BoolStore::Native);

    /// relu(a + b) as Burn composes it under fusion: add, lower_equal_elem, mask_fill.
    fn relu_of_sum(b_status: TensorStatus) -> Vec<OperationIr> {
        vec![
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::Add(BinaryOpIr {
                    lhs: t(1, &[2, 3], RW, DType::F32),
                    rhs: t(2, &[0, 3], b_status, DType::F32), // dim id 0: size 1 (broadcast)
                    out: t(3, &[2, 3], NEW, DType::F32),
                }),
            ),
            OperationIr::NumericFloat(
                DType::F32,
                NumericOperationIr::LowerEqualElem(ScalarOpIr {
                    lhs: t(3, &[2, 3], RO, DType::F32),
                    rhs: ScalarIr::UInt(0),
                    out: t(4, &[2, 3], NEW, BOOL),
                }),
            ),
            OperationIr::BaseFloat(BaseOperationIr::MaskFill(MaskFillOpIr {
                tensor: t(3, &[2, 3], RW, DType::F32),
                mask: t(4, &[2, 3], RW, BOOL),
                value: ScalarIr::UInt(1),
                out: t(5, &[2, 3], NEW, DType::F32),
            })),
        ]
    }

    fn fuse_all(ops: &[OperationIr]) -> ElementwiseFuser {
        let mut f = ElementwiseFuser::default();
        for op in ops {
            f.fuse(op);
        }
        f
    }

    #[test]
    fn a_chain_with_broadcast_becomes_one_program_storing_only_what_outlives_it() {
        let f = fuse_all(&relu_of_sum(RO));
        assert_eq!(f.status(), FuserStatus::Open);
        assert_eq!(f.len(), 3);
        assert!(f.properties().ready);
        let e = f.build();
        e.program.validate().unwrap();
        assert_eq!(e.program.inputs, vec![DataType::F32, DataType::F32]);
        assert_eq!(e.program.scalars, 2);
        // The sum and the mask die inside the run: only the relu output is stored.
        assert_eq!(e.outputs, vec![(TensorId::new(5), DType::F32)]);
        assert_eq!(e.program.outputs, vec![(2, DataType::F32)]);
        assert!(e.inputs[0].last_use && !e.inputs[1].last_use);
    }

    #[test]
    fn a_value_read_later_outside_the_run_is_stored() {
        let mut ops = relu_of_sum(RO);
        // The sum's last use is no longer inside the run.
        if let OperationIr::BaseFloat(BaseOperationIr::MaskFill(m)) = &mut ops[2] {
            m.tensor.status = RO;
        }
        let e = fuse_all(&ops).build();
        assert_eq!(
            e.outputs,
            vec![(TensorId::new(3), DType::F32), (TensorId::new(5), DType::F32)]
        );
    }

    #[test]
    fn drops_are_absorbed_and_other_shapes_or_ops_close_the_run() {
        let mut ops = relu_of_sum(RO);
        ops.push(OperationIr::Drop(t(2, &[0, 3], RW, DType::F32)));
        let f = fuse_all(&ops);
        assert_eq!(f.len(), 4);
        assert_eq!(f.build().dropped, vec![TensorId::new(2)]);

        // An output of another shape closes the run and leaves it unchanged.
        let mut f = fuse_all(&relu_of_sum(RO));
        f.fuse(&OperationIr::Float(
            DType::F32,
            FloatOperationIr::Exp(UnaryOpIr {
                input: t(5, &[2, 0], RO, DType::F32),
                out: t(6, &[2, 0], NEW, DType::F32),
            }),
        ));
        assert_eq!(f.status(), FuserStatus::Closed);
        assert_eq!(f.len(), 3);

        // f64 and int tensors are not fused; a drop cannot start a run.
        let mut f = ElementwiseFuser::default();
        f.fuse(&OperationIr::Float(
            DType::F64,
            FloatOperationIr::Exp(UnaryOpIr {
                input: t(1, &[4], RO, DType::F64),
                out: t(2, &[4], NEW, DType::F64),
            }),
        ));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 0));
        let mut f = ElementwiseFuser::default();
        f.fuse(&OperationIr::Drop(t(1, &[4], RW, DType::F32)));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 0));
    }

    fn binary_op(op: fn(BinaryOpIr) -> NumericOperationIr, lhs: TensorIr, rhs: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::NumericFloat(DType::F32, op(BinaryOpIr { lhs, rhs, out }))
    }

    fn reshape(input: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::Reshape(ShapeOpIr { input, out }))
    }

    fn swap(input: TensorIr, out: TensorIr, dim1: usize, dim2: usize) -> OperationIr {
        OperationIr::BaseFloat(BaseOperationIr::SwapDims(burn_ir::SwapDimsOpIr {
            input,
            out,
            dim1,
            dim2,
        }))
    }

    #[test]
    fn swapped_views_join_a_plain_run_and_keep_it_plain() {
        let f32 = DType::F32;
        // grad.reshape([C, N, H, W]).swap_dims(0, 1) * x, as burn-autodiff composes the
        // gradient through a channel view.
        let ops = vec![
            reshape(t(1, &[2, 5], RW, f32), t(2, &[2, 1, 3, 4], NEW, f32)),
            swap(t(2, &[2, 1, 3, 4], RW, f32), t(3, &[1, 2, 3, 4], NEW, f32), 0, 1),
            binary_op(
                NumericOperationIr::Mul,
                t(3, &[1, 2, 3, 4], RW, f32),
                t(4, &[1, 2, 3, 4], RO, f32),
                t(5, &[1, 2, 3, 4], NEW, f32),
            ),
        ];
        let mut f = fuse_all(&ops);
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 3));
        let e = f.build();
        assert_eq!(e.views.len(), 2);
        assert_eq!(e.views[1].axes.as_deref(), Some(&[1, 0, 2, 3][..]));
        assert!(!e.flat && e.mixed.is_none());
        // The run may not become flat now (its permuted input cannot be read as another shape).
        f.fuse(&binary_op(
            NumericOperationIr::Add,
            t(5, &[1, 2, 3, 4], RO, f32),
            t(6, &[1, 2, 3, 4, 0], RO, f32),
            t(7, &[1, 2, 3, 4, 0], NEW, f32),
        ));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 3));
        // No reshape of a permuted view (it would need a copy).
        let mut ops = ops[..2].to_vec();
        ops.push(reshape(t(3, &[1, 2, 3, 4], RW, f32), t(8, &[1, 6], NEW, f32)));
        let f = fuse_all(&ops);
        // Closed at the reshape; the swap no operation followed is not offered either.
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 1));
        // A swap that no operation of the run follows is left out of what burn-fusion is
        // offered (it may start another pattern: xᵀ then a matmul).
        let mut f = fuse_all(&[
            binary_op(
                NumericOperationIr::Add,
                t(20, &[1, 2], RO, f32),
                t(21, &[1, 2], RO, f32),
                t(22, &[1, 2], NEW, f32),
            ),
            binary_op(
                NumericOperationIr::Mul,
                t(22, &[1, 2], RW, f32),
                t(21, &[1, 2], RO, f32),
                t(23, &[1, 2], NEW, f32),
            ),
            swap(t(24, &[3, 4], RO, f32), t(25, &[4, 3], NEW, f32), 0, 1),
        ]);
        assert_eq!((f.status(), f.len(), f.properties().score), (FuserStatus::Open, 2, 2));
        assert!(f.build().views.len() == 1 && f.offered().build().views.is_empty());
        // An operation after it brings it into the run.
        f.fuse(&binary_op(
            NumericOperationIr::Mul,
            t(25, &[4, 3], RW, f32),
            t(26, &[4, 3], RO, f32),
            t(27, &[4, 3], NEW, f32),
        ));
        assert_eq!(
            f.status(),
            FuserStatus::Closed,
            "another shape: a plain run of [1, 2] ends"
        );
        // A bare swap does not start a run; a swap of a view the run holds does.
        let g = fuse_all(&[swap(t(24, &[3, 4], RO, f32), t(25, &[4, 3], NEW, f32), 0, 1)]);
        assert_eq!((g.status(), g.len()), (FuserStatus::Closed, 0));
        let mut g = fuse_all(&[
            reshape(t(23, &[12], RO, f32), t(24, &[3, 4], NEW, f32)),
            swap(t(24, &[3, 4], RW, f32), t(25, &[4, 3], NEW, f32), 0, 1),
            binary_op(
                NumericOperationIr::Mul,
                t(25, &[4, 3], RW, f32),
                t(26, &[4, 3], RO, f32),
                t(27, &[4, 3], NEW, f32),
            ),
        ]);
        assert_eq!((g.status(), g.len()), (FuserStatus::Open, 3));
        g.fuse(&binary_op(
            NumericOperationIr::Add,
            t(27, &[4, 3], RW, f32),
            t(26, &[4, 3], RO, f32),
            t(28, &[4, 3], NEW, f32),
        ));
        assert!(g.properties().ready && g.len() == 4);
        // A permutation whose axes are not one (malformed) is not taken.
        let bad = OperationIr::BaseFloat(BaseOperationIr::Permute(burn_ir::PermuteOpIr {
            input: t(24, &[3, 4], RW, f32),
            out: t(29, &[3, 4], NEW, f32),
            axes: vec![0, 0],
        }));
        assert!(permutation(&bad).is_none());
        // No permutation in a flat run.
        let flat = vec![
            binary_op(
                NumericOperationIr::Add,
                t(10, &[2], RO, f32),
                t(11, &[0, 2, 0, 0], RO, f32),
                t(12, &[0, 2, 0, 0], NEW, f32),
            ),
            swap(t(13, &[2, 3], RO, f32), t(14, &[3, 2], NEW, f32), 0, 1),
        ];
        let f = fuse_all(&flat);
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 1));
    }

    #[test]
    fn reshaped_parameters_join_the_run_as_views() {
        // Burn's batch-norm affine: (x - mean) / std * gamma.reshape([1, C, 1, 1]) +
        // beta.reshape([1, C, 1, 1]); gamma's view is read again later (by the backward pass).
        let f32 = DType::F32;
        let ops = vec![
            binary_op(
                NumericOperationIr::Sub,
                t(1, &[2, 3, 4, 4], RO, f32),
                t(2, &[0, 3, 0, 0], RO, f32),
                t(3, &[2, 3, 4, 4], NEW, f32),
            ),
            binary_op(
                NumericOperationIr::Div,
                t(3, &[2, 3, 4, 4], RO, f32),
                t(4, &[0, 3, 0, 0], RO, f32),
                t(5, &[2, 3, 4, 4], NEW, f32),
            ),
            reshape(t(6, &[3], RO, f32), t(7, &[0, 3, 0, 0], NEW, f32)),
            binary_op(
                NumericOperationIr::Mul,
                t(5, &[2, 3, 4, 4], RO, f32),
                t(7, &[0, 3, 0, 0], RO, f32),
                t(8, &[2, 3, 4, 4], NEW, f32),
            ),
            reshape(t(9, &[3], RO, f32), t(10, &[0, 3, 0, 0], NEW, f32)),
            binary_op(
                NumericOperationIr::Add,
                t(8, &[2, 3, 4, 4], RW, f32),
                t(10, &[0, 3, 0, 0], RW, f32),
                t(11, &[2, 3, 4, 4], NEW, f32),
            ),
        ];
        let f = fuse_all(&ops);
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 6));
        assert!(f.properties().ready);
        let e = f.build();
        // Views are not values of the program: the count of stored values the fuser checks
        // against the program's limit is the count the program stores (the normalized values
        // are read later, by the backward pass).
        let stored: Vec<_> = e.outputs.iter().map(|o| o.0).collect();
        assert_eq!(stored, [3, 5, 11].map(TensorId::new));
        assert_eq!(f.outputs_pending(), e.outputs.len());
        e.program.validate().unwrap();
        assert_eq!(e.program.ops.len(), 4);
        let views: Vec<_> = e
            .views
            .iter()
            .map(|v| (v.out, v.source, v.source_last_use, v.keep))
            .collect();
        assert_eq!(
            views,
            vec![
                (TensorId::new(7), TensorId::new(6), false, true),
                (TensorId::new(10), TensorId::new(9), false, false),
            ]
        );
        let inputs: Vec<_> = e.inputs.iter().map(|i| i.id).collect();
        assert_eq!(inputs, [1, 2, 4, 7, 10].map(TensorId::new));
        // A reshape of a value made in the run closes it.
        let mut f = fuse_all(&ops[..2]);
        f.fuse(&reshape(t(5, &[2, 3, 4, 4], RO, f32), t(12, &[2, 3, 0, 16], NEW, f32)));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 2));
    }

    #[test]
    fn mean_dim_backward_is_one_program() {
        // burn-autodiff's mean_dim backward: ones(shape) * (1 / n) * grad.sum_dim(1), where
        // grad's dim 1 has size 1 (the sum is the identity).
        let f32 = DType::F32;
        let ops = vec![
            OperationIr::BaseFloat(BaseOperationIr::Ones(burn_ir::CreationOpIr {
                out: t(1, &[2, 3], NEW, f32),
            })),
            OperationIr::NumericFloat(
                f32,
                NumericOperationIr::MulScalar(ScalarOpIr {
                    lhs: t(1, &[2, 3], RW, f32),
                    rhs: ScalarIr::UInt(0),
                    out: t(2, &[2, 3], NEW, f32),
                }),
            ),
            OperationIr::NumericFloat(
                f32,
                NumericOperationIr::SumDim(burn_ir::ReduceDimOpIr {
                    input: t(3, &[2, 0], RW, f32),
                    out: t(4, &[2, 0], NEW, f32),
                    axis: 1,
                    accumulator_len: 1,
                }),
            ),
            binary_op(
                NumericOperationIr::Mul,
                t(2, &[2, 3], RW, f32),
                t(4, &[2, 0], RW, f32),
                t(5, &[2, 3], NEW, f32),
            ),
        ];
        let f = fuse_all(&ops);
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 4));
        assert!(f.properties().ready);
        let e = f.build();
        e.program.validate().unwrap();
        assert_eq!(e.program.ops[0], FusedOp::Round(Value::Scalar(0), DataType::F32));
        assert_eq!(e.scalars[0].value, ScalarIr::Float(1.0));
        assert_eq!(e.outputs, vec![(TensorId::new(5), f32)]);
        // The summed gradient is a view of the gradient, read at its last use and not kept.
        assert_eq!(
            e.inputs.iter().map(|i| (i.id, i.last_use)).collect::<Vec<_>>(),
            vec![(TensorId::new(4), true)]
        );
        assert_eq!(
            e.views
                .iter()
                .map(|v| (v.source, v.source_last_use, v.keep))
                .collect::<Vec<_>>(),
            vec![(TensorId::new(3), true, false)]
        );
        // Fills alone read no tensor: ready only where the fuser knows its device.
        assert!(!fuse_all(&ops[..2]).properties().ready);
        let mut f = ElementwiseFuser::on(CudnnDevice::new(0));
        for op in &ops[..2] {
            f.fuse(op);
        }
        assert!(f.properties().ready);
        let e = f.build();
        e.program.validate().unwrap();
        assert!(e.inputs.is_empty() && e.device == Some(CudnnDevice::new(0)));
        // burn-fusion resets its fusers for each block: the device stays.
        f.reset();
        for op in &ops[..2] {
            f.fuse(op);
        }
        assert!(f.properties().ready);
    }

    fn mul_scalar(input: TensorIr, scalar: u64, out: TensorIr) -> OperationIr {
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::MulScalar(ScalarOpIr {
                lhs: input,
                rhs: ScalarIr::UInt(scalar),
                out,
            }),
        )
    }

    #[test]
    fn values_that_differ_only_in_unit_dims_make_one_flat_run() {
        // Burn's running mean: running_mean * (1 - m) + (mean * m).reshape([C]), `mean` of
        // shape [1, C, 1, 1].
        let f32 = DType::F32;
        let ops = vec![
            mul_scalar(t(1, &[3], RW, f32), 0, t(2, &[3], NEW, f32)),
            mul_scalar(t(3, &[0, 3, 0, 0], RO, f32), 1, t(4, &[0, 3, 0, 0], NEW, f32)),
            reshape(t(4, &[0, 3, 0, 0], RW, f32), t(5, &[3], NEW, f32)),
            binary_op(
                NumericOperationIr::Add,
                t(2, &[3], RW, f32),
                t(5, &[3], RW, f32),
                t(6, &[3], NEW, f32),
            ),
        ];
        let f = fuse_all(&ops);
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 4));
        assert!(f.properties().ready);
        let e = f.build();
        e.program.validate().unwrap();
        assert!(e.flat);
        assert_eq!(e.program.ops[2], FusedOp::Round(Value::Reg(1), DataType::F32));
        assert_eq!(e.outputs, vec![(TensorId::new(6), f32)]);
        assert!(e.views.is_empty());

        // A run that reads a broadcast input does not also take a reshape of its values, and
        // the reduction fuser's prologue never becomes flat.
        let broadcast = binary_op(
            NumericOperationIr::Add,
            t(1, &[2, 3], RO, f32),
            t(2, &[0, 3], RO, f32),
            t(3, &[2, 3], NEW, f32),
        );
        let squeeze = reshape(t(3, &[2, 3], RO, f32), t(4, &[0, 2, 3], NEW, f32));
        let mut f = fuse_all(std::slice::from_ref(&broadcast));
        f.fuse(&squeeze);
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 1));
        let mut f = ElementwiseFuser::without_flat_runs();
        for op in &ops {
            f.fuse(op);
        }
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 1));
        // Flat first, then a broadcast input: closed before it.
        let mut f = fuse_all(&ops[1..3]);
        assert!(f.flat);
        f.fuse(&binary_op(
            NumericOperationIr::Add,
            t(5, &[3], RO, f32),
            t(7, &[0], RO, f32),
            t(8, &[3], NEW, f32),
        ));
        assert_eq!(f.status(), FuserStatus::Closed);
    }

    #[test]
    fn statistics_join_the_normalization_as_small_values_of_a_mixed_run() {
        // Burn's batch norm after its two reductions: the running mean ([C], flat with the
        // [1, C, 1, 1] mean), then the [N, C, H, W] normalization reading the mean, then the
        // std (sqrt(var + eps), [1, C, 1, 1]) and the division by it.
        let f32 = DType::F32;
        let (c, full) = (&[0usize, 3, 0, 0][..], &[1usize, 3, 2, 2][..]);
        let mut ops = vec![
            mul_scalar(t(1, &[3], RW, f32), 0, t(2, &[3], NEW, f32)),
            mul_scalar(t(3, c, RO, f32), 1, t(4, c, NEW, f32)),
            reshape(t(4, c, RW, f32), t(5, &[3], NEW, f32)),
            binary_op(
                NumericOperationIr::Add,
                t(2, &[3], RW, f32),
                t(5, &[3], RW, f32),
                t(6, &[3], NEW, f32),
            ),
            binary_op(
                NumericOperationIr::Sub,
                t(7, full, RO, f32),
                t(3, c, RW, f32),
                t(8, full, NEW, f32),
            ),
            mul_scalar(t(9, c, RO, f32), 2, t(10, c, NEW, f32)),
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Sqrt(UnaryOpIr {
                    input: t(10, c, RW, f32),
                    out: t(11, c, NEW, f32),
                }),
            ),
            binary_op(
                NumericOperationIr::Div,
                t(8, full, RW, f32),
                t(11, c, RO, f32),
                t(12, full, NEW, f32),
            ),
        ];
        let f = fuse_all(&ops);
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 8));
        let e = f.build();
        e.program.validate().unwrap();
        assert!(!e.flat && e.mixed.is_some());
        // Stored: the running mean [C] and the std [1, C, 1, 1] (small), the output (full).
        let stored: Vec<TensorId> = e.outputs.iter().map(|(id, _)| *id).collect();
        assert_eq!(stored, [6, 11, 12].map(TensorId::new));
        assert_eq!(e.program.small_outputs, 0b011);

        // A small value computed from a full one would be a reduction: the run closes there.
        let mut f = fuse_all(&ops);
        f.fuse(&mul_scalar(t(12, full, RO, f32), 3, t(13, c, NEW, f32)));
        assert_eq!((f.status(), f.len()), (FuserStatus::Closed, 8));

        // Small first, then full (burn-autodiff's backward: 1 / std, then the gradient times
        // it): the earlier values become the small ones.
        ops = vec![
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Recip(UnaryOpIr {
                    input: t(1, c, RO, f32),
                    out: t(2, c, NEW, f32),
                }),
            ),
            binary_op(
                NumericOperationIr::Mul,
                t(3, full, RO, f32),
                t(2, c, RW, f32),
                t(4, full, NEW, f32),
            ),
        ];
        let e = fuse_all(&ops).build();
        e.program.validate().unwrap();
        assert_eq!(e.mixed, Some((TensorId::new(4), TensorId::new(2))));
        assert_eq!(e.program.small_outputs, 0);
        // The reduction fuser's prologue takes it too (its operands have the run's rank), and
        // stores no small value (`1 / std` dies in the run).
        let mut f = ElementwiseFuser::without_flat_runs();
        for op in &ops {
            f.fuse(op);
        }
        assert_eq!((f.status(), f.len()), (FuserStatus::Open, 2));
        assert!(f.stored_small_shape().is_none());
        // A `[C]` input read as the small shape is not: the prologue's inputs are read
        // broadcast against the iteration shape.
        let lower_rank = binary_op(
            NumericOperationIr::Mul,
            t(8, c, RO, f32),
            t(5, &[3], RO, f32),
            t(9, c, NEW, f32),
        );
        assert_eq!(fuse_all(&[ops[1].clone(), lower_rank.clone()]).len(), 2);
        let mut f = ElementwiseFuser::without_flat_runs();
        f.fuse(&ops[1]);
        f.fuse(&lower_rank);
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn casts_round_and_the_state_rebuilds_the_same_program() {
        let ops = vec![
            OperationIr::Float(
                DType::F32,
                FloatOperationIr::Exp(UnaryOpIr {
                    input: t(1, &[8], RO, DType::F32),
                    out: t(2, &[8], NEW, DType::F32),
                }),
            ),
            OperationIr::BaseFloat(BaseOperationIr::Cast(CastOpIr {
                input: t(2, &[8], RW, DType::F32),
                out: t(3, &[8], NEW, DType::BF16),
            })),
        ];
        let e = fuse_all(&ops).build();
        assert_eq!(e.program.ops[1], FusedOp::Round(Value::Reg(0), DataType::BF16));
        assert_eq!(e.program.outputs, vec![(1, DataType::BF16)]);
        let again = ElementwiseFuser::from_operations(&e.operations, None).unwrap();
        assert_eq!(again.program, e.program);
    }
}
