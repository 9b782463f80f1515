//! The TCP rendezvous of jobs spread over several hosts, the way `torchrun` starts them: rank 0
//! listens on [`MASTER_PORT_ENV`] and hands the NCCL unique id to every other rank, which
//! connects to [`MASTER_ADDR_ENV`]`:`[`MASTER_PORT_ENV`]. Only the id travels this way; NCCL
//! then connects the ranks over its own transports.
//!
//! Under `torchrun`, whose agent on rank 0's host keeps its own key-value store on
//! `MASTER_PORT` for the whole job (it says so with [`TORCHELASTIC_USE_AGENT_STORE_ENV`]), the
//! rendezvous takes the port above, `MASTER_PORT + 1`.
//!
//! The protocol: one frame per message, integers big-endian. A frame is an 8-byte magic, a
//! 16-bit protocol version and a one-byte kind, then the kind's payload:
//! - `HELLO`, a rank to rank 0: the job's world size and the rank, 32 bits each;
//! - `ID`, rank 0 to a rank: the 128 bytes of the id;
//! - `REJECT`, rank 0 to a rank: why, as a 16-bit length and UTF-8 text;
//! - `ACK`, a rank to rank 0, no payload: the id arrived.
//!
//! Rank 0 answers every hello of its job with the id and waits for exactly `world_size - 1`
//! distinct ranks to acknowledge it, so a rank that starts late still finds it listening; a
//! connection of another job (another world size), a second process claiming a rank, or one
//! that does not speak the protocol is refused, and named in rank 0's error if the job never
//! completes. Both sides give up at the caller's timeout with an error that says what to check.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::unique_id::UniqueId;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ffi::nccl::UNIQUE_ID_BYTES;

pub use crate::config::{MASTER_ADDR_ENV, MASTER_PORT_ENV, TORCHELASTIC_USE_AGENT_STORE_ENV};

/// The first bytes of every frame.
const MAGIC: [u8; 8] = *b"cuDNNrdv";
/// The protocol version; ranks of one job must agree on it.
const VERSION: u16 = 1;
/// Bytes before a frame's payload: the magic, the version and the kind.
const HEADER_BYTES: usize = MAGIC.len() + 2 + 1;
/// The kind of a rank's hello.
const HELLO: u8 = 1;
/// The kind of rank 0's id.
const ID: u8 = 2;
/// The kind of rank 0's refusal.
const REJECT: u8 = 3;
/// The kind of a rank's acknowledgement.
const ACK: u8 = 4;
/// The longest refusal text rank 0 sends.
const MAX_REASON_BYTES: usize = 1024;
/// How long rank 0 gives one connection to send its hello and to acknowledge the id (a rank
/// cut off this way connects again).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often rank 0 looks for a new connection.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// The first pause between a rank's connection attempts (doubling from there).
const RETRY_FIRST: Duration = Duration::from_millis(10);
/// The longest pause between a rank's connection attempts.
const RETRY_MAX: Duration = Duration::from_millis(250);
/// The longest single connection attempt (a host that drops packets).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The refused connections rank 0 names in its timeout error, at most.
const MAX_NOTES: usize = 8;
/// The missing ranks (or runs of ranks) rank 0 names in its timeout error, at most.
const MAX_RUNS: usize = 16;

/// The operation of rank 0's errors.
const SERVE_OP: &str = "serving the NCCL unique id (MASTER_ADDR/MASTER_PORT)";
/// The operation of the other ranks' errors.
const FETCH_OP: &str = "fetching the NCCL unique id (MASTER_ADDR/MASTER_PORT)";

/// Where rank 0 serves the NCCL unique id: its host as the other ranks reach it
/// ([`MASTER_ADDR_ENV`]) and a port ([`MASTER_PORT_ENV`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Rank 0's host: a name or an IP address (an IPv6 address with or without brackets).
    pub addr: String,
    /// The TCP port. `0` lets the system pick one when rank 0 [listens](Self::listen) (the
    /// others then need [`IdServer::port`]).
    pub port: u16,
}

impl Rendezvous {
    /// The rendezvous at `addr`:`port`.
    pub fn new(addr: impl Into<String>, port: u16) -> Self {
        Self {
            addr: addr.into(),
            port,
        }
    }

