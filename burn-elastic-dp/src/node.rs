//! Groups across OS processes: one replica group per process (a *node*),
//! joined into one data-parallel group over TCP.
//!
//! Inside a process the replicas all-reduce through burn-collective as
//! before; between processes, each process's first replica (its *leader*)
//! sends the process's summed gradients (every replica's loss is scaled by its
//! share of the global batch) to rank 0 (the *hub*), which adds them up in
//! rank order and sends the one result back to every process, so every replica of every
//! process steps with the same bits. The hub listens on one TCP port; that is
//! the only port the processes need.
//!
//! Why not burn-collective's own multi-node mode (a global orchestrator and
//! nodes): in burn-collective 0.21 a node's second global all-reduce never
//! returns (its sync service never forgets the peers of the first one), and a
//! lost peer panics inside its runtime instead of returning an error; the
//! crate was removed from Burn after 0.21.
//!
//! Sharding: every process is given the *same global batch* (a sampler with
//! the same seed gives it everywhere); the batch is split into one shard per
//! replica of the whole group, and the process of rank `n` runs the shards
//! of its replicas, after those of ranks `0..n`.
//!
//! Every wait is bounded: joining by the group's timeout, every read and write
//! of a step by the step's deadline; at the deadline, or when a step fails
//! anywhere, the sockets are shut down, so no process stays blocked. A link
//! that failed stays failed: every process must start again (as with
//! PyTorch's process groups).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};

use crate::error::ElasticError;

/// Where this process stands in a group that spans several processes (on
/// one machine or several); set as [`ReplicaConfig::nodes`](crate::ReplicaConfig::nodes).
///
/// Every process is given the same global batch at every step and runs the
/// shards of its own replicas (see the module documentation). Rank 0 (the
/// hub) listens on the port of `hub`; every other rank connects to it.
///
/// ```
/// use burn_elastic_dp::NodeConfig;
///
/// let node = NodeConfig::new(2, 1, "10.0.0.1:29500".into());
/// assert!(node.validate().is_ok());
/// let bad = NodeConfig::new(2, 2, "10.0.0.1:29500".into());
/// assert_eq!(bad.validate().unwrap_err().to_string(),
///     "nodes: rank must be in 0..2 (num_nodes 2), got 2");
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct NodeConfig {
    /// Processes in the group (at least 1).
    pub num_nodes: usize,
    /// This process's rank, in `0..num_nodes`; rank 0 is the hub.
    pub rank: usize,
    /// The hub's address as every rank reaches it, `host:port` (port 1 to 65535).
    pub hub: String,
    /// Where the hub listens, `ip:port`; `0.0.0.0` and the port of `hub` by
    /// default. Ignored on other ranks.
    #[config(default = "None")]
    pub listen: Option<String>,
    /// Longest to wait for every process to join, in milliseconds (at least
    /// 1); the group's `timeout_ms` by default.
    #[config(default = "None")]
    pub join_timeout_ms: Option<u64>,
}

impl NodeConfig {
    /// Checks the configuration; the error says which field and what is accepted.
    pub fn validate(&self) -> Result<(), ElasticError> {
        let bad = |message: String| Err(ElasticError::BadNodeConfig(message));
        if self.num_nodes == 0 {
            return bad("num_nodes must be at least 1, got 0".into());
        }
        if self.rank >= self.num_nodes {
            return bad(format!(
                "rank must be in 0..{} (num_nodes {}), got {}",
                self.num_nodes, self.num_nodes, self.rank
            ));
        }
        match self
            .hub
            .rsplit_once(':')
            .map(|(h, p)| (h, p.parse::<u16>()))
        {
            Some((host, Ok(port))) if !host.is_empty() && port != 0 => {}
            _ => {
                return bad(format!(
                    "hub must be host:port with a port in 1..=65535, got {:?}",
                    self.hub
                ));
            }
        }
        if self.join_timeout_ms == Some(0) {
            return bad("join_timeout_ms must be at least 1, got 0".into());
        }
        if let Some(listen) = &self.listen
            && !matches!(listen.parse::<SocketAddr>(), Ok(a) if a.port() != 0)
        {
            return bad(format!(
                "listen must be ip:port with a port in 1..=65535, got {listen:?}"
            ));
        }
        Ok(())
    }

