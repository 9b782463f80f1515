//! Persistent tuning file: engine choices saved across processes.
//!
//! A file belongs to one [`TuningKey`] (GPU model, compute capability, cuDNN version, crate
//! version). Loading never fails loudly: a missing file is silently empty, and a corrupt,
//! truncated or mismatched file is ignored with a `tracing` warning. Saving is atomic (temporary
//! file in the same directory, fsync, rename).
//!
//! # Format (version 1)
//!
//! UTF-8 text, one record per line, fields separated by a tab:
//!
//! ```text
//! cudnn-backend-tuning<TAB>1
//! key<TAB><gpu name><TAB><major>.<minor><TAB><cudnn version><TAB><crate version>
//! e<TAB><signature hex><TAB><engine id><TAB><knobs><TAB><workspace bytes><TAB><ms>
//! ...
//! end<TAB><entry count><TAB><checksum>
//! ```
//!
//! * Strings escape `\` as `\\`, tab as `\t`, newline as `\n`, carriage return as `\r`.
//! * `<knobs>` is `type=value` pairs joined by `,`, or `-` when empty; `<ms>` is `-` when absent.
//! * `<checksum>` is the FNV-1a 64-bit hash (16 lowercase hex digits) of every byte before the
//!   `end` line. The `end` line must be the last line, so truncation is detected.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use super::cache::{EngineChoice, Signature};

pub use crate::config::TUNING_DIR_ENV;

/// First token of a tuning file.
pub const MAGIC: &str = "cudnn-backend-tuning";

/// Version of the file format written by [`TuningFile::save`]; other versions are ignored.
pub const FORMAT_VERSION: u32 = 1;

/// Identifies what a tuning file is valid for; a file saved under another key is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TuningKey {
    /// GPU model name as reported by the driver (e.g. `NVIDIA H200`).
    pub gpu_name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// cuDNN version number (e.g. `91400`).
    pub cudnn_version: u64,
    /// Version of this crate that wrote the file.
    pub crate_version: String,
}

/// Reads and writes tuning files (a namespace for the associated functions).
#[derive(Debug, Clone, Copy, Default)]
pub struct TuningFile;

/// The directory named by [`TUNING_DIR_ENV`], if that variable is set and not empty
/// ([`Config::tuning_dir`](crate::config::Config::tuning_dir)).
pub fn dir_from_env() -> Option<PathBuf> {
    crate::config::config().tuning_dir.clone()
}

impl TuningFile {
    /// The file for `key` in `dir`, e.g. `tuning-NVIDIA_H200-sm90-cudnn91400.txt` (GPU name with
    /// every character other than ASCII letters, digits, `-` and `.` replaced by `_`). The crate
    /// version is not part of the name: a file from another crate version is ignored on load and
    /// replaced on save.
    pub fn path_for(dir: &Path, key: &TuningKey) -> PathBuf {
        let name: String = key
            .gpu_name
            .trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let name = if name.is_empty() { "unknown".into() } else { name };
        let (major, minor) = key.compute_capability;
        dir.join(format!("tuning-{name}-sm{major}{minor}-cudnn{}.txt", key.cudnn_version))
    }

    /// Loads the entries of the file at `path` saved under `key`, in file order.
    ///
    /// A missing file gives an empty list silently. An unreadable, corrupt, truncated or
    /// mismatched file (other key or format version) gives an empty list and a `tracing` warning
    /// naming the path and the reason. Never panics.
    pub fn load(path: &Path, key: &TuningKey) -> Vec<(Signature, EngineChoice)> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), reason = %e, "ignoring unreadable tuning file");
                return Vec::new();
            }
        };
        match parse(&bytes, key) {
            Ok(entries) => entries,
            Err(reason) => {
                tracing::warn!(path = %path.display(), reason = %reason, "ignoring tuning file");
                Vec::new()
            }
        }
    }

    /// Writes `entries` under `key` to `path` atomically: a temporary file in the same directory
    /// is written, fsynced and renamed over `path` (the directory is created if needed). On error
    /// the temporary file is removed and `path` is left as it was.
    pub fn save(path: &Path, key: &TuningKey, entries: &[(Signature, EngineChoice)]) -> io::Result<()> {
        let text = render(key, entries);
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir)?;
        let file_name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "tuning path has no file name"))?;
        let tmp = dir.join(format!(
            ".{}.tmp.{}.{}",
            file_name.to_string_lossy(),
            std::process::id(),
            crate::engine().temp_file_number()
        ));
        let result = (|| {
            let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            return result;
        }
        // Make the rename durable (best effort; not supported everywhere).
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            other => return Err(format!("bad escape sequence \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn render(key: &TuningKey, entries: &[(Signature, EngineChoice)]) -> String {
    let mut s = String::new();
    let (major, minor) = key.compute_capability;
    let _ = writeln!(s, "{MAGIC}\t{FORMAT_VERSION}");
    let _ = writeln!(
        s,
        "key\t{}\t{major}.{minor}\t{}\t{}",
        escape(&key.gpu_name),
        key.cudnn_version,
        escape(&key.crate_version)
    );
    for (sig, choice) in entries {
        s.push_str("e\t");
        for b in sig.as_bytes() {
            let _ = write!(s, "{b:02x}");
        }
        let _ = write!(s, "\t{}\t", choice.engine_id);
        if choice.knobs.is_empty() {
            s.push('-');
        } else {
            for (i, (t, v)) in choice.knobs.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(s, "{t}={v}");
            }
        }
        let _ = write!(s, "\t{}\t", choice.workspace_bytes);
        match choice.measured_ms {
            Some(ms) => {
                let _ = write!(s, "{ms}");
            }
            None => s.push('-'),
        }
        s.push('\n');
    }
    let checksum = fnv1a(s.as_bytes());
    let _ = writeln!(s, "end\t{}\t{checksum:016x}", entries.len());
    s
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() & 1 != 0 {
        return Err("odd-length signature hex".into());
    }
    let digit = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err("bad hex digit in signature".into()),
        }
    };
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn num<T: std::str::FromStr>(s: &str, what: &str, line: usize) -> Result<T, String> {
    s.parse().map_err(|_| format!("line {line}: bad {what} {s:?}"))
}

