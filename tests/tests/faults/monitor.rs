//! The server's own account of what it executed: `MONITOR`, read on a direct connection that
//! bypasses the fault proxy.
//!
//! Redis prints every command with its wall-clock execution time, and the commands a Lua script
//! runs (`[0 lua]`) right after the `EVALSHA` that started it. That is enough to rebuild, after
//! the run, who held each lock on the server and until when (see `model.rs`), without asking
//! the server anything while faults are in force.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::support::now_us;

/// One executed command.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Server wall-clock time, µs since the epoch.
    pub at_us: i64,
    /// Run by a script (`[0 lua]`), not sent by a client.
    pub lua: bool,
    /// The port at the other end of the sending connection (`[0 127.0.0.1:<port>]`): for a
    /// replica, its master's port on the commands the master replicates to it.
    pub peer_port: Option<u16>,
    /// The command name (as sent) and its arguments.
    pub args: Vec<Vec<u8>>,
}

impl Entry {
    pub fn name(&self) -> String {
        String::from_utf8_lossy(&self.args[0]).to_ascii_uppercase()
    }

    pub fn arg(&self, i: usize) -> &[u8] {
        self.args.get(i).map_or(&[], Vec::as_slice)
    }

    pub fn arg_str(&self, i: usize) -> String {
        String::from_utf8_lossy(self.arg(i)).into_owned()
    }
}

#[derive(Clone, Debug)]
pub enum Event {
    Command(Entry),
    /// The connection to the server broke (it was killed): what it held is gone.
    Lost {
        at_us: i64,
    },
    /// The connection broke from `from_us` until `to_us` while the server ran on (the same
    /// `run_id` answered at once): a Sentinel promoting a replica runs `CLIENT KILL TYPE normal`
    /// on it, which closes `MONITOR` connections too. The server kept its data; what it ran in
    /// between is not in the history.
    Gap {
        from_us: i64,
        to_us: i64,
    },
}

