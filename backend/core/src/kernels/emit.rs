//! A small typed emitter for the generated (fused) kernels: expressions and the `const`
//! definitions that hold them, built as values and printed as CUDA C++.
//!
//! A fused pattern describes what it computes with [`Expr`] and [`Let`]; only this module
//! spells CUDA syntax (parentheses, literals, the math functions of
//! `kernels/elementwise_math.cuh`, the half-precision conversions). The kernel skeletons
//! around them (thread loops, vector loads, reductions) are fixed templates of their family.

use std::fmt;

use crate::graph::DataType;

/// A scalar expression of a generated kernel.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expr {
    /// A named value: a register, a loaded input, a launch argument (`r3`, `x0`, `a.s[1]`).
    Var(String),
    /// An `int` literal (an operation code of the math functions).
    Int(i32),
    /// A `float` literal, spelled as given (`0.0f`, `1.0f`).
    Float(&'static str),
    /// A call of a device function.
    Call(&'static str, Vec<Expr>),
    /// `(a OP b)` for a C++ binary operator (`>`, `==`, `&&`, `!=`, ...).
    Infix(&'static str, Box<Expr>, Box<Expr>),
    /// `(c ? a : b)`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `(!a)`.
    Not(Box<Expr>),
    /// `(T)(a)`: a C++ cast.
    Cast(&'static str, Box<Expr>),
}

impl Expr {
    /// A named value.
    pub(crate) fn var(name: impl Into<String>) -> Self {
        Expr::Var(name.into())
    }

    /// `(self OP other)`.
    pub(crate) fn infix(self, op: &'static str, other: Expr) -> Self {
        Expr::Infix(op, Box::new(self), Box::new(other))
    }

    /// `(cond ? self : other)`.
    pub(crate) fn select(cond: Expr, a: Expr, b: Expr) -> Self {
        Expr::Select(Box::new(cond), Box::new(a), Box::new(b))
    }

    /// The f32 value of a storage element of dtype `d` (a bool for the bool dtype).
    pub(crate) fn load(raw: Expr, d: DataType) -> Self {
        match d {
            DataType::F32 => raw,
            DataType::F16 => Expr::Call("f16_to_f32", vec![raw]),
            DataType::BF16 => Expr::Call("bf16_to_f32", vec![raw]),
            _ => raw.infix("!=", Expr::Int(0)),
        }
    }

    /// The storage element of dtype `d` for an f32 (or bool) value.
    pub(crate) fn store(value: Expr, d: DataType) -> Self {
        match d {
            DataType::F32 => value,
            DataType::F16 => Expr::Call("f32_to_f16", vec![value]),
            DataType::BF16 => Expr::Call("f32_to_bf16", vec![value]),
            _ => Expr::Cast("u8", Box::new(Expr::select(value, Expr::Int(1), Expr::Int(0)))),
        }
    }

    /// `value` rounded to the precision of dtype `d` and back to f32 (f32: unchanged).
    pub(crate) fn round(value: Expr, d: DataType) -> Self {
        match d {
            DataType::F16 => Expr::Call("f16_to_f32", vec![Expr::Call("f32_to_f16", vec![value])]),
            DataType::BF16 => Expr::Call("bf16_to_f32", vec![Expr::Call("f32_to_bf16", vec![value])]),
            _ => value,
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Var(name) => f.write_str(name),
            Expr::Int(v) => write!(f, "{v}"),
            Expr::Float(v) => f.write_str(v),
            Expr::Call(name, args) => {
                write!(f, "{name}(")?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
            Expr::Infix(op, a, b) => write!(f, "({a} {op} {b})"),
            Expr::Select(c, a, b) => write!(f, "({c} ? {a} : {b})"),
            Expr::Not(a) => write!(f, "(!{a})"),
            Expr::Cast(ty, a) => write!(f, "({ty}){a}"),
        }
    }
}

/// The C++ type of a [`Let`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    /// `float`.
    Float,
    /// `bool`.
    Bool,
}

/// `const T name = value;`: one value of a generated kernel.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Let {
    /// The value's type.
    pub ty: Ty,
    /// Its name.
    pub name: String,
    /// What it holds.
    pub value: Expr,
}

impl fmt::Display for Let {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match self.ty {
            Ty::Float => "float",
            Ty::Bool => "bool",
        };
        write!(f, "const {ty} {} = {};", self.name, self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_print_as_cuda() {
        let x = Expr::var("x0");
        assert_eq!(
            Expr::Call("unary_math_f32", vec![Expr::Int(3), x.clone(), Expr::Float("0.0f")]).to_string(),
            "unary_math_f32(3, x0, 0.0f)"
        );
        assert_eq!(x.clone().infix("&&", Expr::var("r1")).to_string(), "(x0 && r1)");
        assert_eq!(
            Expr::select(Expr::var("c"), x.clone(), Expr::Float("1.0f")).to_string(),
            "(c ? x0 : 1.0f)"
        );
        assert_eq!(Expr::Not(Box::new(x.clone())).to_string(), "(!x0)");
        assert_eq!(Expr::load(Expr::var("v[0]"), DataType::Bool).to_string(), "(v[0] != 0)");
        assert_eq!(Expr::store(x.clone(), DataType::Bool).to_string(), "(u8)(x0 ? 1 : 0)");
        assert_eq!(
            Expr::round(x.clone(), DataType::BF16).to_string(),
            "bf16_to_f32(f32_to_bf16(x0))"
        );
        let l = Let {
            ty: Ty::Bool,
            name: "r2".into(),
            value: x.infix(">", Expr::var("a.s[0]")),
        };
        assert_eq!(l.to_string(), "const bool r2 = (x0 > a.s[0]);");
    }
}