fn parse_entry(fields: &[&str], line: usize) -> Result<(Signature, EngineChoice), String> {
    let [sig, engine, knobs, ws, ms] = fields else {
        return Err(format!("line {line}: entry has {} fields, want 5", fields.len()));
    };
    let sig = parse_hex(sig).map_err(|e| format!("line {line}: {e}"))?;
    let knobs = if *knobs == "-" {
        Vec::new()
    } else {
        knobs
            .split(',')
            .map(|kv| {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("line {line}: bad knob {kv:?}"))?;
                Ok((num(k, "knob type", line)?, num(v, "knob value", line)?))
            })
            .collect::<Result<Vec<_>, String>>()?
    };
    let measured_ms = if *ms == "-" {
        None
    } else {
        Some(num::<f32>(ms, "time", line)?)
    };
    Ok((
        Signature::new(sig),
        EngineChoice {
            engine_id: num(engine, "engine id", line)?,
            knobs,
            workspace_bytes: num(ws, "workspace size", line)?,
            measured_ms,
        },
    ))
}

fn parse(bytes: &[u8], key: &TuningKey) -> Result<Vec<(Signature, EngineChoice)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    if !text.ends_with('\n') {
        return Err("truncated (no final newline)".into());
    }
    let body = &text[..text.len() - 1];
    let (before_end, end_line) = match body.rfind('\n') {
        Some(i) => (&text[..=i], &body[i + 1..]),
        None => return Err("truncated (fewer than 3 lines)".into()),
    };
    let end: Vec<&str> = end_line.split('\t').collect();
    let ["end", count, checksum] = end[..] else {
        return Err("truncated (missing end line)".into());
    };
    let count: usize = num(count, "entry count", 0)?;
    let checksum = u64::from_str_radix(checksum, 16).map_err(|_| "bad checksum field".to_string())?;
    if fnv1a(before_end.as_bytes()) != checksum {
        return Err("checksum mismatch (corrupt or truncated)".into());
    }

    let mut lines = before_end.lines().enumerate().map(|(i, l)| (i + 1, l));
    let Some((_, header)) = lines.next() else {
        return Err("empty file".into());
    };
    let header: Vec<&str> = header.split('\t').collect();
    match header[..] {
        [MAGIC, v] if v == FORMAT_VERSION.to_string() => {}
        [MAGIC, v] => return Err(format!("format version {v}, want {FORMAT_VERSION}")),
        _ => return Err("bad magic (not a tuning file)".into()),
    }
    let Some((_, key_line)) = lines.next() else {
        return Err("missing key line".into());
    };
    let k: Vec<&str> = key_line.split('\t').collect();
    let ["key", gpu, cc, cudnn, crate_version] = k[..] else {
        return Err("bad key line".into());
    };
    let (major, minor) = cc.split_once('.').ok_or("bad compute capability")?;
    let file_key = TuningKey {
        gpu_name: unescape(gpu)?,
        compute_capability: (num(major, "cc major", 2)?, num(minor, "cc minor", 2)?),
        cudnn_version: num(cudnn, "cuDNN version", 2)?,
        crate_version: unescape(crate_version)?,
    };
    if &file_key != key {
        return Err(format!("key mismatch: file is for {file_key:?}, want {key:?}"));
    }

    let mut entries = Vec::with_capacity(count.min(1 << 20));
    for (n, line) in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.split_first() {
            Some((&"e", rest)) => entries.push(parse_entry(rest, n)?),
            _ => return Err(format!("line {n}: unknown record")),
        }
    }
    if entries.len() != count {
        return Err(format!("{} entries, end line says {count}", entries.len()));
    }
    Ok(entries)
}
