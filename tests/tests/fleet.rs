//! Many hosts at once: parallel status and metrics, unreachable hosts (a
//! network namespace whose link is cut), placement and fan-out.

// Tests run on a multi-threaded runtime: the harness blocks (sshd, /proc
// scans) while the controller's background tasks must keep running.

mod common;

use std::time::{Duration, Instant};

use common::*;
use outpost::config::{Config, HostConfig, Target};
use outpost::fleet::Fleet;
use outpost::ops::sandboxes::select_auto;
use outpost::resources::Requirements;
use outpost_e2e::{Sshd, TempDir, target_bin};

fn fleet_of(hosts: &[&Sshd], state: &TempDir, connect_timeout: Duration) -> Fleet {
    let mut sandboxes: Vec<HostConfig> = hosts
        .iter()
        .enumerate()
        .map(|(i, sshd)| HostConfig {
            name: format!("h{i:02}"),
            target: Target::Ssh(target(sshd)),
            slurm: None,
            allow_hosts: Vec::new(),
            sandbox_uids: None,
        })
        .collect();
    sandboxes.push(HostConfig::local());
    let mut config = Config::new(sandboxes, state.path().join("known_hosts"));
    config.connect_timeout = connect_timeout;
    config.agent_bin = Some(target_bin("outpost-agent"));
    Fleet::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_hosts_are_measured_in_parallel() {
    let hosts: Vec<Sshd> = (0..16).map(|_| Sshd::start()).collect();
    let refs: Vec<&Sshd> = hosts.iter().collect();
    let state = scratch("fleet16");
    let fleet = fleet_of(&refs, &state, Duration::from_secs(10));
    let deadline = Duration::from_secs(20);

    let started = Instant::now();
    let cold = fleet.list(true, deadline).await;
    let cold_took = started.elapsed();
    let started = Instant::now();
    let warm = fleet.list(true, deadline).await;
    let warm_took = started.elapsed();
    eprintln!("16 hosts + local: cold {cold_took:?}, warm {warm_took:?}");

    for rows in [&cold, &warm] {
        assert_eq!(rows.len(), 17);
        for row in rows.iter() {
            assert!(
                row.connection_alive,
                "{}: {:?}",
                row.name, row.connection_error
            );
            let r = row.resources.as_ref().unwrap();
            assert!(r.cpu.count >= 1 && r.memory.total_mb > 0);
            assert!((0.0..=1.0).contains(&r.idle_score));
        }
    }
    // Without check_resources nothing is probed: every row reports its live
    // connection as it stands.
    let rows = fleet.list(false, deadline).await;
    assert!(
        rows.iter()
            .all(|r| r.connection_alive && r.resources.is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_links_cost_one_timeout_in_parallel() {
    let healthy: Vec<Sshd> = (0..3).map(|_| Sshd::start()).collect();
    let cut: Vec<Sshd> = (0..3).map(|_| Sshd::start_in_netns()).collect();
    let mut refs: Vec<&Sshd> = healthy.iter().collect();
    refs.extend(cut.iter());
    let state = scratch("fleetcut");
    let connect_timeout = Duration::from_secs(2);
    let fleet = fleet_of(&refs, &state, connect_timeout);
    let deadline = connect_timeout + Duration::from_secs(5);

    // All reachable through their namespaces first.
    let rows = fleet.list(true, deadline).await;
    assert!(rows.iter().all(|r| r.connection_alive), "{rows:#?}");

    for sshd in &cut {
        sshd.netns().unwrap().cut();
    }
    // Live connections to the cut hosts die by heartbeat; the healthy hosts
    // answer as usual. Sequential probing would take 3 × the heartbeat.
    let started = Instant::now();
    let rows = fleet.list(true, deadline).await;
    let took = started.elapsed();
    for row in &rows[..3] {
        assert!(
            row.connection_alive,
            "{}: {:?}",
            row.name, row.connection_error
        );
    }
    for row in &rows[3..6] {
        assert!(
            !row.connection_alive,
            "{} still alive after its link was cut",
            row.name
        );
        assert!(row.resources.is_none(), "a dead host must not look idle");
        assert!(row.connection_error.is_some());
    }
    assert!(rows[6].connection_alive, "local");
    assert!(took < Duration::from_secs(9), "took {took:?}");

    // Fresh connections to cut hosts fail within the connect timeout, in parallel.
    let fresh_state = scratch("fleetcut2");
    let fleet = fleet_of(&refs, &fresh_state, connect_timeout);
    let started = Instant::now();
    let rows = fleet.list(true, deadline).await;
    let took = started.elapsed();
    assert!(rows[..3].iter().all(|r| r.connection_alive));
    assert!(rows[3..6].iter().all(|r| !r.connection_alive));
    assert!(
        took < connect_timeout * 2 + Duration::from_secs(1),
        "three unreachable hosts took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_selection_and_fan_out() {
    let hosts: Vec<Sshd> = (0..2).map(|_| Sshd::start()).collect();
    let refs: Vec<&Sshd> = hosts.iter().collect();
    let state = scratch("auto");
    let fleet = fleet_of(&refs, &state, Duration::from_secs(5));
    let deadline = Duration::from_secs(10);

    let impossible = Requirements {
        min_free_mem_mb: Some(u64::MAX / 2),
        ..Default::default()
    };
    let err = select_auto(&fleet, &impossible, deadline, &Default::default(), &|_| {})
        .await
        .unwrap_err();
    for name in ["h00", "h01", "local"] {
        assert!(err.contains(name), "{err}");
    }
    let (name, score) = select_auto(
        &fleet,
        &Requirements::default(),
        deadline,
        &Default::default(),
        &|_| {},
    )
    .await
    .unwrap();
    assert_eq!(fleet.active_name(), name);
    assert!(score >= 0.0);

    // The same command everywhere; $HOME differs between SSH and local.
    let names = fleet.names();
    let results = fleet.exec_many(&names, &req("echo $HOME")).await;
    assert_eq!(results.len(), 3);
    let outputs: Vec<String> = results
        .iter()
        .map(|(_, r)| stdout(r.as_ref().unwrap()))
        .collect();
    assert_eq!(outputs[0], outputs[1]);
    assert_ne!(outputs[0], outputs[2]);
}