    fn listen_address(&self) -> String {
        match &self.listen {
            Some(listen) => listen.clone(),
            None => {
                let port = self.hub.rsplit_once(':').map_or("", |(_, p)| p);
                format!("0.0.0.0:{port}")
            }
        }
    }
}

/// Protocol tag and version, first in every hello.
const MAGIC: &[u8; 4] = b"PTDP";
const VERSION: u32 = 1;

/// How the global batch is shared: one shard per replica of the whole group.
#[derive(Debug, Clone)]
pub(crate) struct Shards {
    /// Every replica's shard, ranks in order.
    pub all: Vec<usize>,
    /// The index in `all` of this process's first replica.
    pub first: usize,
    /// This process's replicas.
    pub local: usize,
    /// Samples in the global batch.
    pub batch: usize,
}

impl Shards {
    /// This process's replicas' shards.
    pub fn mine(&self) -> Vec<usize> {
        self.all[self.first..self.first + self.local].to_vec()
    }

    /// Keeps this process's parts of a batch split by `all`.
    pub fn take<T>(&self, parts: Vec<T>) -> Vec<T> {
        parts
            .into_iter()
            .skip(self.first)
            .take(self.local)
            .collect()
    }

    /// The factor on local replica `replica`'s mean loss (its share of the
    /// global batch) so that the sum of the gradients over every replica of
    /// the group is the global batch's.
    pub fn scale(&self, replica: usize) -> f32 {
        self.all[self.first + replica] as f32 / self.batch as f32
    }

    /// The mean loss over this process's samples from its replicas' scaled losses.
    pub fn loss(&self, scaled: impl Iterator<Item = f32>) -> f32 {
        let samples: usize = self.mine().iter().sum();
        scaled.sum::<f32>() * self.batch as f32 / samples as f32
    }
}

/// Shares a batch of `batch` samples between `local` replicas of this
/// process and those of the other processes of `link`.
pub(crate) fn shards(
    link: Option<&NodeLink>,
    batch: usize,
    local: usize,
) -> Result<Shards, ElasticError> {
    let (replicas, first) = match link {
        // A replica of this process left behind by a failed step: the
        // other processes still count it, and cannot be told.
        Some(link) if link.replicas[link.rank] != local => return Err(ElasticError::NodesFixed),
        Some(link) => (
            link.replicas.iter().sum(),
            link.replicas[..link.rank].iter().sum(),
        ),
        None => (local, 0),
    };
    let all = burn_pipe::micro_batch_sizes(batch, replicas)
        .map_err(|_| ElasticError::BatchTooSmall { batch, replicas })?;
    Ok(Shards {
        all,
        first,
        local,
        batch,
    })
}

/// The result of one exchange, from the leader to the other local replicas.
type Reduced = Result<Arc<Vec<f32>>, String>;

/// This process's connection to the other processes of the group.
pub(crate) struct NodeLink {
    rank: usize,
    /// Replicas of each process, by rank.
    replicas: Vec<usize>,
    /// Rank 0: one stream per rank `1..`; other ranks: the stream to the hub.
    streams: Mutex<Links>,
    /// Clones of the streams, to shut them down from another thread.
    shutdown: Vec<TcpStream>,
    /// To local replicas `1..`: the leader's result of each exchange.
    followers: Vec<Sender<Reduced>>,
    inboxes: Vec<Receiver<Reduced>>,
    /// Dropped on abort, which wakes followers waiting for the leader.
    abort_tx: Mutex<Option<Sender<()>>>,
    abort_rx: Receiver<()>,
    /// Whether this process aborted the link (then a closed connection is
    /// not the other process's doing).
    aborted: AtomicBool,
    /// The rank an exchange is waiting for now (`usize::MAX`: none).
    waiting_on: AtomicUsize,
    /// The group's bound on a step, reported in timeouts.
    step_timeout: Duration,
}

