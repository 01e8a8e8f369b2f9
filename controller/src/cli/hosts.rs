//! `outpost hosts` and `outpost diagnose`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outpost::fleet::Fleet;
use outpost_protocol::ExecRequest;

pub(super) async fn hosts(fleet: &Fleet, resources: bool, json: bool) -> Result<ExitCode> {
    let deadline = fleet.config.connect_timeout + Duration::from_secs(5);
    let mut rows = fleet.list(true, deadline).await;
    if !resources {
        for r in &mut rows {
            r.resources = None;
        }
    }
    // A host that cannot be reached is a failure, as scripts check it.
    let status = if rows.iter().all(|r| r.connection_alive) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(status);
    }
    if resources {
        println!(
            "  {:<16} {:<7} {:>4} {:>6} {:>5} {:>6} {:>9} {:>5}  GPUS",
            "NAME", "STATE", "CPUS", "LOAD1", "CPU%", "MEM%", "MEM FREE", "IDLE"
        );
    } else {
        println!("  {:<16} {:<30} STATE", "NAME", "ADDRESS");
    }
    for r in &rows {
        let mark = if r.is_active { "*" } else { " " };
        let state = if r.connection_alive { "ok" } else { "error" };
        let problem = r.connection_error.as_deref().unwrap_or("");
        if !resources {
            let addr = if r.user.is_empty() {
                r.host.clone()
            } else if r.port == 0 {
                format!("{}@{}", r.user, r.host)
            } else {
                format!("{}@{}:{}", r.user, r.host, r.port)
            };
            println!("{mark} {:<16} {:<30} {state} {problem}", r.name, addr);
            continue;
        }
        let Some(res) = &r.resources else {
            println!("{mark} {:<16} {:<7} {problem}", r.name, state);
            continue;
        };
        let gpus = match (&res.gpu_error, res.gpu.len()) {
            (Some(e), _) => format!("unknown ({e})"),
            (None, 0) => "-".to_string(),
            (None, n) => format!("{n} via {}", res.gpu_source),
        };
        println!(
            "{mark} {:<16} {:<7} {:>4} {:>6.2} {:>5} {:>5.0}% {:>7}Mi {:>5.2}  {gpus}",
            r.name,
            state,
            res.cpu.count,
            res.cpu.load_1m,
            res.cpu
                .usage_pct
                .map_or("-".to_string(), |u| format!("{u:.0}")),
            res.memory.used_pct,
            res.memory.free_mb,
            res.idle_score,
        );
        for g in &res.gpu {
            println!(
                "      gpu{} {:<24} {:>3.0}% util  {:>6}/{:<6} MiB  {}{}",
                g.index,
                g.name,
                g.util_pct,
                g.mem_used_mb,
                g.mem_total_mb,
                g.temperature_c.map_or(String::new(), |t| format!("{t}°C ")),
                g.lease
                    .as_ref()
                    .map_or(String::new(), |l| format!("leased by {l}"))
            );
        }
        if let Some(slurm) = &res.slurm {
            if let Some(e) = &slurm.error {
                println!("      slurm: {e}");
            }
            for p in &slurm.partitions {
                // `*` marks the default partition, as in sinfo.
                let name = format!("{}{}", p.name, if p.default { "*" } else { "" });
                println!(
                    "      partition {name:<15} {:<4} nodes {} idle, {} alloc, {} other  cpus {}/{} idle{}",
                    if p.up { "up" } else { "down" },
                    p.nodes.idle,
                    p.nodes.allocated,
                    p.nodes.other,
                    p.cpus.idle,
                    p.cpus.total,
                    if p.gres.is_empty() {
                        String::new()
                    } else {
                        format!("  {}", p.gres)
                    },
                );
            }
        }
    }
    Ok(status)
}

pub(super) async fn diagnose(fleet: &Fleet, host: Option<String>) -> Result<ExitCode> {
    let cfg = &fleet.config;
    println!("outpost {}", env!("CARGO_PKG_VERSION"));
    println!("configuration:   {}", cfg.source);
    println!(
        "known_hosts:     {} (Outpost's own)",
        cfg.known_hosts.display()
    );
    if let Some(p) = &cfg.user_known_hosts {
        println!("                 {} (read only)", p.display());
    }
    println!(
        "connect timeout: {:.1} s",
        cfg.connect_timeout.as_secs_f64()
    );
    let artifacts =
        outpost::host::bootstrap::Artifacts::discover(cfg.agent_bin.as_deref(), &cfg.agent_dirs);
    match &artifacts.native {
        Some(a) => println!("agent (native):  {}", a.path.display()),
        None => println!("agent (native):  MISSING — build it with `cargo build --workspace`"),
    }
    for a in &artifacts.portable {
        println!("agent build:     {}", a.label);
    }
    println!();
    let deadline = cfg.connect_timeout + Duration::from_secs(5);
    let started = Instant::now();
    let rows = fleet.list(true, deadline).await;
    println!(
        "sandboxes (checked in parallel in {} ms):",
        started.elapsed().as_millis()
    );
    for r in &rows {
        let state = match (&r.resources, &r.connection_error) {
            (Some(_), _) => "reachable".to_string(),
            (None, Some(e)) => format!("PROBLEM: {e}"),
            (None, None) => "unknown".to_string(),
        };
        println!(
            "  {}{:<16} {}",
            if r.is_active { "*" } else { " " },
            r.name,
            state
        );
    }
    let problems = rows.iter().any(|r| r.connection_error.is_some());
    let Some(host) = host else {
        return Ok(if problems {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    };
    let session = fleet.get(Some(&host)).map_err(anyhow::Error::msg)?;
    let conn = session
        .connection()
        .await
        .with_context(|| format!("cannot reach {host}"))?;
    let h = &conn.hello;
    println!();
    println!(
        "{host}: agent {} ({}), protocol {}, {} {} {}, pid {}",
        h.agent_version,
        &h.build_hash[..12.min(h.build_hash.len())],
        h.protocol_version,
        h.os,
        h.arch,
        h.libc,
        h.pid
    );
    println!("agent path: {}", conn.agent_path);
    println!();
    let req = ExecRequest {
        command: format!(
            "{} diagnose",
            outpost::host::bootstrap::shell_quote(&conn.agent_path)
        ),
        cwd: None,
        env: Vec::new(),
        stdin: None,
        timeout_ms: Some(30_000),
        output_limit: outpost_protocol::limits::MAX_EXEC_OUTPUT_LIMIT,
        stream: false,
        progress_ms: None,
        hand_over: None,
    };
    let result = session.exec(req, |_, _| {}).await?;
    print!("{}", result.stdout.to_text());
    eprint!("{}", result.stderr.to_text());
    // The host's own report says whether it found a problem.
    let failed = problems || outpost::ops::exec::shell_status(&result) != 0;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
