//! A TCP fault proxy between lock clients and a `redis-server`.
//!
//! Clients connect to [`Proxy::url`]; every connection is relayed to the upstream server, and
//! the test injects faults into the relay on command, while traffic flows:
//!
//! - [`set_latency`](Proxy::set_latency): every chunk is delivered this much later, in each
//!   direction (so a round trip gains twice the latency). Order is kept.
//! - [`blackhole`](Proxy::blackhole): nothing is delivered in either direction, new
//!   connections included, until [`heal`](Proxy::heal); what was sent meanwhile is then
//!   delivered late and in order, like TCP after a healed partition.
//! - [`drop_replies`](Proxy::drop_replies): requests still reach the server, but its replies are
//!   discarded: commands run, their callers never learn it. A byte stream that lost bytes can
//!   never be resynchronised, so every connection that lost a reply delivers nothing more and is
//!   reset by [`heal`](Proxy::heal), as a real connection that lost data would break.
//! - [`reset_all`](Proxy::reset_all): every open connection is closed with a TCP RST at once.
//! - [`partition`](Proxy::partition): a black hole for the connections from some source
//!   addresses only, while everyone else's traffic flows. Linux routes all of `127.0.0.0/8` to
//!   the loopback interface, so a peer that connects from its own loopback address (redis'
//!   `bind-source-addr`, for replication and sentinel links) can be told apart from the others,
//!   which connect from `127.0.0.1`: a network partition between some servers, in one process.
//! - [`hold_requests_from`](Proxy::hold_requests_from): a connection's requests are held from
//!   the first chunk that holds a pattern (a command, say) until
//!   [`release_requests`](Proxy::release_requests), then delivered in order: one command
//!   delayed at a chosen step, with everything its client sends after it.
//!
//! The proxy runs on its own thread and Tokio runtime, so it keeps relaying whatever the test's
//! runtime does, and works from synchronous tests as well as async ones.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

/// The faults currently applied to every connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added to every chunk, in each direction.
    pub latency: Duration,
    /// Deliver nothing until healed.
    pub blackhole: bool,
    /// Forward requests, discard replies.
    pub drop_replies: bool,
}

#[derive(Clone, Debug, Default)]
struct Control {
    faults: Faults,
    /// Source addresses whose connections are black-holed (see [`Proxy::partition`]).
    partitioned: Vec<IpAddr>,
    /// Requests are held on each connection from the first chunk holding this pattern.
    hold_from: Option<Vec<u8>>,
    /// Bumped by `reset_all`: every connection older than the bump is reset.
    reset_epoch: u64,
    stop: bool,
}

impl Control {
    /// Whether traffic of a connection from `peer` is held back now.
    fn holds(&self, peer: IpAddr) -> bool {
        self.faults.blackhole || self.partitioned.contains(&peer)
    }
}

/// Counters of what the proxy did, for test assertions and the suite's summary.
#[derive(Debug, Default)]
pub struct ProxyStats {
    accepted: AtomicU64,
    replies_dropped: AtomicU64,
    resets: AtomicU64,
    dropped_event: Notify,
    /// What the connections' held requests hold, since the hold was set.
    held: std::sync::Mutex<Vec<u8>>,
    held_event: Notify,
}