    /// The rendezvous `config`'s [`MASTER_ADDR_ENV`] and [`MASTER_PORT_ENV`] name: `None`
    /// when neither is set; an error when only one is, or when the port is not a number from
    /// 1 to 65535. The port is `MASTER_PORT + 1` when `torchrun`'s agent holds `MASTER_PORT`
    /// ([`Config::torchelastic_agent_store`]).
    pub fn from_config(config: &Config) -> Result<Option<Self>> {
        let bad = |reason: String| Error::Collective {
            op: "finding the NCCL unique id",
            reason,
        };
        match (&config.master_addr, &config.master_port) {
            (None, None) => Ok(None),
            (Some(_), None) | (None, Some(_)) => {
                let (set, unset) = if config.master_addr.is_some() {
                    (MASTER_ADDR_ENV, MASTER_PORT_ENV)
                } else {
                    (MASTER_PORT_ENV, MASTER_ADDR_ENV)
                };
                Err(bad(format!(
                    "{set} is set but {unset} is not; set both on every rank (MASTER_ADDR: rank 0's host, \
                     MASTER_PORT: a free port there)"
                )))
            }
            (Some(addr), Some(text)) => {
                let port = match text.trim().parse::<u16>() {
                    Ok(port) if port > 0 => port,
                    _ => return Err(bad(format!("{MASTER_PORT_ENV}={text:?} is not a port from 1 to 65535"))),
                };
                if !config.torchelastic_agent_store {
                    return Ok(Some(Self::new(addr.trim(), port)));
                }
                match port.checked_add(1) {
                    Some(above) => Ok(Some(Self::new(addr.trim(), above))),
                    None => Err(bad(format!(
                        "{MASTER_PORT_ENV}={port}: torchrun's agent holds that port \
                         ({TORCHELASTIC_USE_AGENT_STORE_ENV}=True), and the rendezvous takes the one above, which \
                         does not exist; choose a lower --master-port"
                    ))),
                }
            }
        }
    }

    /// The host part of [`addr`](Self::addr), without the brackets of an IPv6 address.
    fn host(&self) -> &str {
        let addr = self.addr.trim();
        addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(addr)
    }

    /// Whether rank 0 should listen on IPv6: `addr` is an IPv6 address, or a name that
    /// resolves to IPv6 addresses only.
    fn prefers_ipv6(&self) -> bool {
        let host = self.host();
        if let Ok(ip) = host.parse::<IpAddr>() {
            return ip.is_ipv6();
        }
        match (host, 0).to_socket_addrs() {
            Ok(addrs) => {
                let addrs: Vec<SocketAddr> = addrs.collect();
                !addrs.is_empty() && addrs.iter().all(SocketAddr::is_ipv6)
            }
            Err(_) => false,
        }
    }

