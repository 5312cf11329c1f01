//! CPU time spent by the service and by Postgres, for a cost per call that a busy shared machine
//! distorts less than a rate: on two cores shared with other work, calls/s says how much CPU the
//! run was given; CPU per call says what a call costs.
use std::time::Duration;

/// Name of the service runtime's threads (workers and blocking threads), so that their CPU time
/// can be told from the load generator's.
pub const SERVICE_THREADS: &str = "toolexec-svc";

/// Clock ticks per second of `/proc` times (`USER_HZ`; 100 on every Linux the bench runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime (ticks) of a `/proc/.../stat` line: fields 14 and 15, counted after the
/// parenthesised command name, which may hold spaces.
fn ticks(stat: &str) -> Option<(String, u64)> {
    ticks_of(stat, 2)
}

/// The name and the sum of the first `count` time fields from utime on (2: utime and stime;
/// 4: with cutime and cstime, the children it waited for).
fn ticks_of(stat: &str, count: usize) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat[open + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let mut total = 0;
    for field in fields.get(11..11 + count)? {
        total += field.parse::<u64>().ok()?;
    }
    Some((name, total))
}

/// CPU time so far of another process and of the children it waited for (0 once it is gone).
pub fn process_and_children(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    to_duration(ticks_of(&stat, 4).map_or(0, |(_, t)| t))
}

/// CPU time so far of this process's threads named [`SERVICE_THREADS`], and of its other threads
/// (the load generator, the baseline's pool).
pub fn this_process() -> (Duration, Duration) {
    let mut service = 0;
    let mut other = 0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            if let Some((name, t)) = ticks(&stat) {
                if name.starts_with(SERVICE_THREADS) {
                    service += t;
                } else {
                    other += t;
                }
            }
        }
    }
    (to_duration(service), to_duration(other))
}

/// CPU time so far of the Postgres backends connected to `database` (found by their process
/// title, `postgres: … <user> <database> …`). Backends that ended meanwhile are not counted,
/// so the pools must stay open across a measurement.
pub fn postgres_backends(database: &str) -> Duration {
    let mut total = 0;
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if !cmdline.starts_with("postgres:")
                || !cmdline.split_whitespace().any(|w| w == database)
            {
                continue;
            }
            if let Some((_, t)) = std::fs::read_to_string(p.path().join("stat"))
                .ok()
                .as_deref()
                .and_then(ticks)
            {
                total += t;
            }
        }
    }
    to_duration(total)
}

fn to_duration(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND)
}

/// CPU used between two readings.
#[derive(Clone, Copy)]
pub struct Sample {
    pub service: Duration,
    pub other: Duration,
    pub postgres: Duration,
}

impl Sample {
    pub fn now(database: &str) -> Self {
        let (service, other) = this_process();
        Self {
            service,
            other,
            postgres: postgres_backends(database),
        }
    }

    pub fn since(self, before: Sample) -> Sample {
        Sample {
            service: self.service.saturating_sub(before.service),
            other: self.other.saturating_sub(before.other),
            postgres: self.postgres.saturating_sub(before.postgres),
        }
    }

    /// Microseconds per operation of each part.
    pub fn per_op(self, ops: u64) -> (f64, f64, f64) {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / ops.max(1) as f64;
        (us(self.service), us(self.other), us(self.postgres))
    }
}
