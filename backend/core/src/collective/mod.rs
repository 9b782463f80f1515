//! Collective communication between GPUs through NCCL: all-reduce, broadcast and all-gather
//! of device tensors of any of our dtypes, enqueued on the caller's stream.
//!
//! NCCL is loaded at run time on first use ([`NCCL_LIB_ENV`](crate::NCCL_LIB_ENV) names the
//! library; a missing one is an [`Error::LibraryNotFound`] that lists what was searched).
//! Two ways to build communicators:
//! - **one process, one thread driving several GPUs**: [`Communicator::init_all`], and the
//!   collectives of all ranks issued inside one [`group`];
//! - **one process (or thread) per GPU**: [`Communicator::init_rank`] with a [`UniqueId`] that
//!   rank 0 made and handed to the others ([`Bootstrap`] reads the rank and world size from
//!   the environment, and finds the id there, in a shared file, or over TCP from rank 0's
//!   host through [`Rendezvous`], the ways multi-process and multi-host jobs start).
//!
//! Nothing hangs silently: a watchdog aborts a communicator whose collective has not
//! completed within its timeout ([`NCCL_TIMEOUT_ENV`], 10 minutes by default) or that NCCL
//! reports an asynchronous error for (a dead peer), logs why, and every later call on it
//! returns that error.

mod id;
mod rendezvous;
mod unique_id;
pub(crate) mod watchdog;

pub use id::{Bootstrap, NCCL_ID_ENV, NCCL_ID_FILE_ENV};
pub use rendezvous::{IdServer, Rendezvous, MASTER_ADDR_ENV, MASTER_PORT_ENV, TORCHELASTIC_USE_AGENT_STORE_ENV};
pub use unique_id::UniqueId;
pub use watchdog::{timeout_from_env, DEFAULT_TIMEOUT, NCCL_TIMEOUT_ENV};

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::ffi::nccl::{self, Comm, RedOp, IN_PROGRESS};
use crate::runtime::Device;
use crate::types::{DataType, TensorMut, TensorRef};
use watchdog::Watched;

/// How [`Communicator::all_reduce`] combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The largest value (logical or for bool).
    Max,
    /// The smallest value (logical and for bool).
    Min,
    /// The mean over the ranks (NCCL's `ncclAvg`).
    Mean,
}

impl ReduceOp {
    fn nccl(self, dtype: DataType) -> Result<RedOp> {
        Ok(match (self, dtype) {
            (ReduceOp::Max, _) => RedOp::Max,
            (ReduceOp::Min, _) => RedOp::Min,
            (_, DataType::Bool) => {
                return Err(Error::invalid_arg(
                    "all_reduce",
                    "op",
                    format!("{self:?} is not defined on bool tensors; use Max (or) or Min (and)"),
                ))
            }
            (ReduceOp::Sum, _) => RedOp::Sum,
            (ReduceOp::Prod, _) => RedOp::Prod,
            (ReduceOp::Mean, _) => RedOp::Avg,
        })
    }
}

/// The NCCL library this process loaded: its version code (`major * 10000 + minor * 100 +
/// patch`) and the name it was loaded by. Loads it on the first call.
pub fn nccl_version() -> Result<(i32, String)> {
    nccl::version()
}

/// One rank of an NCCL communicator, bound to one GPU. Cheap to clone; the communicator is
/// destroyed when the last clone drops.
#[derive(Clone)]
pub struct Communicator {
    watched: Arc<Watched>,
    device: Arc<Device>,
    rank: usize,
    world_size: usize,
    /// This rank's own stream for collectives called on a special stream handle (see
    /// [`route`](Self::route)), made on first such call.
    side: Arc<OnceLock<Arc<CudaStream>>>,
}

/// Where one collective runs: the stream NCCL gets and, when that is the communicator's
/// own stream, the caller's stream that must wait for it.
struct Route {
    run_on: Arc<CudaStream>,
    caller: Option<Arc<CudaStream>>,
}

