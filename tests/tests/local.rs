//! The `local` transport: the same agent as a child process over pipes.

// Tests run on a multi-threaded runtime: the harness blocks (sshd, /proc
// scans) while the controller's background tasks must keep running.

mod common;

use common::*;
use outpost::config::Config;
use outpost::fleet::Fleet;
use outpost_e2e::target_bin;

/// A fleet with no configuration at all (an empty home), and that home.
fn local_fleet() -> (Fleet, outpost_e2e::TempDir) {
    let dir = scratch("local-home");
    let home = dir.path().to_string_lossy().to_string();
    let mut config = Config::load_from(&[("HOME", home.as_str())]).unwrap();
    config.agent_bin = Some(target_bin("outpost-agent"));
    (Fleet::new(config), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_gives_an_active_local_sandbox() {
    let (fleet, _home) = local_fleet();
    assert_eq!(fleet.names(), vec!["local"]);
    assert_eq!(fleet.active_name(), "local");
    let session = fleet.get(None).unwrap();
    let r = run(&session, "echo $((6*7))").await.unwrap();
    assert_eq!(stdout(&r), "42\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_exec_behaviour() {
    let (fleet, _home) = local_fleet();
    exec_suite(&fleet.get(None).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_timeouts_kill_the_whole_tree() {
    let (fleet, _home) = local_fleet();
    timeout_suite(&fleet.get(None).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_metrics_agree_with_proc() {
    let (fleet, _home) = local_fleet();
    let m = fleet.get(None).unwrap().metrics().await.unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    assert_eq!(m.cpu_count, cpus);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(m.mem_total_bytes / 1024, total_kb);
}
