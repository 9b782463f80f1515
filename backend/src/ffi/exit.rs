//! Process-exit hooks (the C library's `atexit`).

/// Registers `hook` to run when the process exits normally (`exit`, or `main` returning).
/// Exit handlers run in reverse order of registration, so `hook` runs before those registered
/// earlier, among them the static destructors of the CUDA libraries loaded before this call.
/// False when the C library refused it.
pub(crate) fn at_exit(hook: extern "C" fn()) -> bool {
    extern "C" {
        fn atexit(function: extern "C" fn()) -> std::os::raw::c_int;
    }
    // SAFETY: `hook` is a plain function with no captured state, valid for the whole process;
    // `atexit` only stores the pointer (it takes the C library's own lock).
    unsafe { atexit(hook) == 0 }
}