/// Whether `stream` is a special handle (the null stream, `CU_STREAM_LEGACY` or
/// `CU_STREAM_PER_THREAD`, e.g. Candle's per-thread stream) rather than a created stream.
fn is_special_handle(stream: &CudaStream) -> bool {
    (stream.cu_stream() as usize) <= 2
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Communicator {
    /// Joins rank `rank` of a `world_size`-rank communicator on `device`. Every rank calls
    /// this with the same `id` (from rank 0's [`UniqueId::new`]); it returns once all have
    /// joined, or fails after `timeout` (then a rank did not start or died).
    pub fn init_rank(
        device: &Arc<Device>,
        rank: usize,
        world_size: usize,
        id: &UniqueId,
        timeout: Duration,
    ) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::invalid_arg(
                "Communicator::init_rank",
                "rank",
                format!("{rank} is not below the world size {world_size}"),
            ));
        }
        let comm = Comm::init_rank(device.context(), world_size, &id.0, rank)?;
        let label = format!("rank {rank} of {world_size} on GPU {}", device.ordinal());
        let watched = Watched::register(comm, label, timeout);
        watched.settle("Communicator::init_rank")?;
        Ok(Self {
            watched,
            device: device.clone(),
            rank,
            world_size,
            side: Arc::default(),
        })
    }

    /// [`init_rank`](Self::init_rank) for a process of a multi-process job: rank and world
    /// size from [`Bootstrap::from_env`], the id through [`Bootstrap::unique_id`] (the id
    /// variable, the id file or the `MASTER_ADDR`/`MASTER_PORT` rendezvous), the GPU the
    /// caller chose (usually `LOCAL_RANK`'s), the timeout from [`NCCL_TIMEOUT_ENV`].
    pub fn from_env(device: &Arc<Device>) -> Result<Self> {
        let job = Bootstrap::from_env()?;
        let timeout = watchdog::timeout_from_env();
        let id = job.unique_id(timeout)?;
        Self::init_rank(device, job.rank, job.world_size, &id, timeout)
    }

    /// One communicator per device, all driven from this process (`ncclCommInitAll`); rank
    /// `i` is `devices[i]`. Issue the ranks' collectives inside one [`group`] when a single
    /// thread drives them.
    pub fn init_all(devices: &[Arc<Device>]) -> Result<Vec<Self>> {
        let ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
        let mut seen = ordinals.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != ordinals.len() || ordinals.is_empty() {
            return Err(Error::invalid_arg(
                "Communicator::init_all",
                "devices",
                format!("need distinct GPUs, one per rank; got ordinals {ordinals:?}"),
            ));
        }
        let timeout = watchdog::timeout_from_env();
        let world_size = devices.len();
        Ok(Comm::init_all(&ordinals)?
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, device))| {
                let label = format!("rank {rank} of {world_size} on GPU {}", device.ordinal());
                Self {
                    watched: Watched::register(comm, label, timeout),
                    device: device.clone(),
                    rank,
                    world_size,
                    side: Arc::default(),
                }
            })
            .collect())
    }

    /// This rank's index, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The GPU this rank runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// How long a collective may run before the watchdog aborts the communicator.
    pub fn timeout(&self) -> Duration {
        self.watched.timeout
    }

    /// Enqueues an all-reduce of `input` into `output` on `stream` (both packed, same dtype
    /// and shape; pass views of the same memory to reduce in place). Every rank calls it with
    /// the same element count, dtype and op, in the same order as its other collectives.
    pub fn all_reduce(
        &self,
        stream: &Arc<CudaStream>,
        input: &TensorRef<'_>,
        output: &TensorMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "all_reduce";
        self.prepare(OP, stream, &[input, output])?;
        let red = op.nccl(input.dtype())?;
        let route = self.route(OP, stream)?;
        let status = self.watched.comm.all_reduce(input, output, red, &route.run_on);
        self.finish(OP, route, status)
    }

    /// Enqueues an in-place broadcast of `buffer` from rank `root` to every rank, on `stream`.
    pub fn broadcast(&self, stream: &Arc<CudaStream>, buffer: &TensorMut<'_>, root: usize) -> Result<()> {
        const OP: &str = "broadcast";
        if root >= self.world_size {
            return Err(Error::invalid_arg(
                OP,
                "root",
                format!("{root} is not below the world size {}", self.world_size),
            ));
        }
        self.prepare(OP, stream, &[buffer])?;
        let route = self.route(OP, stream)?;
        let status = self.watched.comm.broadcast(buffer, root, &route.run_on);
        self.finish(OP, route, status)
    }

    /// Enqueues an all-gather on `stream`: `output` (packed, `world_size` times `input`'s
    /// elements) receives every rank's `input` in rank order.
    pub fn all_gather(&self, stream: &Arc<CudaStream>, input: &TensorRef<'_>, output: &TensorMut<'_>) -> Result<()> {
        const OP: &str = "all_gather";
        self.prepare(OP, stream, &[input, output])?;
        let route = self.route(OP, stream)?;
        let status = self
            .watched
            .comm
            .all_gather(input, output, self.world_size, &route.run_on);
        self.finish(OP, route, status)
    }

    /// Waits until every collective this rank enqueued has completed on the GPU; the
    /// communicator's failure if the watchdog aborted it (a timeout, a dead peer).
    pub fn synchronize(&self) -> Result<()> {
        self.watched.wait_all("synchronize")
    }

    /// `Ok` while the communicator is alive; the failure if the watchdog aborted it. Does
    /// not wait for anything.
    pub fn status(&self) -> Result<()> {
        self.watched.check_alive("status")
    }

    /// Aborts the communicator: pending collectives stop, and every later call on it (on
    /// any clone) fails with `reason`. For a rank that hits an error and must not leave its
    /// peers waiting.
    pub fn abort(&self, reason: &str) {
        self.watched
            .fail(format!("aborted by the application: {reason}"), "abort");
    }

    /// Checks that the communicator is alive and that `stream` and `views` suit it.
    fn prepare(&self, op: &'static str, stream: &Arc<CudaStream>, views: &[&TensorRef<'_>]) -> Result<()> {
        self.watched.check_alive(op)?;
        if stream.context().ordinal() != self.device.ordinal() {
            return Err(Error::invalid_arg(
                op,
                "stream",
                format!(
                    "belongs to GPU {} but this rank's communicator is on GPU {}",
                    stream.context().ordinal(),
                    self.device.ordinal()
                ),
            ));
        }
        for (i, view) in views.iter().enumerate() {
            view.check_stream(stream, op, if i == 0 { "input" } else { "output" })?;
        }
        Ok(())
    }

    /// The stream NCCL runs a collective called on `stream` on. A created stream is used as
    /// it is. A special handle is not: a non-blocking communicator may launch from an NCCL
    /// thread, where the per-thread handle names that thread's stream, so the collective
    /// would run unordered with the caller's work (NVIDIA/nccl#1976). Those collectives run
    /// on this rank's own stream instead, after the caller's work so far, and the caller's
    /// stream waits for them once they are enqueued.
    fn route(&self, op: &'static str, stream: &Arc<CudaStream>) -> Result<Route> {
        if !is_special_handle(stream) {
            return Ok(Route {
                run_on: stream.clone(),
                caller: None,
            });
        }
        let cuda = |e: cudarc::driver::DriverError| Error::Cuda {
            op,
            message: format!("ordering a collective called on a default stream: {e}"),
        };
        let side = match self.side.get() {
            Some(side) => side.clone(),
            None => {
                let made = self.device.context().new_stream().map_err(cuda)?;
                self.side.get_or_init(|| made).clone()
            }
        };
        side.join(stream).map_err(cuda)?;
        Ok(Route {
            run_on: side,
            caller: Some(stream.clone()),
        })
    }

    /// After an NCCL call: outside a group, waits for a non-blocking enqueue, records the
    /// completion event and orders a routed caller's stream after it; inside one, defers all
    /// of that to the group's end. Views refused before NCCL ran (not packed, mismatched
    /// counts) are returned as they are and leave the communicator usable; an error of NCCL
    /// itself aborts it.
    fn finish(&self, op: &'static str, route: Route, status: Result<i32>) -> Result<()> {
        let status = status.map_err(|e| match e {
            Error::InvalidArgument { .. } | Error::InvalidInput { .. } => e,
            other => self.watched.fail(other.to_string(), op),
        })?;
        let issued = Issued {
            watched: self.watched.clone(),
            route,
            op,
        };
        let issued = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth > 0 {
                g.issued.push(issued);
                None
            } else {
                Some(issued)
            }
        });
        match issued {
            Some(issued) => issued.complete(status == IN_PROGRESS),
            None => Ok(()),
        }
    }
}