impl ProxyStats {
    /// How many times the held requests hold `pattern` now.
    pub fn held_count(&self, pattern: &[u8]) -> usize {
        let held = self.held.lock().unwrap();
        held.windows(pattern.len())
            .filter(|w| *w == pattern)
            .count()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Reply chunks discarded under [`Proxy::drop_replies`].
    pub fn replies_dropped(&self) -> u64 {
        self.replies_dropped.load(Ordering::SeqCst)
    }

    /// Connections closed with a reset (by `reset_all`, or by `heal` after dropped replies).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }
}

/// A running fault proxy; stops (resetting every connection) on drop.
pub struct Proxy {
    port: u16,
    upstream: SocketAddr,
    control: watch::Sender<Control>,
    stats: Arc<ProxyStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("upstream", &self.upstream)
            .field("faults", &self.faults())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Starts relaying a free loopback port to `127.0.0.1:<upstream_port>`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start(upstream_port: u16) -> Self {
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_port));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("proxy address").port();
        let (control, control_rx) = watch::channel(Control::default());
        let stats = Arc::new(ProxyStats::default());
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(accept_loop(listener, upstream, control_rx, thread_stats));
            })
            .expect("spawn the proxy thread");
        Self {
            port,
            upstream,
            control,
            stats,
            thread: Some(thread),
        }
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port clients connect to.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the proxy did so far.
    #[must_use]
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }

    /// The faults in force now.
    #[must_use]
    pub fn faults(&self) -> Faults {
        self.control.borrow().faults
    }

    /// Adds `one_way` to every chunk in each direction (zero removes it).
    pub fn set_latency(&self, one_way: Duration) {
        self.control.send_modify(|c| c.faults.latency = one_way);
    }

    /// Stops delivering anything, in both directions, until [`heal`](Self::heal).
    pub fn blackhole(&self) {
        self.control.send_modify(|c| c.faults.blackhole = true);
    }

    /// Lets requests through but discards replies until [`heal`](Self::heal), which then resets
    /// every connection that lost a reply.
    pub fn drop_replies(&self) {
        self.control.send_modify(|c| c.faults.drop_replies = true);
    }

    /// Black-holes, in both directions, every connection whose client connects from one of
    /// `peers` (those open now and new ones) until [`heal`](Self::heal); connections from other
    /// addresses flow as before. What was sent meanwhile is held, as by
    /// [`blackhole`](Self::blackhole).
    pub fn partition(&self, peers: &[IpAddr]) {
        self.control.send_modify(|c| c.partitioned = peers.to_vec());
    }

    /// Removes every fault: held traffic is delivered, connections that lost replies are reset.
    pub fn heal(&self) {
        self.control.send_modify(|c| {
            c.faults = Faults::default();
            c.partitioned.clear();
        });
    }

    /// Holds each connection's requests from the first chunk that holds `pattern` (the chunk
    /// included) until [`release_requests`](Self::release_requests); replies flow meanwhile.
    pub fn hold_requests_from(&self, pattern: &[u8]) {
        self.stats.held.lock().unwrap().clear();
        self.control
            .send_modify(|c| c.hold_from = Some(pattern.to_vec()));
    }

    /// Delivers the held requests, in order, and holds no more.
    pub fn release_requests(&self) {
        self.control.send_modify(|c| c.hold_from = None);
    }

    /// Resolves once the held requests hold `pattern` at least `count` times.
    pub async fn held_at_least(&self, pattern: &[u8], count: usize) {
        loop {
            let notified = self.stats.held_event.notified();
            let held = {
                let held = self.stats.held.lock().unwrap();
                held.windows(pattern.len())
                    .filter(|w| *w == pattern)
                    .count()
            };
            if held >= count {
                return;
            }
            notified.await;
        }
    }

    /// Closes every open connection with a TCP reset.
    pub fn reset_all(&self) {
        self.control.send_modify(|c| c.reset_epoch += 1);
    }

    /// Resolves once at least `count` reply chunks were dropped in total.
    pub async fn replies_dropped_at_least(&self, count: u64) {
        loop {
            let notified = self.stats.dropped_event.notified();
            if self.stats.replies_dropped() >= count {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.control.send_modify(|c| c.stop = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    mut control: watch::Receiver<Control>,
    stats: Arc<ProxyStats>,
) {
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, peer)) = accepted else { continue };
                stats.accepted.fetch_add(1, Ordering::SeqCst);
                connections.spawn(relay(client, peer.ip(), upstream, control.clone(), stats.clone()));
            }
            changed = control.changed() => {
                if changed.is_err() || control.borrow().stop {
                    // Dropping the set aborts every relay; their sockets close.
                    return;
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

async fn relay(
    mut client: TcpStream,
    peer: IpAddr,
    upstream: SocketAddr,
    control: watch::Receiver<Control>,
    stats: Arc<ProxyStats>,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        // The server is down: the client sees its connection reset, as with a closed port.
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let epoch = control.borrow().reset_epoch;
    let poisoned = AtomicBool::new(false);
    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            () = pump(client_read, server_write, Direction::Request, peer, control.clone(), &poisoned, &stats) => false,
            () = pump(server_read, client_write, Direction::Reply, peer, control.clone(), &poisoned, &stats) => false,
            () = reset_requested(control, epoch, &poisoned) => true,
        }
    };
    if reset {
        stats.resets.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Resolves when this connection must be reset: `reset_all`, or healed after losing replies.
async fn reset_requested(mut control: watch::Receiver<Control>, epoch: u64, poisoned: &AtomicBool) {
    loop {
        {
            let c = control.borrow_and_update();
            if c.reset_epoch != epoch || (!c.faults.drop_replies && poisoned.load(Ordering::SeqCst))
            {
                return;
            }
        }
        if control.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Relays one direction of a connection from `peer`: a reader that timestamps chunks and a
/// writer that delivers them when due and not held back. Ends when the source closed and
/// everything was delivered, or the destination failed.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    direction: Direction,
    peer: IpAddr,
    control: watch::Receiver<Control>,
    poisoned: &AtomicBool,
    stats: &ProxyStats,
) {
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer_control = control.clone();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let faults = control.borrow().faults;
            if direction == Direction::Reply
                && (faults.drop_replies || poisoned.load(Ordering::SeqCst))
            {
                poisoned.store(true, Ordering::SeqCst);
                stats.replies_dropped.fetch_add(1, Ordering::SeqCst);
                stats.dropped_event.notify_waiters();
                continue;
            }
            if queue
                .send((Instant::now() + faults.latency, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let write = async move {
        let mut held = std::collections::VecDeque::new();
        loop {
            let (at, bytes) = match held.pop_front() {
                Some(chunk) => chunk,
                None => match due.recv().await {
                    Some(chunk) => chunk,
                    None => return,
                },
            };
            tokio::time::sleep_until(at).await;
            let pattern = writer_control.borrow().hold_from.clone();
            if let (Direction::Request, Some(p)) = (direction, pattern) {
                if held.is_empty() && bytes.windows(p.len()).any(|w| w == p.as_slice()) {
                    // Held, with everything that follows it, until released.
                    stats.held.lock().unwrap().extend_from_slice(&bytes);
                    stats.held_event.notify_waiters();
                    held.push_back((at, bytes));
                    loop {
                        tokio::select! {
                            released = writer_control.wait_for(|c| c.hold_from.is_none()) => {
                                if released.is_err() {
                                    return;
                                }
                                break;
                            }
                            next = due.recv() => {
                                let Some(next) = next else { return };
                                stats.held.lock().unwrap().extend_from_slice(&next.1);
                                stats.held_event.notify_waiters();
                                held.push_back(next);
                            }
                        }
                    }
                    continue;
                }
            }
            if writer_control.wait_for(|c| !c.holds(peer)).await.is_err() {
                return;
            }
            if direction == Direction::Reply && poisoned.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(read, write);
}
