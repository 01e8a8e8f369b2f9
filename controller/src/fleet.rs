//! The configured sandboxes, which one is active, and queries across all of them.
//!
//! Hosts are queried concurrently, each under its own deadline, so a dead host
//! costs its connect timeout once, in parallel, and never looks idle.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Result;
use outpost_protocol::HostMetrics;
use serde::Serialize;

use crate::bootstrap::Artifacts;
use crate::config::Config;
use crate::session::{CallError, Session, SessionContext, SessionState};

pub struct Fleet {
    sessions: Vec<Arc<Session>>,
    active: RwLock<String>,
    pub config: Config,
}

/// One row of `list_sandboxes`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SandboxStatus {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub is_active: bool,
    pub connection_alive: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Resources {
    pub cpu: CpuResources,
    pub memory: MemoryResources,
    /// Per-GPU usage; empty where the host has no GPU.
    pub gpu: Vec<GpuResources>,
    /// 0 = fully busy, 1 = fully idle. See ARCHITECTURE.md for the formula.
    pub idle_score: f64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CpuResources {
    pub load_1m: f64,
    pub load_5m: f64,
    pub load_15m: f64,
    pub count: u32,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct MemoryResources {
    pub total_mb: u64,
    pub used_mb: u64,
    pub free_mb: u64,
    pub used_pct: f64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct GpuResources {
    pub index: u32,
    pub util_pct: f64,
    pub mem_used_mb: u64,
    pub mem_total_mb: u64,
    pub mem_used_pct: f64,
}

impl Resources {
    pub fn from_metrics(m: &HostMetrics) -> Resources {
        let mb = |b: u64| b / (1024 * 1024);
        let used_pct = if m.mem_total_bytes > 0 {
            round1(m.mem_used_bytes as f64 * 100.0 / m.mem_total_bytes as f64)
        } else {
            0.0
        };
        let memory = MemoryResources {
            total_mb: mb(m.mem_total_bytes),
            used_mb: mb(m.mem_used_bytes),
            free_mb: mb(m.mem_available_bytes),
            used_pct,
        };
        let cpu = CpuResources {
            load_1m: round2(m.load_1m),
            load_5m: round2(m.load_5m),
            load_15m: round2(m.load_15m),
            count: m.cpu_count,
        };
        let idle_score = idle_score(&cpu, &memory, &[]);
        Resources {
            cpu,
            memory,
            gpu: Vec::new(),
            idle_score,
        }
    }
}

/// remote-sandbox-mcp's weights (0.4 CPU, 0.4 memory, 0.2 GPU utilisation), with
/// GPU memory counted alongside utilisation, and hosts without GPUs scored on CPU
/// and memory alone (0.5/0.5) instead of being called GPU-idle.
pub fn idle_score(cpu: &CpuResources, mem: &MemoryResources, gpus: &[GpuResources]) -> f64 {
    let cpu_idle = if cpu.count > 0 {
        1.0 - (cpu.load_1m / cpu.count as f64).min(1.0)
    } else {
        0.0
    };
    let mem_idle = 1.0 - (mem.used_pct / 100.0).clamp(0.0, 1.0);
    let score = if gpus.is_empty() {
        0.5 * cpu_idle + 0.5 * mem_idle
    } else {
        let n = gpus.len() as f64;
        let util = gpus.iter().map(|g| g.util_pct).sum::<f64>() / n / 100.0;
        let gmem = gpus.iter().map(|g| g.mem_used_pct).sum::<f64>() / n / 100.0;
        let gpu_idle = 1.0 - (0.5 * util + 0.5 * gmem).clamp(0.0, 1.0);
        0.4 * cpu_idle + 0.4 * mem_idle + 0.2 * gpu_idle
    };
    (score * 1000.0).round() / 1000.0
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Fleet {
    pub fn new(config: Config) -> Fleet {
        let ctx = Arc::new(SessionContext {
            known_hosts: config.known_hosts.clone(),
            user_known_hosts: config.user_known_hosts.clone(),
            connect_timeout: config.connect_timeout,
            artifacts: Artifacts::discover(config.agent_bin.as_deref(), &config.agent_dirs),
        });
        let sessions: Vec<Arc<Session>> = config
            .sandboxes
            .iter()
            .map(|s| Arc::new(Session::new(s.clone(), ctx.clone())))
            .collect();
        // The first configured host is active, as in remote-sandbox-mcp; `local`
        // is listed last, so it is active only when nothing else is configured.
        let active = sessions[0].name().to_string();
        Fleet {
            sessions,
            active: RwLock::new(active),
            config,
        }
    }

    pub fn sessions(&self) -> &[Arc<Session>] {
        &self.sessions
    }

    pub fn names(&self) -> Vec<String> {
        self.sessions.iter().map(|s| s.name().to_string()).collect()
    }

    pub fn active_name(&self) -> String {
        self.active.read().unwrap().clone()
    }

    /// The named session, or the active one.
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Session>, String> {
        let name = match name {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => self.active_name(),
        };
        self.sessions
            .iter()
            .find(|s| s.name() == name)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "unknown sandbox {name:?}; available: {}",
                    self.names().join(", ")
                )
            })
    }

    pub fn select(&self, name: &str) -> Result<(), String> {
        let session = self.get(Some(name))?;
        *self.active.write().unwrap() = session.name().to_string();
        Ok(())
    }

    /// Status of every sandbox. With `check_resources`, every host is connected
    /// and measured concurrently, each within `deadline`.
    pub async fn list(&self, check_resources: bool, deadline: Duration) -> Vec<SandboxStatus> {
        let active = self.active_name();
        let rows = self.sessions.iter().map(|session| {
            let active = active.clone();
            async move {
                let (host, port, user) = session.config.address();
                let mut row = SandboxStatus {
                    name: session.name().to_string(),
                    host,
                    port,
                    user,
                    is_active: session.name() == active,
                    connection_alive: false,
                    connection_error: None,
                    resources: None,
                };
                if check_resources {
                    match tokio::time::timeout(deadline, session.metrics()).await {
                        Ok(Ok(m)) => {
                            row.connection_alive = true;
                            row.resources = Some(Resources::from_metrics(&m));
                        }
                        Ok(Err(e)) => row.connection_error = Some(e.to_string()),
                        Err(_) => {
                            row.connection_error =
                                Some(format!("no answer within {:.0} s", deadline.as_secs_f64()))
                        }
                    }
                } else {
                    match session.state() {
                        SessionState::Connected => row.connection_alive = true,
                        SessionState::Closed(reason) => row.connection_error = Some(reason),
                        SessionState::Disconnected => {}
                    }
                }
                row
            }
        });
        futures::future::join_all(rows).await
    }

    /// Connects the named (or active) sandbox and reports whether it is alive.
    pub async fn check(
        &self,
        name: Option<&str>,
    ) -> Result<(Arc<Session>, Option<CallError>), String> {
        let session = self.get(name)?;
        let err = session.connection().await.err();
        Ok((session, err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_score_is_honest_about_gpus() {
        let cpu = CpuResources {
            load_1m: 1.0,
            load_5m: 0.0,
            load_15m: 0.0,
            count: 4,
        };
        let mem = MemoryResources {
            total_mb: 100,
            used_mb: 50,
            free_mb: 50,
            used_pct: 50.0,
        };
        // No GPU: 0.5·0.75 + 0.5·0.5
        assert_eq!(idle_score(&cpu, &mem, &[]), 0.625);
        let busy_gpu = GpuResources {
            index: 0,
            util_pct: 0.0,
            mem_used_mb: 80,
            mem_total_mb: 80,
            mem_used_pct: 100.0,
        };
        // A GPU with full memory is half busy even at 0 % utilisation.
        assert_eq!(idle_score(&cpu, &mem, &[busy_gpu]), 0.6);
    }
}
