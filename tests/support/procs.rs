//! The host's view of processes, for tests that check what a sandboxed command leaves behind:
//! sandboxed processes live in PID namespaces beneath the test's, so the host's `/proc` sees
//! them all.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A `sleep` duration unique to this test process: `<base>.<pid><n>` (GNU sleep takes
/// fractions), so that host-side process scans of parallel tests do not see each other's.
pub fn sleep_arg(base: u32) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{base}.{}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Host pids whose command line (arguments joined by spaces) contains `token`. Every process of
/// the host's `/proc` is looked at (sandboxed ones too: their PID namespaces are beneath ours),
/// whatever its user or state; only processes whose command line cannot be read (gone meanwhile,
/// kernel threads) are not matched.
pub fn host_processes_matching(token: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline: String = String::from_utf8_lossy(&raw)
            .trim_end_matches('\0')
            .replace('\0', " ");
        if cmdline.contains(token) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

/// What the host knows of a process, for failure messages.
pub fn describe_host_process(pid: i32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let fields: Vec<&str> = status
        .lines()
        .filter(|l| {
            ["State:", "PPid:", "Uid:", "NSpid:"]
                .iter()
                .any(|f| l.starts_with(f))
        })
        .collect();
    format!("pid {pid} [{}] {cmdline}", fields.join("; "))
}

pub fn describe_all(pids: &[i32]) -> String {
    pids.iter()
        .map(|p| describe_host_process(*p))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits (up to `limit`) until no host process matches `token`; returns those still there.
pub async fn wait_gone(token: &str, limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let left = host_processes_matching(token);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that no host process matches `token` within ~3 s (kills are asynchronous).
pub async fn assert_no_host_process(token: &str, context: &str) {
    let left = wait_gone(token, Duration::from_secs(3)).await;
    assert!(
        left.is_empty(),
        "{context}: processes matching {token:?} still run on the host 3 s later:\n{}",
        describe_all(&left)
    );
}

/// Waits (up to 5 s) for the host process `sleep <arg>` itself; its pid.
pub async fn wait_for_sleep(arg: &str) -> Option<i32> {
    let want = format!("sleep\0{arg}\0");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = host_processes_matching(&format!("sleep {arg}"))
            .into_iter()
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want.as_bytes())
            });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
