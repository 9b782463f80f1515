//! RAII wrapper over `cudnnBackendDescriptor_t` with typed attribute setters and getters.

use std::ffi::c_void;

use super::api::{api, CudnnApi};
use super::cudnn_sys::{
    cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty, cudnnBackendDescriptorType_t as Kind,
};
use crate::error::Result;

/// An owned cuDNN backend descriptor, destroyed on drop.
pub(crate) struct Descriptor {
    raw: *mut c_void,
    kind: Kind,
    api: &'static CudnnApi,
}

// SAFETY: a backend descriptor is a host-side object; cuDNN allows using it from any thread
// as long as it is not used concurrently, which `&mut`/ownership rules guarantee here.
unsafe impl Send for Descriptor {}
// SAFETY: shared references only read the raw pointer or pass it to cuDNN calls that take
// the descriptor as a const input (execute, get attribute on a finalized descriptor).
unsafe impl Sync for Descriptor {}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by cudnnBackendCreateDescriptor and is destroyed once.
        let _ = unsafe { (self.api.backend_destroy)(self.raw) };
    }
}

impl std::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Descriptor({:?})", self.kind)
    }
}

impl Descriptor {
    /// Creates an empty descriptor of `kind`.
    pub(crate) fn new(kind: Kind) -> Result<Self> {
        let api = api()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `kind` is a valid descriptor type value.
        let status = unsafe { (api.backend_create)(kind as u32, &mut raw) };
        api.check(status, "cudnnBackendCreateDescriptor")
            .map_err(|e| e.with_context(format!("{kind:?}")))?;
        Ok(Self { raw, kind, api })
    }

    fn set_raw(&mut self, name: Attr, ty: Ty, count: usize, ptr: *const c_void) -> Result<()> {
        // SAFETY: `ptr` points to `count` elements of the C type that `ty` names (each
        // typed wrapper below guarantees it) and stays valid for the call; cuDNN copies them.
        let status = unsafe { (self.api.backend_set)(self.raw, name as u32, ty as u32, count as i64, ptr) };
        self.api
            .check(status, "cudnnBackendSetAttribute")
            .map_err(|e| e.with_context(format!("{:?}.{name:?}", self.kind)))
    }

