//! The on-disk cache of compiled kernels (and serialized cuDNN plans), so a process skips
//! NVRTC and cuDNN's runtime compilation for every image an earlier process already built.
//! The kernel loader and the plan layer share it: the crate's one on-disk cache.
//!
//! On by default in the user's cache directory (`$XDG_CACHE_HOME/cudnn-backend/kernels`, else
//! `~/.cache/cudnn-backend/kernels`); [`KERNEL_CACHE_ENV`] moves it (a path) or turns it off
//! (`0`, `off`, `false`, `no` or `none`). One file per kernel, named by its [`CacheKey`], which
//! hashes everything the image depends on: the source text (prelude and `common.cuh`
//! included), the kernel name, the compile options, the GPU architecture, the NVRTC and driver
//! versions and the crate version. Like the tuning file (`plan::persist`) the cache
//! never fails loudly: a missing entry is a silent miss, a corrupt, truncated or mismatched
//! one is a miss with a `tracing` warning (the caller compiles and overwrites it), and writes
//! are atomic (temporary file in the same directory, then rename), so concurrent processes
//! never see a partial entry.
//!
//! # Entry format (version 1, little-endian)
//!
//! ```text
//! magic "CDNNBKRN" (8) | format version u32 | image kind u32 (0 CUBIN, 1 PTX, 2 cuDNN plan) | key u128
//! | symbol length u32 | image length u64 | checksum u64 | symbol bytes | image bytes
//! ```
//!
//! The checksum is FNV-1a 64 over every byte of the entry after the checksum field; the file
//! must be exactly as long as its header says.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

pub use crate::config::{resolve_dir, KERNEL_CACHE_ENV};

/// First bytes of every entry.
pub const MAGIC: &[u8; 8] = b"CDNNBKRN";

/// Version of the entry format written by [`DiskCache::store`]; other versions are ignored.
pub const FORMAT_VERSION: u32 = 1;

const HEADER_LEN: usize = 8 + 4 + 4 + 16 + 4 + 8 + 8;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Device code for one architecture, loaded as is.
    Cubin,
    /// PTX, JIT-compiled by the driver at load (the fallback for GPUs newer than NVRTC).
    Ptx,
    /// A serialized cuDNN execution plan (its JSON representation, runtime-compiled kernels
    /// included), stored by the plan layer.
    CudnnPlan,
}

/// Identifies one compiled kernel: a 128-bit FNV-1a hash of [`KeyParts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey(pub u128);

/// Everything a compiled image depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyParts<'a> {
    /// The full translation unit (prelude, `common.cuh`, source), or its hash (see
    /// [`source_hash`]).
    pub source_hash: u128,
    /// The kernel's plain name (`*` for a whole-source unit).
    pub kernel: &'a str,
    /// NVRTC options, in order.
    pub options: &'a [String],
    /// Target architecture, e.g. `sm_90` or `compute_120`.
    pub arch: &'a str,
    /// NVRTC `(major, minor)`.
    pub nvrtc: (i32, i32),
    /// CUDA driver version (`cuDriverGetVersion`).
    pub driver: i32,
    /// Version of this crate.
    pub crate_version: &'a str,
}

/// One cached kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedImage {
    /// CUBIN or PTX.
    pub kind: ImageKind,
    /// The symbol to load (the kernel's lowered name; empty for a whole-source unit).
    pub symbol: String,
    /// The image bytes.
    pub image: Vec<u8>,
}

const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