struct Links {
    streams: Vec<TcpStream>,
    /// Exchanges done; each message carries it, so a process that lost step
    /// is caught.
    round: u64,
    /// Why the link failed, once it has.
    broken: Option<String>,
}

impl std::fmt::Debug for NodeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLink")
            .field("rank", &self.rank)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

/// Validates `config` and joins the other processes within its join timeout
/// (`timeout` by default):
/// `None` without a node configuration or with one process.
pub(crate) fn join(
    config: Option<&NodeConfig>,
    local: usize,
    timeout: Duration,
) -> Result<Option<Arc<NodeLink>>, ElasticError> {
    let Some(config) = config else {
        return Ok(None);
    };
    config.validate()?;
    if config.num_nodes == 1 {
        return Ok(None);
    }
    let step_timeout = timeout;
    let timeout = config
        .join_timeout_ms
        .map_or(timeout, Duration::from_millis);
    let deadline = Instant::now() + timeout;
    let (streams, replicas) = if config.rank == 0 {
        accept_all(config, local, deadline, timeout)?
    } else {
        connect_hub(config, local, deadline, timeout)?
    };
    let shutdown = streams
        .iter()
        .map(TcpStream::try_clone)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| node_error(0, format!("cloning a socket: {error}")))?;
    // Unbounded: the leader may run ahead through stages with nothing to
    // all-reduce in this process; the results queue up in stage order.
    let (followers, inboxes) = (1..local).map(|_| unbounded()).unzip();
    let (abort_tx, abort_rx) = bounded(0);
    tracing::info!(
        rank = config.rank,
        ?replicas,
        "joined the processes of the replica group"
    );
    Ok(Some(Arc::new(NodeLink {
        rank: config.rank,
        replicas,
        streams: Mutex::new(Links {
            streams,
            round: 0,
            broken: None,
        }),
        shutdown,
        followers,
        inboxes,
        abort_tx: Mutex::new(Some(abort_tx)),
        abort_rx,
        aborted: AtomicBool::new(false),
        waiting_on: AtomicUsize::new(usize::MAX),
        step_timeout,
    })))
}

fn node_error(node: usize, message: String) -> ElasticError {
    ElasticError::Node { node, message }
}

/// The time left before `deadline`, or a timeout error about `node`.
fn left(deadline: Instant, node: usize, waited: Duration) -> Result<Duration, ElasticError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ElasticError::NodesMissing {
            missing: vec![node],
            waited,
        })
    } else {
        Ok(left)
    }
}

fn bounded_stream(stream: &TcpStream, left: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

fn io_error(node: usize, doing: &str, error: std::io::Error) -> ElasticError {
    let what = match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => "timed out".to_string(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            "the connection closed (did that process exit?)".to_string()
        }
        _ => error.to_string(),
    };
    node_error(node, format!("{doing}: {what}"))
}

fn read_u32(stream: &mut TcpStream) -> std::io::Result<u32> {
    let mut bytes = [0; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_le_bytes(bytes))
}

