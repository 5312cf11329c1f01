//! Issue 24's scale case: 16 terminals in each of 100 sessions, counted from the host —
//! processes, memory, the service's descriptors, PTYs — and closing the sessions gives all of it
//! back.
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app_with};

const SESSIONS: usize = 100;
const TERMINALS: usize = 16;
/// Sessions set up (or closed) at once.
const AT_ONCE: usize = 25;

/// Host pids in a cgroup whose v2 path contains `needle`.
fn host_pids_in_cgroups(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
                c.lines()
                    .any(|l| l.starts_with("0::") && l.contains(needle))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// `starttime` of `/proc/<pid>/stat`: with the pid, names one process even if the pid is reused.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)
        .map(str::to_owned)
}

/// Whether a process's controlling terminal is a pseudo-terminal (`tty_nr` of its stat, Unix98
/// PTY majors 136–143).
fn has_pty(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let tty: i64 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(4)?
                .parse()
                .ok()?;
            Some((136..=143).contains(&((tty >> 8) & 0xfff)))
        })
        .unwrap_or(false)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Proportional memory of a process, KiB (`Pss:` of its `smaps_rollup`).
fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `VmRSS` of this process (the service runs in it), KiB.
fn own_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fds_of(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// PTYs in use on the host, every devpts instance included (the kernel's count).
fn ptys_in_use() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pty/nr")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Makes a session and opens its 16 terminals (`cat`, every other one with a PTY) in one
/// batch; its id.
async fn session_with_terminals(app: &TestApp, n: usize) -> String {
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let calls: Vec<Value> = (0..TERMINALS)
        .map(|i| {
            json!({"id": format!("t{i}"), "name": "exec_command",
                "arguments": {"cmd": "exec cat", "tty": i % 2 == 0, "yield_time_ms": 250}})
        })
        .collect();
    let results = app.calls(&sid, json!(calls)).await;
    for r in &results {
        assert!(
            r["content"]
                .as_str()
                .is_some_and(|c| c.contains("Process running with session ID")),
            "session {n}: {r}"
        );
    }
    sid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_terminals_in_each_of_a_hundred_sessions_are_bounded_and_given_back() {
    // The tenant's process limit (256 by default) would stop at 256 terminals.
    let app = std::sync::Arc::new(
        spawn_app_with(|c| c.limits.max_processes_per_tenant = SESSIONS * (TERMINALS + 4)).await,
    );
    let me = std::process::id().to_string();
    let (fds_before, rss_before, ptys_before) = (fds_of(&me), own_rss_kib(), ptys_in_use());
    let t0 = Instant::now();
    let mut sids = Vec::new();
    for chunk in 0..SESSIONS / AT_ONCE {
        let tasks: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                let app = app.clone();
                tokio::spawn(async move { session_with_terminals(&app, chunk * AT_ONCE + i).await })
            })
            .collect();
        for t in tasks {
            sids.push(t.await.unwrap());
        }
    }
    let opened = t0.elapsed();
    let (fds_open, rss_open, ptys_open) = (fds_of(&me), own_rss_kib(), ptys_in_use());
    // From the host: each session's sandbox is its outer init, its agent, a spare for the next
    // command and the 16 programs; their memory, and their descriptors.
    let mut procs = Vec::new();
    let mut pss = 0u64;
    for sid in &sids {
        let pids = host_pids_in_cgroups(&format!("/s-{sid}."));
        let cats: Vec<i32> = pids.iter().copied().filter(|p| comm(*p) == "cat").collect();
        assert_eq!(cats.len(), TERMINALS, "session {sid}: {pids:?}");
        // Every other one in a PTY, its controlling terminal.
        let in_pty = cats.iter().filter(|p| has_pty(**p)).count();
        assert_eq!(in_pty, TERMINALS / 2, "session {sid}: {cats:?}");
        assert_eq!(pids.len(), TERMINALS + 3, "session {sid}: {pids:?}");
        for pid in &pids {
            pss += pss_kib(*pid);
            let fds = fds_of(&pid.to_string());
            assert!(
                fds <= 6,
                "pid {pid} of session {sid} holds {fds} descriptors"
            );
        }
        procs.extend(pids.iter().map(|p| (*p, start_time(*p))));
    }
    let terminals = (SESSIONS * TERMINALS) as u64;
    let service_kib = rss_open.saturating_sub(rss_before);
    eprintln!(
        "{SESSIONS} sessions x {TERMINALS} terminals opened in {opened:?}: {} sandbox processes, \
         their PSS {} MiB ({} KiB per terminal, the sandboxes' own processes included); service \
         RSS {rss_before} -> {rss_open} KiB (+{} KiB per terminal); service descriptors \
         {fds_before} -> {fds_open}; host PTYs in use {ptys_before} -> {ptys_open}",
        procs.len(),
        pss / 1024,
        pss / terminals,
        service_kib / terminals,
    );
    // The kernel counts the sandboxes' PTYs (other tests of the run may open and close their
    // own meanwhile: the count is the host's).
    assert!(
        ptys_open >= terminals / 2,
        "host PTYs {ptys_before} -> {ptys_open}"
    );
    // Memory: everything of the sandboxes (the programs, and each session's init, agent and
    // spare shared out over its 16 terminals) and the service's growth (its tables, buffers,
    // the sessions' runtimes, the HTTP and database work of 1,700 calls).
    assert!(
        pss / terminals <= 512,
        "{} KiB of sandbox memory per terminal",
        pss / terminals
    );
    assert!(
        service_kib / terminals <= 256,
        "{} KiB of service memory per terminal",
        service_kib / terminals
    );
    // Descriptors: a PTY's master or a terminal's two pipe ends, and a few per session.
    assert!(
        fds_open <= fds_before + 2 * SESSIONS * TERMINALS + 5 * SESSIONS,
        "service descriptors {fds_before} -> {fds_open}"
    );

    let t1 = Instant::now();
    for chunk in sids.chunks(AT_ONCE) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|sid| {
                let (app, sid) = (app.clone(), sid.clone());
                tokio::spawn(
                    async move { app.delete(&format!("/v1/sessions/{sid}")).await.status() },
                )
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap().is_success());
        }
    }
    let closed = t1.elapsed();
    // Nothing is left: no process (same pid, same start), no PTY, no descriptor.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> = procs
            .iter()
            .filter(|(pid, started)| started.is_some() && start_time(*pid) == *started)
            .map(|(pid, _)| *pid)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} processes of closed sessions still run:\n{}",
            left.len(),
            toolexec_tests::procs::describe_all(&left[..left.len().min(10)])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut fds_closed = fds_of(&me);
    while fds_closed > fds_before + 64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        fds_closed = fds_of(&me);
    }
    let ptys_closed = ptys_in_use();
    eprintln!(
        "closed in {closed:?}: service descriptors {fds_closed}, host PTYs in use {ptys_closed}"
    );
    assert!(
        fds_closed <= fds_before + 64,
        "descriptors {fds_before} -> {fds_open} -> {fds_closed}"
    );
    // Our 800 PTYs are freed (other tests of this run may hold a few of their own meanwhile).
    assert!(
        ptys_closed + terminals / 2 <= ptys_open + 32,
        "host PTYs {ptys_before} -> {ptys_open} -> {ptys_closed}"
    );
}
