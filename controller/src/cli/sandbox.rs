//! `outpost sandbox`: create, list, renew and delete isolated sandboxes
//! (named `HOST/ID`, a name `exec`, `sync` and `jobs` take too); checkpoint,
//! restore, diff, fork, pause and resume them; serve a port of one here.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use outpost::fleet::Fleet;
use outpost::ops::sandboxes::{self, CreateRequest, Limits, SandboxView};
use outpost::ops::{checkpoints, ports};

use super::SandboxAction;

pub(super) async fn sandbox_cli(fleet: &Fleet, action: SandboxAction) -> Result<ExitCode> {
    let msg = anyhow::Error::msg;
    match action {
        SandboxAction::Create {
            host,
            id,
            ttl,
            isolation,
            no_network,
            memory_mb,
            cpus,
            pids,
            disk_mb,
            gpus,
            env,
            keep_files,
            allow_host,
            time,
            partition,
        } => {
            let request = CreateRequest {
                host,
                id,
                ttl_s: ttl_seconds(&ttl)?,
                isolation,
                network: !no_network,
                limits: Limits {
                    memory_mb,
                    cpus,
                    pids,
                    disk_mb,
                },
                gpus,
                env: env.iter().map(|kv| env_pair(kv)).collect::<Result<_>>()?,
                keep_files,
                allow_hosts: allow_host,
                time,
                partition,
            };
            // Only a Slurm allocation waits long enough to say why.
            let progress = |m: String| eprintln!("outpost: {m}");
            let view = sandboxes::create(fleet, request, &progress)
                .await
                .map_err(|e| msg(flags(&e)))?;
            print_view(&view);
        }
        SandboxAction::List { host, json } => {
            let hosts = match host {
                Some(h) => vec![fleet.get(Some(&h)).map_err(msg)?.name().to_string()],
                None => fleet.names(),
            };
            let deadline = fleet.config.connect_timeout + Duration::from_secs(5);
            let mut all = Vec::new();
            let mut failed = false;
            for (host, listed) in sandboxes::list(fleet, &hosts, deadline).await {
                match listed {
                    Ok(views) => all.extend(views),
                    Err(e) => {
                        eprintln!("outpost: {host}: {e}");
                        failed = true;
                    }
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!(
                    "{:<28} {:<8} {:<20} {:<9} WORK_DIR",
                    "NAME", "STATE", "EXPIRES", "ISOLATION"
                );
                for v in &all {
                    println!(
                        "{:<28} {:<8} {:<20} {:<9} {}",
                        v.sandbox_name, v.state, v.expires_at, v.isolation, v.work_dir
                    );
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        SandboxAction::Renew { name, ttl } => {
            let view = sandboxes::renew(fleet, &name, ttl_seconds(&ttl)?)
                .await
                .map_err(|e| msg(flags(&e)))?;
            println!(
                "{} {}, expires {}",
                view.sandbox_name, view.state, view.expires_at
            );
        }
        SandboxAction::Delete { name } => {
            let view = sandboxes::delete(fleet, &name).await.map_err(msg)?;
            println!("{} {}", view.sandbox_name, view.state);
            if view.kept_files {
                println!("files kept in {}", view.work_dir);
            }
        }
        SandboxAction::Checkpoint { name, label } => {
            let c = checkpoints::checkpoint(fleet, &name, label)
                .await
                .map_err(msg)?;
            println!("{}", c.checkpoint);
            println!(
                "  {} files ({} unchanged since the checkpoint before), {} bytes, {} ms",
                c.copy.files, c.copy.unchanged, c.copy.bytes, c.copy.took_ms
            );
        }
        SandboxAction::Checkpoints { name } => {
            for c in checkpoints::list(fleet, &name).await.map_err(msg)? {
                let label = c.label.unwrap_or_default();
                println!("{:<32} {:<20} {label}", c.checkpoint, c.created_at);
            }
        }
        SandboxAction::Restore { checkpoint, paths } => {
            let r = checkpoints::restore(fleet, &checkpoint, paths)
                .await
                .map_err(msg)?;
            println!(
                "{} files written back, {} removed, {} ms",
                r.files, r.removed, r.took_ms
            );
        }
        SandboxAction::Diff { checkpoint } => {
            let (changes, more) = checkpoints::diff(fleet, &checkpoint).await.map_err(msg)?;
            for c in changes {
                println!("{:<8} {}", c.change, c.path);
                if let Some(diff) = c.diff {
                    print!("{diff}");
                }
            }
            if more > 0 {
                println!("… and {more} more");
            }
        }
        SandboxAction::Fork { name } => {
            print_view(&checkpoints::fork(fleet, &name).await.map_err(msg)?);
        }
        SandboxAction::Pause { name, stop_clock } => {
            let v = checkpoints::pause(fleet, &name, stop_clock)
                .await
                .map_err(msg)?;
            println!("{} {}, expires {}", v.sandbox_name, v.state, v.expires_at);
        }
        SandboxAction::Resume { name } => {
            let v = checkpoints::resume(fleet, &name).await.map_err(msg)?;
            println!("{} {}, expires {}", v.sandbox_name, v.state, v.expires_at);
        }
        SandboxAction::Expose { name, port } => {
            let url = ports::expose(fleet, &name, port).await.map_err(msg)?;
            println!("{url}");
            eprintln!("outpost: serving {name} port {port} until interrupted");
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds of a `--ttl` / `TTL` argument.
fn ttl_seconds(text: &str) -> Result<f64> {
    sandboxes::parse_ttl(text).map_err(anyhow::Error::msg)
}

/// An ops message in the CLI's words.
fn flags(message: &str) -> String {
    message.replace("ttl_s must be", "the TTL must be")
}

/// `K=V` of `--env`.
fn env_pair(kv: &str) -> Result<(String, String)> {
    match kv.split_once('=') {
        Some((k, v)) => Ok((k.to_string(), v.to_string())),
        None => anyhow::bail!("--env takes NAME=VALUE, got {kv:?}"),
    }
}

/// Its name first (for scripts), then what applies.
fn print_view(v: &SandboxView) {
    println!("{}", v.sandbox_name);
    println!("  state      {}, expires {}", v.state, v.expires_at);
    let network = if v.network { "on" } else { "off" };
    println!("  isolation  {}, network {network}", v.isolation);
    if !v.limits.is_empty() {
        let l = &v.limits;
        let mut parts = Vec::new();
        if let Some(m) = l.memory_mb {
            parts.push(format!("memory {m} MiB"));
        }
        if let Some(c) = l.cpus {
            parts.push(format!("cpus {c}"));
        }
        if let Some(p) = l.pids {
            parts.push(format!("pids {p}"));
        }
        if let Some(d) = l.disk_mb {
            parts.push(format!("disk {d} MiB"));
        }
        println!("  limits     {}", parts.join(", "));
    }
    if !v.enforcement.is_empty() {
        println!("  enforced   {}", v.enforcement);
    }
    if !v.gpus.is_empty() {
        let gpus: Vec<String> = v.gpus.iter().map(u32::to_string).collect();
        println!("  gpus       {}", gpus.join(","));
    }
    println!("  work_dir   {}", v.work_dir);
    if let Some(note) = &v.note {
        println!("  note       {note}");
    }
}