    /// Rank 0's side, first step: listens on [`port`](Self::port) on every interface (IPv4,
    /// or IPv6 when [`addr`](Self::addr) is IPv6 only). Then make the id and
    /// [`serve`](IdServer::serve) it.
    pub fn listen(&self) -> Result<IdServer> {
        let any = if self.prefers_ipv6() {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let failed = |e: std::io::Error| {
            let advice = if e.kind() == ErrorKind::AddrInUse {
                " (another job, an earlier run's rank 0 or a launcher's own store holds it); choose another \
                 MASTER_PORT for every rank"
            } else {
                ""
            };
            Error::Collective {
                op: SERVE_OP,
                reason: format!("cannot listen on port {} of this host: {e}{advice}", self.port),
            }
        };
        let listener = TcpListener::bind((any, self.port)).map_err(failed)?;
        let port = listener.local_addr().map_err(failed)?.port();
        listener.set_nonblocking(true).map_err(failed)?;
        Ok(IdServer {
            listener,
            addr: self.addr.clone(),
            port,
        })
    }

    /// Every other rank's side: connects to rank 0 at [`addr`](Self::addr):[`port`](Self::port),
    /// trying again until `timeout` has passed (rank 0 may start later), introduces itself as
    /// `rank` of `world_size` and returns the id rank 0 sends. A refusal by rank 0, or a reply
    /// that is not the protocol's, fails at once.
    pub fn fetch(&self, rank: usize, world_size: usize, timeout: Duration) -> Result<UniqueId> {
        let bad = |reason: String| Error::Collective { op: FETCH_OP, reason };
        if rank == 0 || rank >= world_size {
            return Err(bad(format!(
                "rank {rank} of {world_size} cannot fetch the id: only ranks 1 to world_size - 1 do (rank 0 serves it)"
            )));
        }
        let (Ok(world), Ok(rank32)) = (u32::try_from(world_size), u32::try_from(rank)) else {
            return Err(bad(format!("world size {world_size} does not fit the protocol")));
        };
        let hello = Frame::Hello {
            world_size: world,
            rank: rank32,
        };
        let deadline = Instant::now() + timeout;
        let mut pause = RETRY_FIRST;
        loop {
            let last = match self.attempt(&hello, rank, deadline) {
                Ok(id) => return Ok(id),
                Err(Attempt::Fail(reason)) => return Err(bad(reason)),
                Err(Attempt::Retry(why)) => why,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(bad(format!(
                    "rank {rank} got no id from rank 0 at {}:{} within {:.1} s (last attempt: {last}); check that \
                     rank 0 started, that MASTER_ADDR names rank 0's host as this host resolves it, that every \
                     rank has the same MASTER_PORT, and that no firewall blocks that port",
                    self.addr,
                    self.port,
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(RETRY_MAX);
        }
    }

    /// One connection to rank 0 (trying each address the host resolves to) and its exchange.
    fn attempt(&self, hello: &Frame, rank: usize, deadline: Instant) -> std::result::Result<UniqueId, Attempt> {
        let host = self.host();
        let addrs: Vec<SocketAddr> = (host, self.port)
            .to_socket_addrs()
            .map_err(|e| Attempt::Retry(format!("cannot resolve {host}: {e}")))?
            .collect();
        let mut last = format!("{host} resolves to no address");
        for addr in addrs {
            let left = remaining(deadline);
            let stream = match TcpStream::connect_timeout(&addr, left.min(CONNECT_TIMEOUT)) {
                Ok(stream) => stream,
                Err(e) => {
                    last = format!("connecting to {addr}: {e}");
                    continue;
                }
            };
            // Connecting to a free port of this host from that same port connects a socket to
            // itself, which would read its own hello as the reply.
            if let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) {
                if local == peer {
                    last = format!("connecting to {addr}: connected to itself");
                    continue;
                }
            }
            return self.exchange(stream, hello, rank, deadline);
        }
        Err(Attempt::Retry(last))
    }

    /// Sends `hello` on `stream`, reads rank 0's answer and acknowledges the id.
    fn exchange(
        &self,
        mut stream: TcpStream,
        hello: &Frame,
        rank: usize,
        deadline: Instant,
    ) -> std::result::Result<UniqueId, Attempt> {
        let io = |what: &str, e: std::io::Error| Attempt::Retry(format!("{what} rank 0: {e}"));
        let left = remaining(deadline);
        stream
            .set_read_timeout(Some(left))
            .and_then(|()| stream.set_write_timeout(Some(left)))
            .map_err(|e| io("setting up the connection to", e))?;
        let _ = stream.set_nodelay(true);
        stream
            .write_all(&hello.encode())
            .map_err(|e| io("sending the hello to", e))?;
        let at = format!("{}:{}", self.addr, self.port);
        match read_frame(&mut stream) {
            Ok(Frame::Id(id)) => {
                stream
                    .write_all(&Frame::Ack.encode())
                    .map_err(|e| io("acknowledging the id to", e))?;
                Ok(id)
            }
            Ok(Frame::Reject(why)) => Err(Attempt::Fail(format!("rank 0 at {at} refused rank {rank}: {why}"))),
            Ok(other) => Err(Attempt::Fail(format!(
                "{at} sent a {} message instead of the id; is MASTER_ADDR rank 0's host?",
                other.name()
            ))),
            Err(FrameError::Io(e)) => Err(io("waiting for the id from", e)),
            Err(FrameError::Foreign) => Err(Attempt::Fail(format!(
                "{at} answered, but not with this crate's rendezvous protocol: is another service (such as a \
                 launcher's own store) listening on that port, or does MASTER_ADDR name the wrong host?"
            ))),
            Err(FrameError::Version(v)) => Err(Attempt::Fail(format!(
                "rank 0 at {at} speaks rendezvous protocol version {v}, this rank version {VERSION}: run the same \
                 cudnn-backend version on every rank"
            ))),
            Err(FrameError::Kind(k)) => Err(Attempt::Fail(format!(
                "{at} sent an unknown message kind {k}: run the same cudnn-backend version on every rank"
            ))),
        }
    }
}

/// Rank 0's listening socket, made by [`Rendezvous::listen`].
#[derive(Debug)]
pub struct IdServer {
    listener: TcpListener,
    addr: String,
    port: u16,
}

impl IdServer {
    /// The port it listens on (the system's choice when the rendezvous asked for port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Hands `id` to ranks `1..world_size`, each once, and returns when every one of them has
    /// acknowledged it. Connections of another job, repeated ranks and strangers are refused
    /// and do not count. Fails after `timeout`, naming the ranks that never arrived.
    pub fn serve(self, id: &UniqueId, world_size: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut served = vec![false; world_size.max(1)];
        served[0] = true;
        let mut left = world_size.saturating_sub(1);
        let mut notes = Notes::default();
        while left > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timed_out(&served, timeout, &notes));
            }
            match self.listener.accept() {
                Ok((stream, peer)) => match handshake(stream, id, &served, deadline) {
                    Ok(rank) => {
                        served[rank] = true;
                        left -= 1;
                    }
                    Err(why) => notes.add(format!("{peer}: {why}")),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(ACCEPT_POLL.min(deadline - now));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    notes.add(format!("accepting a connection: {e}"));
                    std::thread::sleep(ACCEPT_POLL.min(deadline - now));
                }
            }
        }
        Ok(())
    }

    /// The error when `timeout` passed before every rank arrived.
    fn timed_out(&self, served: &[bool], timeout: Duration, notes: &Notes) -> Error {
        let world_size = served.len();
        let missing: Vec<usize> = (0..world_size).filter(|&r| !served[r]).collect();
        let arrived = world_size - 1 - missing.len();
        let mut reason = format!(
            "rank 0 listened on port {port} for {secs:.1} s and {arrived} of the {others} other ranks arrived; {who} \
             never arrived. Check that {them} started with MASTER_ADDR={addr}, the same MASTER_PORT and \
             WORLD_SIZE={world_size}, that {addr} reaches this host from theirs, and that no firewall blocks port \
             {port} here",
            port = self.port,
            secs = timeout.as_secs_f64(),
            others = world_size - 1,
            who = rank_list(&missing),
            them = if missing.len() == 1 { "it" } else { "they" },
            addr = self.addr,
        );
        if !notes.list.is_empty() {
            reason.push_str(&format!("; refused: {}", notes.list.join("; ")));
            if notes.more > 0 {
                reason.push_str(&format!(" (and {} more)", notes.more));
            }
        }
        Error::Collective { op: SERVE_OP, reason }
    }
}

/// The connections rank 0 refused, for its timeout error (each also logged as a warning).
#[derive(Default)]
struct Notes {
    /// The first [`MAX_NOTES`].
    list: Vec<String>,
    /// How many more.
    more: usize,
}

impl Notes {
    /// Records one refusal.
    fn add(&mut self, text: String) {
        tracing::warn!("{SERVE_OP}: {text}");
        if self.list.len() < MAX_NOTES {
            self.list.push(text);
        } else {
            self.more += 1;
        }
    }
}

/// Sends `why` as a refusal on `stream` (best effort) and returns it.
fn refuse(stream: &mut TcpStream, why: String) -> String {
    let _ = stream.write_all(&Frame::Reject(why.clone()).encode());
    why
}

/// Rank 0's exchange with one connection: the rank it served, or why it was refused.
fn handshake(
    mut stream: TcpStream,
    id: &UniqueId,
    served: &[bool],
    deadline: Instant,
) -> std::result::Result<usize, String> {
    let limit = remaining(deadline).min(HANDSHAKE_TIMEOUT);
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(limit)))
        .and_then(|()| stream.set_write_timeout(Some(limit)))
        .map_err(|e| format!("setting up the connection: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (claimed_world, rank) = match read_frame(&mut stream) {
        Ok(Frame::Hello { world_size, rank }) => (world_size as usize, rank as usize),
        Ok(other) => return Err(format!("sent a {} message instead of a hello", other.name())),
        Err(FrameError::Io(e)) => return Err(format!("no hello ({e})")),
        Err(FrameError::Foreign) => {
            return Err("not this crate's rendezvous protocol (a stray connection?)".into());
        }
        Err(FrameError::Version(v)) => {
            let why = format!(
                "rendezvous protocol version {v} there, {VERSION} on rank 0: run the same cudnn-backend version on \
                 every rank"
            );
            return Err(refuse(&mut stream, why));
        }
        Err(FrameError::Kind(k)) => return Err(format!("unknown message kind {k}")),
    };
    let world_size = served.len();
    let problem = if claimed_world != world_size {
        Some(format!(
            "rank {rank} of a job with WORLD_SIZE={claimed_world}, but rank 0's job has WORLD_SIZE={world_size} (a \
             rank of another job on the same MASTER_PORT, or WORLD_SIZE differs between ranks)"
        ))
    } else if rank == 0 || rank >= world_size {
        Some(format!(
            "rank {rank} claimed, but only ranks 1 to {} fetch the id (two processes with RANK=0?)",
            world_size - 1
        ))
    } else if served[rank] {
        Some(format!(
            "rank {rank} already has the id: two processes were started with RANK={rank}"
        ))
    } else {
        None
    };
    if let Some(why) = problem {
        return Err(refuse(&mut stream, why));
    }
    stream
        .write_all(&Frame::Id(*id).encode())
        .map_err(|e| format!("rank {rank}: sending the id: {e}"))?;
    match read_frame(&mut stream) {
        Ok(Frame::Ack) => Ok(rank),
        Ok(other) => Err(format!(
            "rank {rank} sent a {} message instead of an acknowledgement",
            other.name()
        )),
        Err(FrameError::Io(e)) => Err(format!(
            "rank {rank} did not acknowledge the id ({e}); it may connect again"
        )),
        Err(_) => Err(format!("rank {rank} sent garbage instead of an acknowledgement")),
    }
}

