//! Element types: [`DataType`] and the Rust types that map to it ([`DeviceElement`]).

use half::{bf16, f16};

/// Element data types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE f64.
    F64,
    /// i32.
    I32,
    /// i64.
    I64,
    /// u8.
    U8,
    /// i8 (cuDNN's max-pool index type).
    I8,
    /// bool (one byte).
    Bool,
}

impl DataType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 => 8,
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::U8 | DataType::I8 | DataType::Bool => 1,
        }
    }

    /// True for f32, f16, bf16 and f64.
    pub fn is_float(self) -> bool {
        matches!(self, DataType::F32 | DataType::F16 | DataType::BF16 | DataType::F64)
    }

    /// The `cudnnDataType_t` value.
    pub(crate) fn cudnn(self) -> u32 {
        match self {
            DataType::F32 => 0,
            DataType::F64 => 1,
            DataType::F16 => 2,
            DataType::I8 => 3,
            DataType::I32 => 4,
            DataType::U8 => 6,
            DataType::BF16 => 9,
            DataType::I64 => 10,
            DataType::Bool => 11,
        }
    }

    /// A one-byte code of the type (its `cudnnDataType_t` value).
    pub fn code(self) -> u8 {
        self.cudnn() as u8
    }
}

/// A Rust element type with a [`DataType`]: what typed device memory (a cudarc
/// `CudaSlice<T>`) holds, so a view of it knows its dtype. Implemented for `f32`, `f64`,
/// `half::f16`, `half::bf16`, `i64`, `i32`, `i8`, `u8` and `bool`; sealed.
pub trait DeviceElement: cudarc::driver::DeviceRepr + sealed::Sealed {
    /// The dtype of one element.
    const DTYPE: DataType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! device_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceElement for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

device_element!(
    f32 => F32,
    f64 => F64,
    f16 => F16,
    bf16 => BF16,
    i64 => I64,
    i32 => I32,
    i8 => I8,
    u8 => U8,
    bool => Bool,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_match_their_dtype_sizes() {
        fn size_of<T: DeviceElement>() -> (usize, usize) {
            (std::mem::size_of::<T>(), T::DTYPE.size())
        }
        for (rust, dtype) in [
            size_of::<f32>(),
            size_of::<f64>(),
            size_of::<f16>(),
            size_of::<bf16>(),
            size_of::<i64>(),
            size_of::<i32>(),
            size_of::<i8>(),
            size_of::<u8>(),
            size_of::<bool>(),
        ] {
            assert_eq!(rust, dtype);
        }
    }
}