/// Captures `MONITOR` output from a server until dropped; reconnects at once after a dropped
/// connection, and after a restart.
pub struct Monitor {
    port: u16,
    events: Arc<Mutex<Vec<Event>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock(events: &Mutex<Vec<Event>>) -> std::sync::MutexGuard<'_, Vec<Event>> {
    events.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Monitor {
    /// Starts monitoring `127.0.0.1:<port>`; returns once the server confirmed `MONITOR`.
    pub fn start(port: u16) -> Self {
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let first = connect(port).expect("MONITOR connection");
        let thread = {
            let (events, stop) = (events.clone(), stop.clone());
            std::thread::spawn(move || run(port, first, &events, &stop))
        };
        Self {
            port,
            events,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until everything the server executed before this call was captured: sends a
    /// marker command and returns once it shows up. A marker that fell in a gap (the
    /// connection being made again) never shows: another is sent after a while.
    pub fn sync(&self) {
        let mut con = lock_tests::connection(&format!("redis://127.0.0.1:{}/", self.port));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let marker = format!("monitor-sync-{}", now_us());
            let _: String = redis::cmd("ECHO")
                .arg(&marker)
                .query(&mut con)
                .expect("ECHO");
            let again = std::time::Instant::now() + Duration::from_secs(1);
            while std::time::Instant::now() < again {
                let seen = lock(&self.events).iter().rev().any(|e| {
                    matches!(e, Event::Command(c) if c.name() == "ECHO" && c.arg(1) == marker.as_bytes())
                });
                if seen {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "MONITOR did not show the marker within 20 s"
            );
        }
    }

    /// The port of the server it watches.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything captured so far.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a [`Pulse`] sends: `ECHO` of this.
pub const PULSE: &[u8] = b"pulse";
/// How often a [`Pulse`] is due.
pub const PULSE_PERIOD: Duration = Duration::from_millis(10);

/// An `ECHO` [`PULSE`] sent to a server every [`PULSE_PERIOD`] on a direct connection, so that
/// its `MONITOR` history shows when it ran nothing: a pulse that runs late shows the server, or
/// this test process, kept off the CPU (or the server down) since it was due. The workers'
/// heartbeats show their own stalls; this one shows the rest of the path.
pub struct Pulse {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pulse {
    pub fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let url = format!("redis://127.0.0.1:{port}/");
                let mut con: Option<redis::Connection> = None;
                while !stop.load(Ordering::SeqCst) {
                    // A server down, or being restarted: tried again at the next pulse.
                    if con.is_none() {
                        con = redis::Client::open(url.as_str()).ok().and_then(|c| {
                            c.get_connection_with_timeout(Duration::from_millis(100))
                                .ok()
                        });
                    }
                    if let Some(c) = &mut con {
                        let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
                        let sent: redis::RedisResult<Vec<u8>> =
                            redis::cmd("ECHO").arg(PULSE).query(c);
                        if sent.is_err() {
                            con = None;
                        }
                    }
                    std::thread::sleep(PULSE_PERIOD);
                }
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `MONITOR` connection, and the `run_id` of the server process it reached.
struct Connection {
    reader: BufReader<TcpStream>,
    run_id: String,
}

fn connect(port: u16) -> std::io::Result<Connection> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    stream.write_all(b"INFO server\r\nMONITOR\r\n")?;
    let mut reader = BufReader::new(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // `INFO` answers with one bulk string: its length line, then the text.
    let length = read_line(&mut reader, deadline)?;
    let length: usize = String::from_utf8_lossy(&length)
        .trim()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "INFO refused: {}",
                String::from_utf8_lossy(&length)
            ))
        })?;
    let mut info = Vec::new();
    while info.len() < length + 2 {
        info.extend(read_line(&mut reader, deadline)?);
    }
    let run_id = String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(str::to_owned)
        .ok_or_else(|| std::io::Error::other("INFO server without a run_id"))?;
    let ok = read_line(&mut reader, deadline)?;
    if ok.starts_with(b"+OK") {
        Ok(Connection { reader, run_id })
    } else {
        Err(std::io::Error::other(format!(
            "MONITOR refused: {}",
            String::from_utf8_lossy(&ok)
        )))
    }
}

/// One line of a reply, `\n` included, waiting until `deadline` for it.
fn read_line(
    reader: &mut BufReader<TcpStream>,
    deadline: std::time::Instant,
) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if line.ends_with(b"\n") => return Ok(line),
            Ok(_) => {}
            Err(e) if is_timeout(&e) && std::time::Instant::now() < deadline => {}
            Err(e) => return Err(e),
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn run(port: u16, first: Connection, events: &Mutex<Vec<Event>>, stop: &AtomicBool) {
    let mut run_id = first.run_id.clone();
    let mut reader = Some(first.reader);
    let mut line = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let Some(r) = reader.as_mut() else {
            // The server is down; it comes back on the same port after a restart.
            std::thread::sleep(Duration::from_millis(20));
            if let Ok(c) = connect(port) {
                run_id = c.run_id;
                reader = Some(c.reader);
            }
            continue;
        };
        let broke = match r.read_until(b'\n', &mut line) {
            Ok(0) => true,
            Ok(_) if line.ends_with(b"\n") => {
                if let Some(entry) = parse_line(&line) {
                    lock(events).push(Event::Command(entry));
                }
                line.clear();
                false
            }
            Ok(_) => false,
            Err(e) if is_timeout(&e) => false,
            Err(_) => true,
        };
        if broke {
            let from_us = now_us();
            line.clear();
            // Told apart at once: a killed server refuses the connection, a restarted one
            // answers with another run_id.
            reader = match connect(port) {
                Ok(c) if c.run_id == run_id => {
                    lock(events).push(Event::Gap {
                        from_us,
                        to_us: now_us(),
                    });
                    Some(c.reader)
                }
                Ok(c) => {
                    lock(events).push(Event::Lost { at_us: from_us });
                    run_id = c.run_id;
                    Some(c.reader)
                }
                Err(_) => {
                    lock(events).push(Event::Lost { at_us: from_us });
                    None
                }
            };
        }
    }
}

/// `+1795371742.252358 [0 127.0.0.1:56176] "SET" "k" "v"` (values escaped as by `sdscatrepr`).
pub fn parse_line(line: &[u8]) -> Option<Entry> {
    let line = line.strip_prefix(b"+")?;
    let line = line
        .strip_suffix(b"\r\n")
        .or_else(|| line.strip_suffix(b"\n"))?;
    let space = line.iter().position(|&b| b == b' ')?;
    let (ts, rest) = line.split_at(space);
    let ts = std::str::from_utf8(ts).ok()?;
    let (secs, micros) = ts.split_once('.')?;
    let at_us = secs.parse::<i64>().ok()? * 1_000_000 + micros.parse::<i64>().ok()?;
    let rest = rest.strip_prefix(b" [")?;
    let close = rest.iter().position(|&b| b == b']')?;
    let source = &rest[..close];
    let lua = source.ends_with(b" lua");
    let peer_port = std::str::from_utf8(source)
        .ok()
        .and_then(|s| s.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok());
    let mut args = Vec::new();
    let mut i = close + 1;
    while i < rest.len() {
        match rest[i] {
            b' ' => i += 1,
            b'"' => {
                let mut arg = Vec::new();
                i += 1;
                loop {
                    let b = *rest.get(i)?;
                    match b {
                        b'"' => {
                            i += 1;
                            break;
                        }
                        b'\\' => {
                            let e = *rest.get(i + 1)?;
                            i += 2;
                            arg.push(match e {
                                b'n' => b'\n',
                                b'r' => b'\r',
                                b't' => b'\t',
                                b'a' => 7,
                                b'b' => 8,
                                b'x' => {
                                    let hex = std::str::from_utf8(rest.get(i..i + 2)?).ok()?;
                                    i += 2;
                                    u8::from_str_radix(hex, 16).ok()?
                                }
                                other => other,
                            });
                        }
                        _ => {
                            arg.push(b);
                            i += 1;
                        }
                    }
                }
                args.push(arg);
            }
            _ => return None,
        }
    }
    (!args.is_empty()).then_some(Entry {
        at_us,
        lua,
        peer_port,
        args,
    })
}

#[test]
fn monitor_lines_are_parsed_with_redis_escapes() {
    let e = parse_line(
        b"+1795371742.252462 [0 lua] \"SET\" \"lock:a\\\"b\\n\\x01\" \"tok\" \"NX\" \"PX\" \"1000\"\r\n",
    )
    .unwrap();
    assert!(e.lua);
    assert_eq!(e.at_us, 1_795_371_742_252_462);
    assert_eq!(e.name(), "SET");
    assert_eq!(e.arg(1), b"lock:a\"b\n\x01");
    assert_eq!(e.arg_str(5), "1000");
    let c = parse_line(b"+1.000001 [0 127.0.0.1:5] \"evalsha\" \"ab\" \"0\"\r\n").unwrap();
    assert!(!c.lua);
    assert_eq!(c.at_us, 1_000_001);
    assert_eq!(c.peer_port, Some(5));
    assert_eq!(e.peer_port, None);
}

/// A Sentinel promoting a replica closes every normal client's connection on it, `MONITOR`'s
/// included, and the server runs on: a gap in its history, not a loss.
#[test]
fn a_closed_monitor_connection_is_a_gap_on_a_live_server_and_a_loss_on_a_restarted_one() {
    let mut server = lock_tests::RedisServer::start();
    let monitor = Monitor::start(server.port());
    let mut con = server.connection();
    let closed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut con)
        .expect("CLIENT KILL");
    assert_eq!(closed, 1, "the MONITOR connection, not the caller's");
    monitor.sync();
    let breaks = |events: &[Event]| -> Vec<&'static str> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Gap { from_us, to_us } => {
                    assert!(from_us <= to_us);
                    Some("gap")
                }
                Event::Lost { .. } => Some("lost"),
                Event::Command(_) => None,
            })
            .collect()
    };
    assert_eq!(breaks(&monitor.events()), ["gap"]);
    server.restart();
    monitor.sync();
    assert_eq!(breaks(&monitor.events()), ["gap", "lost"]);
}