fn fnv1a128(h: &mut u128, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u128::from(b);
        *h = h.wrapping_mul(FNV128_PRIME);
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The 128-bit FNV-1a hash of a source text (computed once per source and process).
pub fn source_hash(text: &str) -> u128 {
    let mut h = FNV128_OFFSET;
    fnv1a128(&mut h, text.as_bytes());
    h
}

impl CacheKey {
    /// The key of `parts` (every field length-prefixed, so no two part lists collide by
    /// concatenation; the entry format version is hashed too).
    pub fn new(parts: &KeyParts<'_>) -> Self {
        let mut h = FNV128_OFFSET;
        let mut field = |bytes: &[u8]| {
            fnv1a128(&mut h, &(bytes.len() as u64).to_le_bytes());
            fnv1a128(&mut h, bytes);
        };
        field(&FORMAT_VERSION.to_le_bytes());
        field(&parts.source_hash.to_le_bytes());
        field(parts.kernel.as_bytes());
        field(&(parts.options.len() as u64).to_le_bytes());
        for o in parts.options {
            field(o.as_bytes());
        }
        field(parts.arch.as_bytes());
        field(&parts.nvrtc.0.to_le_bytes());
        field(&parts.nvrtc.1.to_le_bytes());
        field(&parts.driver.to_le_bytes());
        field(parts.crate_version.as_bytes());
        CacheKey(h)
    }
}

impl CacheKey {
    /// A key over arbitrary byte fields (each length-prefixed, the entry format version and a
    /// domain label first): for entries that are not kernels, e.g. serialized cuDNN plans.
    pub fn of_fields(domain: &str, fields: &[&[u8]]) -> Self {
        let mut h = FNV128_OFFSET;
        let mut field = |bytes: &[u8]| {
            fnv1a128(&mut h, &(bytes.len() as u64).to_le_bytes());
            fnv1a128(&mut h, bytes);
        };
        field(&FORMAT_VERSION.to_le_bytes());
        field(domain.as_bytes());
        for f in fields {
            field(f);
        }
        CacheKey(h)
    }
}

/// The process's cache directory: [`resolve_dir`] applied to the environment, read once
/// ([`Config::kernel_cache`](crate::config::Config::kernel_cache)).
pub fn dir_from_env() -> Option<PathBuf> {
    crate::config::config().kernel_cache.clone()
}

/// The on-disk cache directory of compiled kernels and serialized plans (created on the
/// first store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The cache the environment selects ([`dir_from_env`]), or `None` when it is off.
    pub fn from_env() -> Option<Self> {
        dir_from_env().map(Self::at)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of the entry for `key`, e.g. `binary_f32-<32 hex digits>.kernel` (`label`, the
    /// kernel name, is only for people listing the directory; characters other than ASCII
    /// letters, digits, `-` and `_` become `_`).
    pub fn path_for(&self, key: CacheKey, label: &str) -> PathBuf {
        let label: String = label
            .chars()
            .take(64)
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{label}-{:032x}.kernel", key.0))
    }

    /// Whether a file for `key` exists (its contents are checked only by [`Self::load`]).
    pub fn contains(&self, key: CacheKey, label: &str) -> bool {
        self.path_for(key, label).is_file()
    }

    /// The entry for `key`, if present and intact. A missing file is a silent `None`; an
    /// unreadable one is `None` with a `tracing` warning; a corrupt, truncated or mismatched
    /// one is `None` with a warning and is removed (its rebuild writes it again), so that
    /// [`Self::contains`] stops reporting it.
    pub fn load(&self, key: CacheKey, label: &str) -> Option<CachedImage> {
        let path = self.path_for(key, label);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), reason = %e, "ignoring unreadable kernel cache entry");
                return None;
            }
        };
        match decode(&bytes, key) {
            Ok(entry) => Some(entry),
            Err(reason) => {
                tracing::warn!(path = %path.display(), reason = %reason, "ignoring kernel cache entry (it will be rebuilt)");
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Writes the entry for `key` atomically: a temporary file in the cache directory (created
    /// if needed) is written and renamed over the entry. On error the temporary file is
    /// removed and any previous entry is left as it was.
    pub fn store(&self, key: CacheKey, label: &str, entry: &CachedImage) -> io::Result<()> {
        let path = self.path_for(key, label);
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(
            ".{}.tmp.{}.{}",
            path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
            std::process::id(),
            crate::engine().temp_file_number()
        ));
        let bytes = encode(key, entry);
        let result = (|| {
            let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            file.write_all(&bytes)?;
            drop(file);
            fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// The bytes of an entry.
pub fn encode(key: CacheKey, entry: &CachedImage) -> Vec<u8> {
    let symbol = entry.symbol.as_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + symbol.len() + entry.image.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let kind: u32 = match entry.kind {
        ImageKind::Cubin => 0,
        ImageKind::Ptx => 1,
        ImageKind::CudnnPlan => 2,
    };
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&key.0.to_le_bytes());
    out.extend_from_slice(&(symbol.len() as u32).to_le_bytes());
    out.extend_from_slice(&(entry.image.len() as u64).to_le_bytes());
    let checksum_at = out.len();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(symbol);
    out.extend_from_slice(&entry.image);
    let checksum = fnv1a64(&out[checksum_at + 8..]);
    out[checksum_at..checksum_at + 8].copy_from_slice(&checksum.to_le_bytes());
    out
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(&bytes[at..at + N]);
    a
}

/// Parses an entry, checking it belongs to `key`; the error says what is wrong.
pub fn decode(bytes: &[u8], key: CacheKey) -> Result<CachedImage, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("truncated ({} bytes, header is {HEADER_LEN})", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("bad magic (not a kernel cache entry)".into());
    }
    let version = u32::from_le_bytes(field(bytes, 8));
    if version != FORMAT_VERSION {
        return Err(format!("format version {version}, want {FORMAT_VERSION}"));
    }
    let kind = match u32::from_le_bytes(field(bytes, 12)) {
        0 => ImageKind::Cubin,
        1 => ImageKind::Ptx,
        2 => ImageKind::CudnnPlan,
        k => return Err(format!("unknown image kind {k}")),
    };
    let file_key = u128::from_le_bytes(field(bytes, 16));
    if file_key != key.0 {
        return Err(format!("key mismatch: entry is {file_key:032x}, want {:032x}", key.0));
    }
    let symbol_len = u32::from_le_bytes(field(bytes, 32)) as u64;
    let image_len = u64::from_le_bytes(field(bytes, 36));
    let checksum = u64::from_le_bytes(field(bytes, 44));
    let want_len = (HEADER_LEN as u64)
        .checked_add(symbol_len)
        .and_then(|n| n.checked_add(image_len));
    if want_len != Some(bytes.len() as u64) {
        return Err(format!(
            "length {} differs from the header's {HEADER_LEN} + {symbol_len} + {image_len} (truncated?)",
            bytes.len()
        ));
    }
    if fnv1a64(&bytes[HEADER_LEN..]) != checksum {
        return Err("checksum mismatch (corrupt)".into());
    }
    if image_len == 0 {
        return Err("empty image".into());
    }
    let symbol_end = HEADER_LEN + symbol_len as usize;
    let symbol = std::str::from_utf8(&bytes[HEADER_LEN..symbol_end])
        .map_err(|_| "symbol is not UTF-8".to_string())?
        .to_string();
    Ok(CachedImage {
        kind,
        symbol,
        image: bytes[symbol_end..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn parts(kernel: &str) -> (u128, String, Vec<String>) {
        (
            source_hash("KERNEL void k() {}"),
            kernel.to_string(),
            vec!["--gpu-architecture=sm_90".into()],
        )
    }

    fn key(kernel: &str) -> CacheKey {
        let (h, k, o) = parts(kernel);
        CacheKey::new(&KeyParts {
            source_hash: h,
            kernel: &k,
            options: &o,
            arch: "sm_90",
            nvrtc: (13, 0),
            driver: 13000,
            crate_version: "0.1.0",
        })
    }

    fn entry() -> CachedImage {
        CachedImage {
            kind: ImageKind::Cubin,
            symbol: "_Z10binary_f32ILi0EEvPKfS1_Pf6LayoutS3_S3_xi".into(),
            image: (0..5000u32).map(|i| (i * 7 % 251) as u8).collect(),
        }
    }

    fn no_temp_files(dir: &Path) {
        let stray: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(stray.is_empty(), "temporary files left behind: {stray:?}");
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path().join("nested/kernels"));
        assert_eq!(
            cache.load(key("binary_f32"), "binary_f32"),
            None,
            "empty cache misses silently"
        );
        cache.store(key("binary_f32"), "binary_f32", &entry()).unwrap();
        assert_eq!(cache.load(key("binary_f32"), "binary_f32"), Some(entry()));
        let ptx = CachedImage {
            kind: ImageKind::Ptx,
            symbol: String::new(),
            image: b".version 9.0\n.target sm_120\n".to_vec(),
        };
        cache.store(key("*"), "elementwise.cu", &ptx).unwrap();
        assert_eq!(cache.load(key("*"), "elementwise.cu"), Some(ptx));
        let name = cache.path_for(key("binary_f32"), "binary_f32");
        let name = name.file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("binary_f32-") && name.ends_with(".kernel"), "{name}");
        assert_eq!(cache.path_for(key("a"), "a/../b c").parent(), Some(cache.dir()));
        no_temp_files(cache.dir());
    }

    #[test]
    fn keys_depend_on_every_part() {
        let (h, k, o) = parts("binary_f32");
        let base = KeyParts {
            source_hash: h,
            kernel: &k,
            options: &o,
            arch: "sm_90",
            nvrtc: (13, 0),
            driver: 13000,
            crate_version: "0.1.0",
        };
        let other_opts = vec!["--gpu-architecture=sm_90".to_string(), "-lineinfo".into()];
        let variants = [
            KeyParts {
                source_hash: source_hash("KERNEL void k() { }"),
                ..base.clone()
            },
            KeyParts {
                kernel: "unary_f32",
                ..base.clone()
            },
            KeyParts {
                options: &other_opts,
                ..base.clone()
            },
            KeyParts {
                arch: "sm_100",
                ..base.clone()
            },
            KeyParts {
                nvrtc: (13, 1),
                ..base.clone()
            },
            KeyParts {
                driver: 13010,
                ..base.clone()
            },
            KeyParts {
                crate_version: "0.2.0",
                ..base.clone()
            },
        ];
        let k0 = CacheKey::new(&base);
        assert_eq!(k0, CacheKey::new(&base.clone()), "deterministic");
        for v in &variants {
            assert_ne!(CacheKey::new(v), k0, "{v:?}");
        }
        // Length prefixes: moving bytes between fields changes the key.
        let (a, b) = (vec!["ab".to_string(), "c".into()], vec!["a".to_string(), "bc".into()]);
        assert_ne!(
            CacheKey::new(&KeyParts {
                options: &a,
                ..base.clone()
            }),
            CacheKey::new(&KeyParts { options: &b, ..base })
        );
    }

    #[test]
    fn corrupt_truncated_and_mismatched_entries_are_ignored_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path());
        let k = key("binary_f32");
        let path = cache.path_for(k, "binary_f32");
        let good = encode(k, &entry());
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40; // one bit of the image
        let mut bad_symbol = good.clone();
        bad_symbol[HEADER_LEN] ^= 1;
        let mut bad_version = good.clone();
        bad_version[8] = 2;
        let mut bad_kind = good.clone();
        bad_kind[12] = 9;
        let mut longer = good.clone();
        longer.push(0);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("header only", good[..HEADER_LEN - 1].to_vec()),
            ("truncated image", good[..good.len() - 10].to_vec()),
            ("trailing byte", longer),
            ("flipped image bit", flipped),
            ("flipped symbol bit", bad_symbol),
            ("other format version", bad_version),
            ("unknown kind", bad_kind),
            (
                "not an entry",
                b"garbage garbage garbage garbage garbage garbage garbage".to_vec(),
            ),
            ("other key", encode(key("unary_f32"), &entry())),
        ];
        for (what, bytes) in cases {
            fs::write(&path, &bytes).unwrap();
            assert_eq!(cache.load(k, "binary_f32"), None, "{what}");
            assert!(!cache.contains(k, "binary_f32"), "{what}: the bad entry was removed");
            assert!(decode(&bytes, k).is_err(), "{what}");
            // Rebuilt: a store replaces the bad entry and loads again.
            cache.store(k, "binary_f32", &entry()).unwrap();
            assert_eq!(cache.load(k, "binary_f32"), Some(entry()), "{what}");
        }
        // An entry copied under another key's file name is a mismatch too.
        let k2 = key("unary_f32");
        fs::copy(&path, cache.path_for(k2, "binary_f32")).unwrap();
        assert_eq!(cache.load(k2, "binary_f32"), None);
        // A directory where the file should be is unreadable: ignored, not a panic.
        let k3 = key("fill_b4");
        fs::create_dir_all(cache.path_for(k3, "fill_b4")).unwrap();
        assert_eq!(cache.load(k3, "fill_b4"), None);
        assert!(cache.store(k3, "fill_b4", &entry()).is_err());
        no_temp_files(cache.dir());
    }

    #[test]
    fn atomic_writes_under_concurrency() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path());
        let k = key("binary_f32");
        let a = entry();
        let b = CachedImage {
            image: vec![0xab; 70_000],
            ..entry()
        };
        // Writers race on one key while readers load it: a reader sees nothing or a whole
        // entry, never a mix or a partial file.
        std::thread::scope(|s| {
            for i in 0..8 {
                let (cache, a, b) = (&cache, &a, &b);
                s.spawn(move || {
                    for _ in 0..20 {
                        cache.store(k, "binary_f32", if i % 2 == 0 { a } else { b }).unwrap();
                    }
                });
            }
            for _ in 0..4 {
                let (cache, a, b) = (&cache, &a, &b);
                s.spawn(move || {
                    for _ in 0..50 {
                        if let Some(e) = cache.load(k, "binary_f32") {
                            assert!(&e == a || &e == b);
                        }
                    }
                });
            }
        });
        let last = cache.load(k, "binary_f32").unwrap();
        assert!(last == a || last == b);
        no_temp_files(cache.dir());
    }

    #[test]
    fn directory_from_the_environment() {
        let os = |s: &str| Some(OsString::from(s));
        for off in ["0", "off", "OFF", "false", "no", "none", " Off "] {
            assert_eq!(resolve_dir(os(off), os("/x"), os("/home/u")), None, "{off}");
        }
        assert_eq!(
            resolve_dir(os("/tmp/kc"), os("/x"), os("/home/u")),
            Some(PathBuf::from("/tmp/kc"))
        );
        let default = Some(PathBuf::from("/x/cudnn-backend/kernels"));
        assert_eq!(resolve_dir(None, os("/x"), os("/home/u")), default);
        assert_eq!(
            resolve_dir(os(""), os("/x"), os("/home/u")),
            default,
            "empty means default"
        );
        let home = Some(PathBuf::from("/home/u/.cache/cudnn-backend/kernels"));
        assert_eq!(resolve_dir(None, None, os("/home/u")), home);
        assert_eq!(
            resolve_dir(None, os("relative"), os("/home/u")),
            home,
            "XDG must be absolute"
        );
        assert_eq!(resolve_dir(None, None, None), None);
    }

    #[test]
    fn disabled_by_the_environment_variable() {
        let cache = |value: &str| {
            crate::config::Config::from_vars(|k| (k == KERNEL_CACHE_ENV).then(|| value.to_string()))
                .kernel_cache
                .map(DiskCache::at)
        };
        assert_eq!(cache("off"), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(cache(dir.path().to_str().unwrap()), Some(DiskCache::at(dir.path())));
    }
}