/// The collectives issued inside the current thread's [`group`].
#[derive(Default)]
struct GroupState {
    depth: usize,
    issued: Vec<Issued>,
}

/// One collective NCCL accepted, not yet known to be enqueued.
struct Issued {
    watched: Arc<Watched>,
    route: Route,
    op: &'static str,
}

impl Issued {
    /// Waits for the enqueue when NCCL reported it in progress, records the completion
    /// event, and orders a routed caller's stream after the collective.
    fn complete(&self, in_progress: bool) -> Result<()> {
        if in_progress {
            self.watched.settle(self.op)?;
        }
        self.watched.enqueued(self.op, &self.route.run_on)?;
        if let Some(caller) = &self.route.caller {
            caller.join(&self.route.run_on).map_err(|e| Error::Cuda {
                op: self.op,
                message: format!("ordering the caller's stream after the collective: {e}"),
            })?;
        }
        Ok(())
    }
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Runs `f` as one NCCL group (`ncclGroupStart` … `ncclGroupEnd`): the collectives it issues
/// launch together when it returns. Needed when one thread drives several ranks (each call
/// may otherwise wait for the other ranks), and it fuses many small collectives into one
/// launch. Groups nest; the outermost launches.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    nccl::group_start()?;
    GROUP.with(|g| g.borrow_mut().depth += 1);
    let result = f();
    let issued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth -= 1;
        if g.depth == 0 {
            std::mem::take(&mut g.issued)
        } else {
            Vec::new()
        }
    });
    let ended = nccl::group_end();
    let ended = match ended {
        Ok(status) => status,
        Err(e) => {
            for issued in &issued {
                issued.watched.fail(e.to_string(), issued.op);
            }
            return Err(e);
        }
    };
    for issued in &issued {
        issued.complete(ended == IN_PROGRESS)?;
    }
    result
}
