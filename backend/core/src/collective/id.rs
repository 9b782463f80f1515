//! How the ranks of a communicator agree on its NCCL unique id and on who they are: the id
//! made by rank 0 and handed to the others as hex text through an environment variable or a
//! file on a shared filesystem, or over TCP from rank 0's host (`MASTER_ADDR` and
//! `MASTER_PORT`, as `torchrun` sets them; see [`Rendezvous`]), and the rank and world size
//! read from the variables such launchers set.

use std::time::Duration;

use super::rendezvous::{Rendezvous, MASTER_ADDR_ENV, MASTER_PORT_ENV};
use super::unique_id::UniqueId;
use crate::config::{config, Config, LOCAL_RANK_ENV, RANK_ENV, WORLD_SIZE_ENV};
use crate::error::{Error, Result};

pub use crate::config::{NCCL_ID_ENV, NCCL_ID_FILE_ENV};

/// Where a process stands in a multi-process job: read from `RANK`, `WORLD_SIZE` and
/// `LOCAL_RANK` (the variables `torchrun`, `mpirun` wrappers and Slurm scripts commonly set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// This process's rank on its node: the GPU ordinal it usually takes (`rank` when
    /// `LOCAL_RANK` is unset).
    pub local_rank: usize,
}

impl Bootstrap {
    /// Reads the job's variables through `var` (`None`: unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |name: &'static str| -> Result<Option<usize>> {
            match var(name) {
                None => Ok(None),
                Some(text) => text.trim().parse().map(Some).map_err(|_| Error::Collective {
                    op: "reading the job's rank",
                    reason: format!("{name}={text:?} is not a non-negative integer"),
                }),
            }
        };
        let missing = |name: &str| Error::Collective {
            op: "reading the job's rank",
            reason: format!("{name} is not set; launch one process per GPU with RANK and WORLD_SIZE set"),
        };
        let rank = number("RANK")?.ok_or_else(|| missing("RANK"))?;
        let world_size = number("WORLD_SIZE")?.ok_or_else(|| missing("WORLD_SIZE"))?;
        if rank >= world_size {
            return Err(Error::Collective {
                op: "reading the job's rank",
                reason: format!("RANK={rank} is not below WORLD_SIZE={world_size}"),
            });
        }
        let local_rank = number("LOCAL_RANK")?.unwrap_or(rank);
        Ok(Self {
            rank,
            world_size,
            local_rank,
        })
    }

    /// [`from_vars`](Self::from_vars) on the variables of `config` ([`Config::rank`],
    /// [`Config::world_size`], [`Config::local_rank`]).
    pub fn from_config(config: &Config) -> Result<Self> {
        Self::from_vars(|k| match k {
            RANK_ENV => config.rank.clone(),
            WORLD_SIZE_ENV => config.world_size.clone(),
            LOCAL_RANK_ENV => config.local_rank.clone(),
            _ => None,
        })
    }

    /// [`from_config`](Self::from_config) on the process's configuration (the environment,
    /// read once).
    pub fn from_env() -> Result<Self> {
        Self::from_config(config())
    }

    /// The job's unique id, [`unique_id_with`](Self::unique_id_with) the process's
    /// configuration (the environment, read once).
    pub fn unique_id(&self, timeout: Duration) -> Result<UniqueId> {
        self.unique_id_with(config(), timeout)
    }

    /// The job's unique id, found through the first of these that `config` sets:
    /// 1. [`NCCL_ID_ENV`]: the id itself;
    /// 2. [`NCCL_ID_FILE_ENV`]: a file that rank 0 creates and the others wait for up to
    ///    `timeout` (use a fresh path per job: a file left by an earlier job would be read as
    ///    this one's);
    /// 3. [`MASTER_ADDR_ENV`] and [`MASTER_PORT_ENV`]: rank 0 makes the id and serves it over
    ///    TCP until every other rank has it; the others connect to it, trying again until
    ///    `timeout` (see [`Rendezvous`]).
    pub fn unique_id_with(&self, config: &Config, timeout: Duration) -> Result<UniqueId> {
        if let Some(text) = &config.nccl_id {
            return UniqueId::from_hex(text);
        }
        if let Some(path) = &config.nccl_id_file {
            return if self.rank == 0 {
                let id = UniqueId::new()?;
                id.write_file(path)?;
                Ok(id)
            } else {
                UniqueId::read_file(path, timeout)
            };
        }
        let Some(rendezvous) = Rendezvous::from_config(config)? else {
            return Err(Error::Collective {
                op: "finding the NCCL unique id",
                reason: format!(
                    "none of {NCCL_ID_ENV}, {NCCL_ID_FILE_ENV} or {MASTER_ADDR_ENV}/{MASTER_PORT_ENV} is set; on \
                     several hosts set {MASTER_ADDR_ENV} to rank 0's host and {MASTER_PORT_ENV} to a free port there \
                     on every rank (as torchrun does; rank 0 serves the id over TCP), or set {NCCL_ID_FILE_ENV} to a \
                     path every rank can reach (rank 0 writes the id there), or pass the id of \
                     UniqueId::new().to_hex() in {NCCL_ID_ENV}"
                ),
            });
        };
        if self.rank != 0 {
            rendezvous.fetch(self.rank, self.world_size, timeout)
        } else if self.world_size == 1 {
            UniqueId::new()
        } else {
            // Listen first: a port in use fails before NCCL is loaded.
            let server = rendezvous.listen()?;
            let id = UniqueId::new()?;
            server.serve(&id, self.world_size, timeout)?;
            Ok(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::nccl;

    fn sample() -> UniqueId {
        let mut bytes = [0u8; nccl::UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        UniqueId(bytes)
    }

    #[test]
    fn hex_round_trips() {
        let id = sample();
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        assert_eq!(&hex[..4], "0b30");
        assert_eq!(UniqueId::from_hex(&format!(" {hex}\n")).unwrap(), id);
    }

    #[test]
    fn bad_hex_is_an_error() {
        let err = UniqueId::from_hex("abc").unwrap_err().to_string();
        assert!(err.contains("expected 256 hex digits, got 3"), "{err}");
        let mut hex = sample().to_hex();
        hex.replace_range(10..12, "zz");
        let err = UniqueId::from_hex(&hex).unwrap_err().to_string();
        assert!(err.contains("\"zz\" at character 10"), "{err}");
    }

    #[test]
    fn file_exchange_is_atomic_and_waits() {
        let dir = std::env::temp_dir().join(format!("cudnn-backend-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nccl.id");
        let _ = std::fs::remove_file(&path);
        let id = sample();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                id.write_file(&path).unwrap();
            })
        };
        let read = UniqueId::read_file(&path, Duration::from_secs(10)).unwrap();
        writer.join().unwrap();
        assert_eq!(read, id);
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_times_out_with_advice() {
        let path = std::env::temp_dir().join(format!("cudnn-backend-no-id-{}", std::process::id()));
        let err = UniqueId::read_file(&path, Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(err.contains("check that rank 0 started"), "{err}");
    }

    #[test]
    fn bootstrap_reads_the_launcher_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let b = Bootstrap::from_vars(vars(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")])).unwrap();
        assert_eq!(
            b,
            Bootstrap {
                rank: 3,
                world_size: 4,
                local_rank: 1
            }
        );
        let b = Bootstrap::from_vars(vars(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!(b.local_rank, 1);
        let err = Bootstrap::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("RANK=2 is not below WORLD_SIZE=2"), "{err}");
        let err = Bootstrap::from_vars(vars(&[("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("RANK is not set"), "{err}");
        let err = Bootstrap::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("RANK=\"x\""), "{err}");
    }
}
