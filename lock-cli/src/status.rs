//! The exit statuses `lockctl run` gives of itself; otherwise it exits with CMD's status (128 +
//! the signal's number when a signal ended CMD, as shells do).

/// A bad option: the library refused the key or the options (as clap's usage errors).
pub const USAGE: u8 = 2;
/// The job stopped to read from the terminal (or to change its settings), which it cannot
/// do under `lockctl run`: it was ended and the lock released (sysexits' `EX_NOINPUT`).
pub const TERMINAL: u8 = 66;
/// Redis could not be reached, or refused a command: CMD did not run (sysexits'
/// `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// The lock was held by another holder until `--wait` ran out: CMD did not run (sysexits'
/// `EX_TEMPFAIL`, "try again later": what a cron job on another machine sees).
pub const BUSY: u8 = 75;
/// The lease was lost while the job ran: its processes were sent SIGTERM, then SIGKILL
/// after `--grace` (or the job had ended, but only after the loss).
pub const LOST: u8 = 79;
/// CMD exists but could not be run (as shells say it).
pub const CANNOT_EXECUTE: u8 = 126;
/// CMD was not found (as shells say it).
pub const NOT_FOUND: u8 = 127;