fn read_u64(stream: &mut TcpStream) -> std::io::Result<u64> {
    let mut bytes = [0; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// Rank 0: accepts every other rank, checks its hello and answers with every
/// rank's replica count.
fn accept_all(
    config: &NodeConfig,
    local: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<(Vec<TcpStream>, Vec<usize>), ElasticError> {
    let address = config.listen_address();
    let listener = TcpListener::bind(&address)
        .map_err(|error| node_error(0, format!("listening on {address}: {error}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|error| node_error(0, format!("listening on {address}: {error}")))?;
    let nodes = config.num_nodes;
    let mut joined: Vec<Option<(TcpStream, usize)>> = (0..nodes).map(|_| None).collect();
    while joined[1..].iter().any(Option::is_none) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(ElasticError::NodesMissing {
                        missing: (1..nodes).filter(|&n| joined[n].is_none()).collect(),
                        waited: timeout,
                    });
                }
                // Accept has no timeout of its own: poll the listener.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(error) => return Err(node_error(0, format!("accepting: {error}"))),
        };
        let mut stream = stream;
        let hello = (|| -> std::io::Result<(Vec<u8>, u32, u32, u32, u32)> {
            stream.set_nonblocking(false)?;
            stream.set_nodelay(true)?;
            bounded_stream(
                &stream,
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            )?;
            let mut magic = vec![0; 4];
            stream.read_exact(&mut magic)?;
            Ok((
                magic,
                read_u32(&mut stream)?,
                read_u32(&mut stream)?,
                read_u32(&mut stream)?,
                read_u32(&mut stream)?,
            ))
        })();
        let (magic, version, num_nodes, rank, replicas) = match hello {
            Ok(hello) => hello,
            Err(error) => {
                tracing::warn!(%error, "ignored a connection without a valid hello");
                continue;
            }
        };
        let (rank, num_nodes) = (rank as usize, num_nodes as usize);
        if magic != MAGIC || version != VERSION {
            tracing::warn!("ignored a connection from another protocol or version");
            continue;
        }
        if num_nodes != nodes {
            return Err(node_error(
                rank,
                format!("it says num_nodes {num_nodes}, this hub {nodes}"),
            ));
        }
        if rank == 0 || rank >= nodes || joined[rank].is_some() {
            return Err(node_error(
                rank,
                format!("rank {rank} joined twice or is out of 1..{nodes}"),
            ));
        }
        if replicas == 0 {
            return Err(node_error(rank, "it has no replica".into()));
        }
        joined[rank] = Some((stream, replicas as usize));
    }
    let mut replicas = vec![local];
    let mut streams = Vec::with_capacity(nodes - 1);
    for (stream, count) in joined.into_iter().flatten() {
        replicas.push(count);
        streams.push(stream);
    }
    let mut answer = MAGIC.to_vec();
    answer.extend_from_slice(&(nodes as u32).to_le_bytes());
    for count in &replicas {
        answer.extend_from_slice(&(*count as u32).to_le_bytes());
    }
    for (n, stream) in streams.iter_mut().enumerate() {
        bounded_stream(stream, left(deadline, n + 1, timeout)?)
            .and_then(|()| stream.write_all(&answer))
            .map_err(|error| io_error(n + 1, "answering its hello", error))?;
    }
    Ok((streams, replicas))
}

/// Ranks `1..`: connects to the hub (retrying until the deadline, as it may
/// start later), says hello and reads every rank's replica count.
fn connect_hub(
    config: &NodeConfig,
    local: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<(Vec<TcpStream>, Vec<usize>), ElasticError> {
    let mut stream = loop {
        let remaining = left(deadline, 0, timeout)?;
        let addresses = config
            .hub
            .to_socket_addrs()
            .map_err(|error| node_error(0, format!("resolving {}: {error}", config.hub)))?;
        let mut connected = None;
        for address in addresses {
            if let Ok(stream) = TcpStream::connect_timeout(&address, remaining) {
                connected = Some(stream);
                break;
            }
        }
        match connected {
            Some(stream) => break stream,
            // Not listening yet: try again shortly, until the deadline.
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let handshake = |stream: &mut TcpStream| -> std::io::Result<Vec<usize>> {
        stream.set_nodelay(true)?;
        bounded_stream(
            stream,
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        )?;
        let mut hello = MAGIC.to_vec();
        for value in [
            VERSION,
            config.num_nodes as u32,
            config.rank as u32,
            local as u32,
        ] {
            hello.extend_from_slice(&value.to_le_bytes());
        }
        stream.write_all(&hello)?;
        let mut magic = [0; 4];
        stream.read_exact(&mut magic)?;
        let nodes = read_u32(stream)? as usize;
        if &magic != MAGIC || nodes != config.num_nodes {
            return Err(std::io::Error::other(format!(
                "the hub answered for {nodes} nodes, this process has num_nodes {}",
                config.num_nodes
            )));
        }
        (0..nodes)
            .map(|_| read_u32(stream).map(|c| c as usize))
            .collect()
    };
    let replicas = handshake(&mut stream).map_err(|error| match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ElasticError::NodesMissing {
            missing: vec![0],
            waited: timeout,
        },
        _ => io_error(
            0,
            "joining (the hub refused this process? see its error)",
            error,
        ),
    })?;
    Ok((vec![stream], replicas))
}

impl NodeLink {
    /// Shuts every connection down: whatever waits on it returns with an
    /// error, here and in the other processes. The link stays failed.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        for stream in &self.shutdown {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.abort_tx
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
    }

    /// The rank this process's exchange is waiting for, if one is under way.
    pub fn waiting_on(&self) -> Option<usize> {
        match self.waiting_on.load(Ordering::SeqCst) {
            usize::MAX => None,
            rank => Some(rank),
        }
    }

    /// The group-wide sum of `values` (this process's local sum, the same
    /// on every local replica), for local replica `replica`: the leader
    /// exchanges with the other processes, the others wait for its result.
    /// Every process must call this in the same order with as many values.
    pub fn all_reduce(
        &self,
        replica: usize,
        values: Vec<f32>,
        deadline: Instant,
    ) -> Result<Arc<Vec<f32>>, ElasticError> {
        if replica > 0 {
            let inbox = &self.inboxes[replica - 1];
            let timeout = deadline.saturating_duration_since(Instant::now());
            return select! {
                recv(inbox) -> reduced => match reduced {
                    Ok(Ok(reduced)) => Ok(reduced),
                    Ok(Err(message)) => Err(node_error(self.rank, message)),
                    Err(_) => Err(node_error(self.rank, "the leader replica is gone".into())),
                },
                recv(self.abort_rx) -> _ => Err(node_error(self.rank, "the step was aborted".into())),
                default(timeout) => Err(ElasticError::NodesMissing { missing: vec![self.rank], waited: self.step_timeout }),
            };
        }
        let result = self.exchange(values, deadline);
        let shared = result
            .as_ref()
            .map(Arc::clone)
            .map_err(|error| error.to_string());
        for follower in &self.followers {
            let _ = follower.send(shared.clone());
        }
        result
    }

    fn exchange(&self, values: Vec<f32>, deadline: Instant) -> Result<Arc<Vec<f32>>, ElasticError> {
        let mut links = self
            .streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(why) = &links.broken {
            return Err(node_error(
                self.rank,
                format!(
                    "the link to the other processes failed earlier ({why}); start every process again"
                ),
            ));
        }
        let round = links.round;
        let result = if self.rank == 0 {
            self.hub_exchange(&mut links.streams, values, round, deadline)
        } else {
            self.waiting_on.store(0, Ordering::SeqCst);
            Self::node_exchange(
                &mut links.streams[0],
                values,
                round,
                deadline,
                self.step_timeout,
            )
        };
        let result = result.map_err(|error| {
            if self.aborted.load(Ordering::SeqCst) {
                node_error(
                    self.rank,
                    "the exchange was aborted here (the step failed or passed its deadline)".into(),
                )
            } else {
                error
            }
        });
        match result {
            Ok(reduced) => {
                self.waiting_on.store(usize::MAX, Ordering::SeqCst);
                links.round += 1;
                Ok(Arc::new(reduced))
            }
            Err(error) => {
                links.broken = Some(error.to_string());
                drop(links);
                self.abort();
                Err(error)
            }
        }
    }

    /// Rank 0: reads every rank's values, adds them to its own in rank
    /// order and sends the sum to every rank.
    fn hub_exchange(
        &self,
        streams: &mut [TcpStream],
        mut sum: Vec<f32>,
        round: u64,
        deadline: Instant,
    ) -> Result<Vec<f32>, ElasticError> {
        let mut bytes = Vec::new();
        for (i, stream) in streams.iter_mut().enumerate() {
            let rank = i + 1;
            self.waiting_on.store(rank, Ordering::SeqCst);
            let waited = self.step_timeout;
            bounded_stream(stream, left(deadline, rank, waited)?)
                .map_err(|error| io_error(rank, "setting a deadline", error))?;
            let (their_round, len) = read_u64(stream)
                .and_then(|r| Ok((r, read_u64(stream)? as usize)))
                .map_err(|error| timeout_or(rank, "waiting for its gradients", error, waited))?;
            if their_round != round || len != sum.len() {
                return Err(node_error(
                    rank,
                    format!(
                        "sent exchange {their_round} of {len} values, expected exchange {round} of {}: the processes run different steps or models",
                        sum.len()
                    ),
                ));
            }
            bytes.resize(len * 4, 0);
            stream
                .read_exact(&mut bytes)
                .map_err(|error| timeout_or(rank, "reading its gradients", error, waited))?;
            for (s, chunk) in sum.iter_mut().zip(bytes.chunks_exact(4)) {
                *s += f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
            }
        }
        let message = encode(round, &sum);
        for (i, stream) in streams.iter_mut().enumerate() {
            self.waiting_on.store(i + 1, Ordering::SeqCst);
            let waited = self.step_timeout;
            bounded_stream(stream, left(deadline, i + 1, waited)?)
                .and_then(|()| stream.write_all(&message))
                .map_err(|error| timeout_or(i + 1, "sending the result", error, waited))?;
        }
        Ok(sum)
    }

    /// Ranks `1..`: sends this process's values and reads the result.
    fn node_exchange(
        stream: &mut TcpStream,
        values: Vec<f32>,
        round: u64,
        deadline: Instant,
        waited: Duration,
    ) -> Result<Vec<f32>, ElasticError> {
        bounded_stream(stream, left(deadline, 0, waited)?)
            .and_then(|()| stream.write_all(&encode(round, &values)))
            .map_err(|error| timeout_or(0, "sending gradients to the hub", error, waited))?;
        let (their_round, len) = read_u64(stream)
            .and_then(|r| Ok((r, read_u64(stream)? as usize)))
            .map_err(|error| timeout_or(0, "waiting for the hub's result", error, waited))?;
        if their_round != round || len != values.len() {
            return Err(node_error(
                0,
                format!(
                    "the hub answered exchange {their_round} of {len} values, expected exchange {round} of {}",
                    values.len()
                ),
            ));
        }
        let mut bytes = vec![0; len * 4];
        stream
            .read_exact(&mut bytes)
            .map_err(|error| timeout_or(0, "reading the hub's result", error, waited))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

/// A timeout is the other process missing the step; anything else is its failure.
fn timeout_or(node: usize, doing: &str, error: std::io::Error, waited: Duration) -> ElasticError {
    match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ElasticError::NodesMissing {
            missing: vec![node],
            waited,
        },
        _ => io_error(node, doing, error),
    }
}

/// One exchange message: round, length, little-endian values.
fn encode(round: u64, values: &[f32]) -> Vec<u8> {
    let mut message = Vec::with_capacity(16 + 4 * values.len());
    message.extend_from_slice(&round.to_le_bytes());
    message.extend_from_slice(&(values.len() as u64).to_le_bytes());
    for value in values {
        message.extend_from_slice(&value.to_le_bytes());
    }
    message
}

/// The group-wide sum of the gradients of `module`'s parameters (this
/// process's sum in `grads`), flattened into one message per stage, for
/// local replica `replica`.
pub(crate) fn all_reduce_gradients<AB, M>(
    link: &NodeLink,
    replica: usize,
    module: &M,
    mut grads: GradientsParams,
    deadline: Instant,
) -> Result<GradientsParams, ElasticError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let (slots, flat) = crate::collective::flatten::<AB, M>(module, &mut grads);
    if flat.is_empty() {
        // Nothing trains here; the exchange still runs to keep every process
        // in step.
        link.all_reduce(replica, Vec::new(), deadline)?;
        return Ok(grads);
    }
    let flat = Tensor::cat(flat, 0);
    let (device, dtype) = (flat.device(), flat.dtype());
    let values = flat
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|error| node_error(link.rank, format!("reading gradients: {error:?}")))?;
    let len = values.len();
    let reduced = link.all_reduce(replica, values, deadline)?;
    let data = TensorData::new(reduced.as_ref().clone(), [len]).convert_dtype(dtype);
    let flat = Tensor::<AB::InnerBackend, 1>::from_data(data, &device);
    crate::collective::unflatten::<AB, M>(module, &mut grads, slots, flat);
    Ok(grads)
}