    /// Sets an `INT64` array attribute.
    pub(crate) fn set_i64s(&mut self, name: Attr, v: &[i64]) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_INT64, v.len(), v.as_ptr().cast())
    }

    /// Sets a scalar `INT64` attribute.
    pub(crate) fn set_i64(&mut self, name: Attr, v: i64) -> Result<()> {
        self.set_i64s(name, &[v])
    }

    /// Sets a scalar `INT32` attribute.
    pub(crate) fn set_i32(&mut self, name: Attr, v: i32) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_INT32, 1, (&v as *const i32).cast())
    }

    /// Sets a scalar `DOUBLE` attribute.
    pub(crate) fn set_f64(&mut self, name: Attr, v: f64) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_DOUBLE, 1, (&v as *const f64).cast())
    }

    /// Sets a scalar `FLOAT` attribute.
    pub(crate) fn set_f32(&mut self, name: Attr, v: f32) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_FLOAT, 1, (&v as *const f32).cast())
    }

    /// Sets a `BOOLEAN` attribute (C `bool`).
    pub(crate) fn set_bool(&mut self, name: Attr, v: bool) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_BOOLEAN, 1, (&v as *const bool).cast())
    }

    /// Sets an enum-valued attribute (`ty` names the enum; `value` is its numeric value).
    pub(crate) fn set_enum(&mut self, name: Attr, ty: Ty, value: u32) -> Result<()> {
        self.set_raw(name, ty, 1, (&value as *const u32).cast())
    }

    /// Sets a `FRACTION` array attribute from whole numbers (denominator 1).
    pub(crate) fn set_fractions(&mut self, name: Attr, v: &[i64]) -> Result<()> {
        let fr: Vec<[i64; 2]> = v.iter().map(|&n| [n, 1]).collect();
        self.set_raw(name, Ty::CUDNN_TYPE_FRACTION, fr.len(), fr.as_ptr().cast())
    }

    /// Sets a `BACKEND_DESCRIPTOR` attribute to one descriptor.
    pub(crate) fn set_desc(&mut self, name: Attr, d: &Descriptor) -> Result<()> {
        self.set_descs(name, &[d])
    }

    /// Sets a `BACKEND_DESCRIPTOR` array attribute.
    pub(crate) fn set_descs(&mut self, name: Attr, ds: &[&Descriptor]) -> Result<()> {
        let raws: Vec<*mut c_void> = ds.iter().map(|d| d.raw).collect();
        self.set_raw(
            name,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            raws.len(),
            raws.as_ptr().cast(),
        )
    }

    /// Sets a `HANDLE` attribute.
    pub(crate) fn set_handle(&mut self, name: Attr, handle: *mut c_void) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_HANDLE, 1, (&handle as *const *mut c_void).cast())
    }

    /// Sets a `VOID_PTR` array attribute (device or host pointers cuDNN reads at execution).
    pub(crate) fn set_void_ptrs(&mut self, name: Attr, ptrs: &[*mut c_void]) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_VOID_PTR, ptrs.len(), ptrs.as_ptr().cast())
    }

    /// Finalizes the descriptor.
    pub(crate) fn finalize(&mut self) -> Result<()> {
        // SAFETY: `raw` is a live descriptor owned by `self`.
        let status = unsafe { (self.api.backend_finalize)(self.raw) };
        self.api
            .check(status, "cudnnBackendFinalize")
            .map_err(|e| e.with_context(format!("{:?}", self.kind)))
    }

    /// Sets a `CHAR` array attribute (e.g. a plan's JSON representation).
    pub(crate) fn set_chars(&mut self, name: Attr, v: &[u8]) -> Result<()> {
        self.set_raw(name, Ty::CUDNN_TYPE_CHAR, v.len(), v.as_ptr().cast())
    }

    /// Reads a whole `CHAR` array attribute (its length queried first).
    pub(crate) fn get_chars(&self, name: Attr) -> Result<Vec<u8>> {
        let n = self.count(name, Ty::CUDNN_TYPE_CHAR)?;
        let mut out = vec![0u8; n.max(1)];
        let got = self.get_raw(name, Ty::CUDNN_TYPE_CHAR, out.len(), out.as_mut_ptr().cast())?;
        out.truncate(got.min(n));
        Ok(out)
    }

    /// Number of elements an array attribute holds.
    pub(crate) fn count(&self, name: Attr, ty: Ty) -> Result<usize> {
        let mut n = 0i64;
        // SAFETY: a zero-length request only writes the element count to `n`.
        let status =
            unsafe { (self.api.backend_get)(self.raw, name as u32, ty as u32, 0, &mut n, std::ptr::null_mut()) };
        self.api
            .check(status, "cudnnBackendGetAttribute")
            .map_err(|e| e.with_context(format!("{:?}.{name:?} (count)", self.kind)))?;
        Ok(n.max(0) as usize)
    }

    /// Reads up to `max` `INT64` values.
    pub(crate) fn get_i64s(&self, name: Attr, max: usize) -> Result<Vec<i64>> {
        let mut out = vec![0i64; max.max(1)];
        let n = self.get_raw(name, Ty::CUDNN_TYPE_INT64, out.len(), out.as_mut_ptr().cast())?;
        out.truncate(n.min(max));
        Ok(out)
    }

    /// Reads a scalar `INT64`.
    pub(crate) fn get_i64(&self, name: Attr) -> Result<i64> {
        Ok(self.get_i64s(name, 1)?.first().copied().unwrap_or(0))
    }

    /// Reads up to `max` values of an enum-typed array attribute as raw numbers.
    pub(crate) fn get_enums(&self, name: Attr, ty: Ty, max: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; max.max(1)];
        let n = self.get_raw(name, ty, out.len(), out.as_mut_ptr().cast())?;
        out.truncate(n.min(max));
        Ok(out)
    }

    /// Reads up to `max` descriptors of `kind` (cuDNN fills descriptors we create).
    pub(crate) fn get_descs(&self, name: Attr, kind: Kind, max: usize) -> Result<Vec<Descriptor>> {
        let mut descs = (0..max).map(|_| Descriptor::new(kind)).collect::<Result<Vec<_>>>()?;
        if max == 0 {
            return Ok(descs);
        }
        let mut raws: Vec<*mut c_void> = descs.iter().map(|d| d.raw).collect();
        let n = self.get_raw(
            name,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            raws.len(),
            raws.as_mut_ptr().cast(),
        )?;
        descs.truncate(n.min(max));
        Ok(descs)
    }

    fn get_raw(&self, name: Attr, ty: Ty, cap: usize, out: *mut c_void) -> Result<usize> {
        let mut n = 0i64;
        // SAFETY: `out` has room for `cap` elements of the C type `ty` names (callers size it).
        let status = unsafe { (self.api.backend_get)(self.raw, name as u32, ty as u32, cap as i64, &mut n, out) };
        self.api
            .check(status, "cudnnBackendGetAttribute")
            .map_err(|e| e.with_context(format!("{:?}.{name:?}", self.kind)))?;
        Ok(n.max(0) as usize)
    }

    /// Runs `plan` (self) with `variant_pack` on `handle`.
    pub(crate) fn execute(&self, handle: &super::CudnnHandle, variant_pack: &Descriptor) -> Result<()> {
        // SAFETY: both descriptors are finalized and alive; the handle is live and owned by the
        // calling thread for the duration of the call (pool contract). The variant pack's
        // pointers are device buffers the caller vouched for.
        let status = unsafe { (self.api.backend_execute)(handle.raw(), self.raw, variant_pack.raw) };
        self.api.check(status, "cudnnBackendExecute")
    }
}
