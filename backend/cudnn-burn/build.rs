//! The link step of scripts/burn-0.22-offline.sh for this crate's tests and examples.
//! cubecl-cuda always compiles its LLVM backend, so they reference about 230 LLVM C API
//! symbols that no library provides when the LLVM download is skipped (`DOCS_RS=1`). The
//! link arguments apply to this package's own executables only; a program depending on this
//! crate links as Burn documents (or with its own copy of this step):
//!
//! - `BURN_022_LINK_DISCOVER=1`: link with unresolved symbols ignored (the script lists them);
//! - `BURN_022_LLVM_STUBS=FILE`: link FILE, the script's object of abort stubs for them;
//! - neither: a normal build against a real LLVM (Burn's documented setup).

fn main() {
    println!("cargo:rerun-if-env-changed=BURN_022_LINK_DISCOVER");
    println!("cargo:rerun-if-env-changed=BURN_022_LLVM_STUBS");
    if std::env::var_os("BURN_022_LINK_DISCOVER").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--unresolved-symbols=ignore-all");
    } else if let Some(stubs) = std::env::var_os("BURN_022_LLVM_STUBS") {
        println!("cargo:rerun-if-changed={}", std::path::Path::new(&stubs).display());
        println!("cargo:rustc-link-arg={}", std::path::Path::new(&stubs).display());
    }
}