/// The time left until `deadline`, at least a millisecond (socket timeouts may not be zero).
fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// `ranks` (ascending) as text: "rank 2", "ranks 1-3, 7", the first runs only when many.
fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(MAX_RUNS)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    let mut text = format!("rank{} {}", if ranks.len() == 1 { "" } else { "s" }, shown.join(", "));
    if runs.len() > MAX_RUNS {
        text.push_str(&format!(", ... ({} ranks in all)", ranks.len()));
    }
    text
}

/// Why one connection attempt of a rank did not return the id.
enum Attempt {
    /// Worth another try (no listener yet, a dropped connection).
    Retry(String),
    /// Final (rank 0 refused, or the peer does not speak the protocol).
    Fail(String),
}

/// One message of the protocol.
enum Frame {
    Hello { world_size: u32, rank: u32 },
    Id(UniqueId),
    Reject(String),
    Ack,
}

/// Why a frame could not be read.
enum FrameError {
    /// The connection failed, closed or timed out.
    Io(std::io::Error),
    /// The bytes do not start with the magic.
    Foreign,
    /// Another protocol version.
    Version(u16),
    /// An unknown kind.
    Kind(u8),
}

impl Frame {
    /// The kind's name, for errors.
    fn name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Id(_) => "id",
            Frame::Reject(_) => "refusal",
            Frame::Ack => "acknowledgement",
        }
    }

    /// The frame's bytes (one write, so a hello travels in one segment).
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + UNIQUE_ID_BYTES);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        match self {
            Frame::Hello { world_size, rank } => {
                out.push(HELLO);
                out.extend_from_slice(&world_size.to_be_bytes());
                out.extend_from_slice(&rank.to_be_bytes());
            }
            Frame::Id(id) => {
                out.push(ID);
                out.extend_from_slice(&id.0);
            }
            Frame::Reject(why) => {
                let mut end = why.len().min(MAX_REASON_BYTES);
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                out.push(REJECT);
                out.extend_from_slice(&(end as u16).to_be_bytes());
                out.extend_from_slice(&why.as_bytes()[..end]);
            }
            Frame::Ack => out.push(ACK),
        }
        out
    }
}

