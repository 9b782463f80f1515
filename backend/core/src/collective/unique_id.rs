//! An NCCL unique id: its bytes, made by NCCL, written as hex for an environment variable or
//! a file on a shared filesystem, and read back (how rank 0 hands it to the other ranks).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::config;
use crate::error::{Error, Result};
use crate::ffi::nccl;

/// An NCCL unique id: made once by rank 0 ([`UniqueId::new`]) and given to every rank of
/// the communicator. It holds rank 0's bootstrap address; treat it as a secret of the job.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub(crate) [u8; nccl::UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// A new id from NCCL (`ncclGetUniqueId`); needs the NCCL library, not a GPU.
    pub fn new() -> Result<Self> {
        nccl::unique_id().map(Self)
    }

    /// The id as 256 lowercase hex digits (for an environment variable or a file).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`to_hex`](Self::to_hex)'s text (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self> {
        let text = text.trim();
        let bad = |reason: String| Error::Collective {
            op: "reading an NCCL unique id",
            reason,
        };
        if text.len() != 2 * nccl::UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "expected {} hex digits, got {} characters",
                2 * nccl::UNIQUE_ID_BYTES,
                text.len()
            )));
        }
        let mut id = [0u8; nccl::UNIQUE_ID_BYTES];
        for (i, byte) in id.iter_mut().enumerate() {
            let pair = text.get(2 * i..2 * i + 2).unwrap_or("");
            *byte = u8::from_str_radix(pair, 16)
                .map_err(|_| bad(format!("{pair:?} at character {} is not a hex byte", 2 * i)))?;
        }
        Ok(Self(id))
    }

    /// The id in [`NCCL_ID_ENV`](crate::config::NCCL_ID_ENV), if that variable is set ([`Config::nccl_id`](crate::config::Config::nccl_id)).
    pub fn from_env() -> Result<Option<Self>> {
        config().nccl_id.as_deref().map(Self::from_hex).transpose()
    }

    /// Writes the id to `path` atomically (a temporary file in the same folder, then a
    /// rename), so a rank polling the path never reads half an id.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        let io = |what: &str, e: std::io::Error| Error::Collective {
            op: "writing the NCCL unique id file",
            reason: format!("{what} {}: {e}", path.display()),
        };
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, self.to_hex()).map_err(|e| io("writing", e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("renaming into", e)
        })
    }

    /// Waits up to `timeout` for `path` to hold an id (written by rank 0 with
    /// [`write_file`](Self::write_file)) and reads it.
    pub fn read_file(path: &Path, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        loop {
            match std::fs::read_to_string(path) {
                Ok(text) => return Self::from_hex(&text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::Collective {
                        op: "reading the NCCL unique id file",
                        reason: format!(
                            "{}: {e} (after waiting {:.0} s; rank 0 writes it, so check that rank 0 started and \
                             that every rank sees the same path)",
                            path.display(),
                            timeout.as_secs_f64()
                        ),
                    })
                }
            }
        }
    }
}
