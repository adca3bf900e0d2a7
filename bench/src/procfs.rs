//! What /proc says about this process and this machine: CPU time, load, kernel, CPU model.

use std::time::Duration;

/// The 1, 5 and 15 minute load averages, as printed by `uptime`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// CPU time of the calling thread, in nanoseconds (`/proc/thread-self/schedstat`).
pub fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// User + system CPU time of the whole process, threads that already exited included
/// (`/proc/self/stat`, in clock ticks of 10 ms).
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 1000 / clock_ticks())
}

fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .filter(|&t: &u64| t > 0)
            .unwrap_or(100)
    })
}

/// `uname -sr`, for the results header.
pub fn kernel() -> String {
    let read = |f: &str| std::fs::read_to_string(f).map(|s| s.trim().to_owned());
    match (
        read("/proc/sys/kernel/ostype"),
        read("/proc/sys/kernel/osrelease"),
    ) {
        (Ok(os), Ok(release)) => format!("{os} {release}"),
        _ => "unknown".to_owned(),
    }
}

/// The model name of the first CPU.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

/// Voluntary context switches (a thread parking: each is a wake-up later) of every thread of
/// process `pid`, summed by thread name (`/proc/<pid>/task/*/status`).
pub fn parkings_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let (Some(name), Some(switches)) = (field("Name:"), field("voluntary_ctxt_switches:"))
        else {
            continue;
        };
        *by_name.entry(name).or_default() += switches.parse::<u64>().unwrap_or(0);
    }
    by_name
}
