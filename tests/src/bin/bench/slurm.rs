//! A private single-node Slurm: create_sandbox to the first result, exec_bash in
//! the allocation vs the login node and a new `srun` per command; and 100 batch
//! jobs as background tasks, listed in one call.

use std::time::{Duration, Instant};

use outpost_e2e::{Slurm, Sshd, TempDir, target_bin};
use rmcp::ServiceExt;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::json;

use crate::{Client, exec_true_in, mcp_client, median, ms, tool};

pub(crate) async fn slurm() {
    const CREATE_ROUNDS: usize = 5;
    const EXEC_ROUNDS: usize = 50;
    let Some(cluster) = Slurm::start() else {
        println!("slurm: skipped (no Slurm here; scripts/setup-test-env installs it)");
        return;
    };
    let sshd = Sshd::start_with_env(&cluster.env());
    let scratch = TempDir::new("bench-slurm");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "{}[sandbox.slurm]\ntime = \"30\"\n",
            sshd.sandbox_toml("hpc")
        ),
    )
    .unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: the login node's connection and agent.
    exec_true_in(&client, "hpc", "true", 5).await;

    let mut first_exec = Vec::new();
    for _ in 0..CREATE_ROUNDS {
        let t = Instant::now();
        let made = tool(&client, "create_sandbox", json!({"host": "hpc"})).await;
        let name = made["sandbox_name"].as_str().unwrap().to_string();
        exec_true_in(&client, &name, "true", 1).await;
        first_exec.push(t.elapsed());
        tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    }

    let made = tool(&client, "create_sandbox", json!({"host": "hpc"})).await;
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let job = name.trim_start_matches("hpc/job-").to_string();
    let by_hand = format!("srun --jobid={job} --overlap -N1 -n1 true");
    exec_true_in(&client, &name, "true", 5).await;
    // Interleaved, so drift hits all alike.
    let (mut step, mut login, mut per_command) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..EXEC_ROUNDS {
        step.push(exec_true_in(&client, &name, "true", 1).await);
        login.push(exec_true_in(&client, "hpc", "true", 1).await);
        per_command.push(exec_true_in(&client, "hpc", &by_hand, 1).await);
    }
    tool(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    let (step, login, per_command) = (median(step), median(login), median(per_command));
    println!("slurm (single-node cluster, login node over the private sshd):");
    println!(
        "  create_sandbox → first exec_bash result, idle cluster: {} median of {CREATE_ROUNDS}",
        ms(median(first_exec))
    );
    println!(
        "  exec_bash('true') in the allocation (srun --overlap step): {} vs the login node over SSH {} ({:.2}x); a new srun --overlap per command {} ({:.1}x the step)",
        ms(step),
        ms(login),
        step.as_secs_f64() / login.as_secs_f64(),
        ms(per_command),
        per_command.as_secs_f64() / step.as_secs_f64()
    );
}

/// 100 Slurm batch jobs submitted through `exec_bash_background`, then the
/// status of all of them in one `list_background_tasks` call.
pub(crate) async fn slurm_batch() {
    const JOBS: usize = 100;
    const ROUNDS: usize = 10;
    let Some(cluster) = Slurm::start() else {
        println!("slurm-batch: skipped (no Slurm here; scripts/setup-test-env installs it)");
        return;
    };
    let home = TempDir::new("bench-slurm-batch");
    // The local sandbox inherits SLURM_CONF: a login node of the cluster.
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(target_bin("outpost")).configure(|cmd| {
            cmd.arg("mcp")
                .env_clear()
                .env("HOME", home.path())
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .envs(cluster.env());
        }),
    )
    .expect("spawn outpost mcp");
    let client: Client = ().serve(transport).await.expect("MCP handshake");
    let mut submit = Vec::new();
    let mut names = Vec::new();
    for i in 0..JOBS {
        let t = Instant::now();
        let r = tool(
            &client,
            "exec_bash_background",
            json!({"command": format!("exit {}", i % 3), "scheduler": "slurm", "time": "5"}),
        )
        .await;
        submit.push(t.elapsed());
        names.push(r["tmux_session"].as_str().unwrap().to_string());
    }
    let list = || tool(&client, "list_background_tasks", json!({"limit": JOBS}));
    let began = Instant::now();
    loop {
        let r = list().await;
        let ended = r["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["state"] == "exited")
            .count();
        if ended == JOBS {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "{ended} of {JOBS} batch jobs ended after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (mut all, mut one) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let r = list().await;
        all.push(t.elapsed());
        assert_eq!(r["tasks"].as_array().unwrap().len(), JOBS, "{r}");
        let t = Instant::now();
        tool(
            &client,
            "check_background_task",
            json!({"tmux_session": names[0], "last_n_lines": 0}),
        )
        .await;
        one.push(t.elapsed());
    }
    let (all, one) = (median(all), median(one));
    println!("slurm batch jobs (single-node cluster, the local sandbox its login node):");
    println!(
        "  exec_bash_background(scheduler=\"slurm\") submit: {} median of {JOBS}",
        ms(median(submit))
    );
    println!(
        "  status of {JOBS} ended jobs in ONE list_background_tasks call: {} median of {ROUNDS} ({:.1}x one job's check_background_task, {})",
        ms(all),
        all.as_secs_f64() / one.as_secs_f64(),
        ms(one)
    );
    client.cancel().await.ok();
}