/// Reads one frame from `r`.
fn read_frame(r: &mut impl Read) -> std::result::Result<Frame, FrameError> {
    let mut header = [0u8; HEADER_BYTES];
    r.read_exact(&mut header).map_err(FrameError::Io)?;
    if header[..MAGIC.len()] != MAGIC {
        return Err(FrameError::Foreign);
    }
    let version = u16::from_be_bytes([header[8], header[9]]);
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    match header[10] {
        HELLO => {
            let mut payload = [0u8; 8];
            r.read_exact(&mut payload).map_err(FrameError::Io)?;
            let [w0, w1, w2, w3, r0, r1, r2, r3] = payload;
            Ok(Frame::Hello {
                world_size: u32::from_be_bytes([w0, w1, w2, w3]),
                rank: u32::from_be_bytes([r0, r1, r2, r3]),
            })
        }
        ID => {
            let mut id = [0u8; UNIQUE_ID_BYTES];
            r.read_exact(&mut id).map_err(FrameError::Io)?;
            Ok(Frame::Id(UniqueId(id)))
        }
        REJECT => {
            let mut len = [0u8; 2];
            r.read_exact(&mut len).map_err(FrameError::Io)?;
            let mut text = vec![0u8; u16::from_be_bytes(len) as usize];
            r.read_exact(&mut text).map_err(FrameError::Io)?;
            Ok(Frame::Reject(String::from_utf8_lossy(&text).into_owned()))
        }
        ACK => Ok(Frame::Ack),
        kind => Err(FrameError::Kind(kind)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread::JoinHandle;

    use super::*;
    use crate::collective::Bootstrap;
    use crate::config::test_vars::{var_os, RENDEZVOUS_CHILD_ENV};
    use crate::config::{Config, LOCAL_RANK_ENV, NCCL_ID_ENV, NCCL_ID_FILE_ENV, RANK_ENV, WORLD_SIZE_ENV};

    /// An id made of known bytes (no NCCL needed).
    fn sample() -> UniqueId {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 29 + 5) as u8;
        }
        UniqueId(bytes)
    }

    const LOCAL: &str = "127.0.0.1";

    /// Rank 0 listening on a port the system picks.
    fn server() -> IdServer {
        Rendezvous::new(LOCAL, 0).listen().unwrap()
    }

    /// `rank` of `world_size` fetching the id from `port` on its own thread.
    fn fetcher(port: u16, rank: usize, world_size: usize, timeout: Duration) -> JoinHandle<Result<UniqueId>> {
        std::thread::spawn(move || Rendezvous::new(LOCAL, port).fetch(rank, world_size, timeout))
    }

    /// A port that was free a moment ago (nothing listens on it now).
    fn free_port() -> u16 {
        TcpListener::bind((LOCAL, 0)).unwrap().local_addr().unwrap().port()
    }

    /// The text of `result`'s error.
    fn error_text<T>(result: Result<T>) -> String {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn four_ranks_on_threads_get_rank_0s_id() {
        let server = server();
        let port = server.port();
        assert_ne!(port, 0);
        let ranks: Vec<_> = (1..4).map(|r| fetcher(port, r, 4, Duration::from_secs(10))).collect();
        server.serve(&sample(), 4, Duration::from_secs(10)).unwrap();
        for rank in ranks {
            assert_eq!(rank.join().unwrap().unwrap(), sample());
        }
    }

    #[test]
    fn ranks_started_before_rank_0_wait_for_it() {
        // The port must be chosen before rank 0 listens; should another process take it in
        // between, start over on a new one.
        for _ in 0..5 {
            let port = free_port();
            let ranks: Vec<_> = (1..3).map(|r| fetcher(port, r, 3, Duration::from_secs(10))).collect();
            std::thread::sleep(Duration::from_millis(100));
            let server = match Rendezvous::new(LOCAL, port).listen() {
                Ok(server) => server,
                Err(e) if e.to_string().contains("holds it") => continue,
                Err(e) => panic!("{e}"),
            };
            assert!(ranks.iter().all(|r| !r.is_finished()), "the ranks wait for rank 0");
            server.serve(&sample(), 3, Duration::from_secs(10)).unwrap();
            for rank in ranks {
                assert_eq!(rank.join().unwrap().unwrap(), sample());
            }
            return;
        }
        panic!("no free port stayed free");
    }

    #[test]
    fn rank_0_refuses_other_jobs_repeated_ranks_and_strangers() {
        let server = server();
        let port = server.port();
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || done_tx.send(server.serve(&sample(), 3, Duration::from_secs(10))));
        let timeout = Duration::from_secs(10);

        // A rank of a job with another world size.
        let err = error_text(fetcher(port, 1, 5, timeout).join().unwrap());
        assert!(err.contains("refused rank 1") && err.contains("WORLD_SIZE=5"), "{err}");
        // A connection that does not speak the protocol gets nothing back.
        let mut stray = TcpStream::connect((LOCAL, port)).unwrap();
        stray.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        stray.set_read_timeout(Some(timeout)).unwrap();
        let mut reply = Vec::new();
        let _ = stray.read_to_end(&mut reply);
        assert!(reply.is_empty(), "{reply:?}");
        // Another protocol version is told why.
        let mut other = TcpStream::connect((LOCAL, port)).unwrap();
        let mut hello = Frame::Hello { world_size: 3, rank: 2 }.encode();
        hello[9] = 99;
        other.write_all(&hello).unwrap();
        other.set_read_timeout(Some(timeout)).unwrap();
        match read_frame(&mut other) {
            Ok(Frame::Reject(why)) => assert!(why.contains("version 99"), "{why}"),
            _ => panic!("expected a refusal"),
        }
        // Rank 1, then a second process claiming rank 1, and one claiming rank 0.
        assert_eq!(fetcher(port, 1, 3, timeout).join().unwrap().unwrap(), sample());
        let err = error_text(fetcher(port, 1, 3, timeout).join().unwrap());
        assert!(err.contains("two processes were started with RANK=1"), "{err}");
        let mut zero = TcpStream::connect((LOCAL, port)).unwrap();
        zero.write_all(&Frame::Hello { world_size: 3, rank: 0 }.encode())
            .unwrap();
        zero.set_read_timeout(Some(timeout)).unwrap();
        assert!(matches!(read_frame(&mut zero), Ok(Frame::Reject(_))));
        // None of those counted: rank 0 still waits for rank 2.
        assert!(done.try_recv().is_err());
        assert_eq!(fetcher(port, 2, 3, timeout).join().unwrap().unwrap(), sample());
        done.recv_timeout(timeout).unwrap().unwrap();
    }

    #[test]
    fn a_missing_rank_fails_rank_0_in_time_naming_it() {
        let server = server();
        let port = server.port();
        let ranks: Vec<_> = [1, 3].map(|r| fetcher(port, r, 4, Duration::from_secs(10))).into();
        let stranger = fetcher(port, 2, 7, Duration::from_secs(10));
        let start = Instant::now();
        let err = error_text(server.serve(&sample(), 4, Duration::from_secs(1)));
        assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
        assert!(
            err.contains("2 of the 3 other ranks arrived; rank 2 never arrived"),
            "{err}"
        );
        assert!(err.contains(&format!("listened on port {port}")), "{err}");
        assert!(
            err.contains("same MASTER_PORT") && err.contains("firewall blocks port"),
            "{err}"
        );
        assert!(
            err.contains("refused: 127.0.0.1:") && err.contains("WORLD_SIZE=7"),
            "{err}"
        );
        for rank in ranks {
            assert_eq!(rank.join().unwrap().unwrap(), sample());
        }
        assert!(stranger.join().unwrap().is_err());
    }

    #[test]
    fn a_rank_without_rank_0_times_out_with_advice() {
        let port = free_port();
        let start = Instant::now();
        let err = error_text(Rendezvous::new(LOCAL, port).fetch(2, 4, Duration::from_millis(200)));
        assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
        assert!(
            err.contains(&format!(
                "rank 2 got no id from rank 0 at 127.0.0.1:{port} within 0.2 s"
            )),
            "{err}"
        );
        assert!(
            err.contains("check that rank 0 started") && err.contains("same MASTER_PORT"),
            "{err}"
        );
        let err = error_text(Rendezvous::new(LOCAL, port).fetch(0, 4, Duration::from_millis(10)));
        assert!(err.contains("rank 0 serves it"), "{err}");
    }

    #[test]
    fn another_service_on_the_port_fails_at_once() {
        let listener = TcpListener::bind((LOCAL, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            }
        });
        let start = Instant::now();
        let err = error_text(Rendezvous::new(LOCAL, port).fetch(1, 2, Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        assert!(err.contains("not with this crate's rendezvous protocol"), "{err}");
    }

    #[test]
    fn a_port_in_use_says_so() {
        let server = server();
        let err = error_text(Rendezvous::new(LOCAL, server.port()).listen());
        assert!(
            err.contains(&format!("cannot listen on port {}", server.port())),
            "{err}"
        );
        assert!(err.contains("choose another MASTER_PORT"), "{err}");
    }

    #[test]
    fn a_single_rank_job_serves_no_one() {
        server().serve(&sample(), 1, Duration::from_millis(1)).unwrap();
    }

    #[test]
    fn frames_round_trip() {
        for frame in [
            Frame::Hello {
                world_size: 70000,
                rank: 65537,
            },
            Frame::Id(sample()),
            Frame::Reject("é".repeat(MAX_REASON_BYTES)),
            Frame::Ack,
        ] {
            let bytes = frame.encode();
            assert_eq!(&bytes[..8], b"cuDNNrdv");
            let back = read_frame(&mut bytes.as_slice()).ok().unwrap();
            match (&frame, &back) {
                (Frame::Hello { world_size: a, rank: b }, Frame::Hello { world_size: c, rank: d }) => {
                    assert_eq!((a, b), (c, d))
                }
                (Frame::Id(a), Frame::Id(b)) => assert_eq!(a, b),
                (Frame::Reject(_), Frame::Reject(b)) => {
                    assert_eq!(b.len(), MAX_REASON_BYTES, "cut at a character boundary")
                }
                (Frame::Ack, Frame::Ack) => {}
                _ => panic!("{} came back as {}", frame.name(), back.name()),
            }
        }
        assert!(matches!(
            read_frame(&mut &b"GET / HTTP/1.1\r\n"[..]),
            Err(FrameError::Foreign)
        ));
        let mut unknown = Frame::Ack.encode();
        unknown[10] = 9;
        assert!(matches!(read_frame(&mut unknown.as_slice()), Err(FrameError::Kind(9))));
        assert!(matches!(read_frame(&mut &b"cuDNN"[..]), Err(FrameError::Io(_))));
    }

    #[test]
    fn missing_ranks_are_listed_as_runs() {
        assert_eq!(rank_list(&[2]), "rank 2");
        assert_eq!(rank_list(&[1, 2, 3, 7, 9, 10]), "ranks 1-3, 7, 9-10");
        let many: Vec<usize> = (1..100).step_by(2).collect();
        let text = rank_list(&many);
        assert!(
            text.starts_with("ranks 1, 3, 5") && text.ends_with(", ... (50 ranks in all)"),
            "{text}"
        );
    }

    #[test]
    fn the_configuration_names_the_rendezvous() {
        let config = |pairs: &[(&str, &str)]| {
            Config::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        assert_eq!(Rendezvous::from_config(&config(&[])).unwrap(), None);
        let c = config(&[(MASTER_ADDR_ENV, " node-0 "), (MASTER_PORT_ENV, "29500")]);
        assert_eq!(
            Rendezvous::from_config(&c).unwrap(),
            Some(Rendezvous::new("node-0", 29500))
        );
        assert_eq!(Rendezvous::new("[::1]", 1).host(), "::1");
        let err = error_text(Rendezvous::from_config(&config(&[(MASTER_ADDR_ENV, "node-0")])));
        assert!(err.contains("MASTER_ADDR is set but MASTER_PORT is not"), "{err}");
        let err = error_text(Rendezvous::from_config(&config(&[(MASTER_PORT_ENV, "29500")])));
        assert!(err.contains("MASTER_PORT is set but MASTER_ADDR is not"), "{err}");
        for port in ["0", "65536", "http", "-1"] {
            let c = config(&[(MASTER_ADDR_ENV, "node-0"), (MASTER_PORT_ENV, port)]);
            let err = error_text(Rendezvous::from_config(&c));
            assert!(err.contains("is not a port from 1 to 65535"), "{port}: {err}");
        }
        // Under torchrun, whose agent keeps its store on MASTER_PORT: the port above.
        let torchrun = |port| {
            config(&[
                (MASTER_ADDR_ENV, "node-0"),
                (MASTER_PORT_ENV, port),
                (TORCHELASTIC_USE_AGENT_STORE_ENV, "True"),
            ])
        };
        assert_eq!(
            Rendezvous::from_config(&torchrun("29500")).unwrap(),
            Some(Rendezvous::new("node-0", 29501))
        );
        let err = error_text(Rendezvous::from_config(&torchrun("65535")));
        assert!(err.contains("choose a lower --master-port"), "{err}");
    }

    /// The id found through a configuration's variables, as a rank of a job does.
    fn rank_of(config: &Config, timeout: Duration) -> Result<UniqueId> {
        Bootstrap::from_config(config)?.unique_id_with(config, timeout)
    }

    #[test]
    fn the_id_variable_then_the_file_then_the_rendezvous() {
        let server = server();
        let port = server.port().to_string();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nccl.id");
        let other = UniqueId([3; UNIQUE_ID_BYTES]);
        other.write_file(&file).unwrap();
        let hex = sample().to_hex();
        let file_text = file.to_str().unwrap();
        let rank_1: [(&str, &str); 4] = [
            (RANK_ENV, "1"),
            (WORLD_SIZE_ENV, "2"),
            (MASTER_ADDR_ENV, LOCAL),
            (MASTER_PORT_ENV, &port),
        ];
        let with = |extra: &[(&'static str, &str)]| {
            let pairs: Vec<(String, String)> = rank_1
                .iter()
                .chain(extra)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::from_vars(move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        };
        let short = Duration::from_millis(100);
        let both = with(&[(NCCL_ID_ENV, &hex), (NCCL_ID_FILE_ENV, file_text)]);
        assert_eq!(rank_of(&both, short).unwrap(), sample(), "the variable first");
        assert_eq!(rank_of(&with(&[(NCCL_ID_FILE_ENV, file_text)]), short).unwrap(), other);
        let neither = with(&[]);
        let fetching = std::thread::spawn(move || rank_of(&neither, Duration::from_secs(10)));
        server.serve(&sample(), 2, Duration::from_secs(10)).unwrap();
        assert_eq!(fetching.join().unwrap().unwrap(), sample(), "then the rendezvous");

        let bare = Config::from_vars(|k| match k {
            RANK_ENV => Some("1"),
            WORLD_SIZE_ENV => Some("2"),
            _ => None,
        });
        let err = error_text(rank_of(&bare, short));
        for name in [NCCL_ID_ENV, NCCL_ID_FILE_ENV, MASTER_ADDR_ENV, MASTER_PORT_ENV] {
            assert!(err.contains(name), "{name}: {err}");
        }
    }

    #[test]
    fn ranks_in_separate_processes_get_the_id() {
        let name = "collective::rendezvous::tests::ranks_in_separate_processes_get_the_id";
        if let Some(expected) = var_os(RENDEZVOUS_CHILD_ENV) {
            // A child: a rank configured through its environment, as a launcher starts it.
            let config = Config::from_env();
            let id = rank_of(&config, Duration::from_secs(20)).unwrap();
            assert_eq!(Some(id.to_hex().as_str()), expected.to_str());
            return;
        }
        let server = server();
        let exe = std::env::current_exe().expect("the test binary");
        let world_size = 3;
        let children: Vec<_> = (1..world_size)
            .map(|rank| {
                std::process::Command::new(&exe)
                    .args(["--exact", name, "--test-threads=1"])
                    .env(RENDEZVOUS_CHILD_ENV, sample().to_hex())
                    .env(RANK_ENV, rank.to_string())
                    .env(WORLD_SIZE_ENV, world_size.to_string())
                    .env(MASTER_ADDR_ENV, LOCAL)
                    .env(MASTER_PORT_ENV, server.port().to_string())
                    .env_remove(LOCAL_RANK_ENV)
                    .env_remove(TORCHELASTIC_USE_AGENT_STORE_ENV)
                    .env_remove(NCCL_ID_ENV)
                    .env_remove(NCCL_ID_FILE_ENV)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("starting a rank")
            })
            .collect();
        let served = server.serve(&sample(), world_size, Duration::from_secs(20));
        let outputs: Vec<_> = children
            .into_iter()
            .map(|child| child.wait_with_output().expect("a rank's output"))
            .collect();
        served.unwrap();
        for out in outputs {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
