//! CPU side of the custom ops: strided Candle storage to and from float64, for the
//! reference forwards (`cpu_fwd`).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result};
use half::{bf16, f16};

use super::arg_err;

/// Storage offsets of every element of `l`, in row-major logical order.
fn offsets(l: &Layout) -> Vec<usize> {
    let dims = l.dims();
    let strides = l.stride();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut idx = vec![0usize; dims.len()];
    let mut off = l.start_offset();
    for _ in 0..n {
        out.push(off);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < dims[d] {
                break;
            }
            off -= strides[d] * dims[d];
            idx[d] = 0;
        }
    }
    out
}

/// The logical (row-major) values of a strided tensor as float64.
pub(crate) fn read(op: &'static str, arg: &'static str, s: &CpuStorage, l: &Layout) -> Result<Vec<f64>> {
    let o = offsets(l);
    Ok(match s {
        CpuStorage::F32(v) => o.iter().map(|&i| v[i] as f64).collect(),
        CpuStorage::F64(v) => o.iter().map(|&i| v[i]).collect(),
        CpuStorage::F16(v) => o.iter().map(|&i| v[i].to_f64()).collect(),
        CpuStorage::BF16(v) => o.iter().map(|&i| v[i].to_f64()).collect(),
        other => {
            return Err(arg_err(
                op,
                arg,
                format!("dtype {:?} is not supported (f32, f16, bf16, f64)", other.dtype()),
            ))
        }
    })
}

/// The logical (row-major) values of a strided integer tensor (class targets, ids) as int64.
pub(crate) fn read_ints(op: &'static str, arg: &'static str, s: &CpuStorage, l: &Layout) -> Result<Vec<i64>> {
    let o = offsets(l);
    Ok(match s {
        CpuStorage::U8(v) => o.iter().map(|&i| i64::from(v[i])).collect(),
        CpuStorage::U32(v) => o.iter().map(|&i| i64::from(v[i])).collect(),
        CpuStorage::I16(v) => o.iter().map(|&i| i64::from(v[i])).collect(),
        CpuStorage::I32(v) => o.iter().map(|&i| i64::from(v[i])).collect(),
        CpuStorage::I64(v) => o.iter().map(|&i| v[i]).collect(),
        other => {
            return Err(arg_err(
                op,
                arg,
                format!("dtype {:?} is not an integer type", other.dtype()),
            ))
        }
    })
}

/// Row-major float64 values as a storage of `dtype`.
pub(crate) fn write(op: &'static str, v: &[f64], dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(v.iter().map(|&x| x as f32).collect()),
        DType::F64 => CpuStorage::F64(v.to_vec()),
        DType::F16 => CpuStorage::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
        DType::BF16 => CpuStorage::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
        other => return Err(arg_err(op, "dtype", format!("{other:?} is not supported"))),
    })
}

/// Reorders a packed NC(spatial) buffer to N(spatial)C (channels-last), or returns it.
pub(crate) fn to_physical(v: Vec<f64>, dims: &[usize], channels_last: bool) -> Vec<f64> {
    if !channels_last || dims.len() < 3 {
        return v;
    }
    let (n, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    let mut out = vec![0.0; v.len()];
    for b in 0..n {
        for ch in 0..c {
            for p in 0..s {
                out[(b * s + p) * c + ch] = v[(b * c + ch) * s + p];
            }
        }
    }
    out
}

/// usize dims of a slice of i64 dims.
pub(crate) fn udims(d: &[i64]) -> Vec<usize> {
    d.iter().map(|&x| x as usize).collect()
}
