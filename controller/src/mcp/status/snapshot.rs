//! What the status page shows, gathered every few seconds while someone
//! watches: each host's CPU, memory and GPUs (kept for the last hour, for
//! the charts), its live sandboxes, its running and lately ended jobs with
//! a log tail, and the newest audit lines.
//!
//! One [`Sampler`] per server: the first page that subscribes starts it,
//! and it stops when the last one leaves, so a server nobody looks at
//! measures nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fleet::Fleet;
use crate::ops;
use crate::ops::events::now_unix;

/// How often a watched server samples.
pub const INTERVAL: Duration = Duration::from_secs(3);
/// How much history the charts get.
const HISTORY_S: u64 = 3600;
/// A host that does not answer within this is shown as unreachable.
const DEADLINE: Duration = Duration::from_secs(5);
/// Jobs shown per host, and how long an ended one stays.
const JOBS_SHOWN: u32 = 10;
const ENDED_SHOWN_S: u64 = 15 * 60;
const TAIL_LINES: u32 = 6;
const AUDIT_LINES: usize = 10;

pub struct Sampler {
    fleet: Arc<Fleet>,
    audit: ops::audit::AuditLog,
    latest: watch::Sender<Arc<String>>,
    running: AtomicBool,
    /// Per host: `[unix, cpu %, memory %, [gpu util %, gpu memory %]…]`.
    history: Mutex<HashMap<String, VecDeque<Value>>>,
}

impl Sampler {
    pub fn new(fleet: Arc<Fleet>) -> Arc<Sampler> {
        Arc::new(Sampler {
            audit: ops::audit::AuditLog::new(&fleet.config.home),
            fleet,
            latest: watch::channel(Arc::new(String::new())).0,
            running: AtomicBool::new(false),
            history: Mutex::new(HashMap::new()),
        })
    }

    /// Every snapshot from now on; starts sampling if nobody watched.
    pub fn subscribe(self: &Arc<Self>) -> watch::Receiver<Arc<String>> {
        let receiver = self.latest.subscribe();
        if !self.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().run());
        }
        receiver
    }

    /// The charts' points so far, per host.
    pub fn history(&self) -> String {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        json!(&*history).to_string()
    }

    async fn run(self: Arc<Self>) {
        loop {
            let snapshot = self.collect().await;
            self.latest.send_replace(Arc::new(snapshot.to_string()));
            if self.latest.receiver_count() == 0 {
                self.running.store(false, Ordering::SeqCst);
                // A page that came in between takes the loop back.
                if self.latest.receiver_count() == 0 || self.running.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
            tokio::time::sleep(INTERVAL).await;
        }
    }

    async fn collect(&self) -> Value {
        let rows = ops::sandboxes::hosts(&self.fleet, true, DEADLINE).await;
        let now = now_unix();
        // Every host's jobs at once: one slow host costs one deadline.
        let all_jobs = futures::future::join_all(rows.iter().map(|row| async move {
            match row.status.connection_alive {
                true => self.jobs(&row.status.name, now).await,
                false => Vec::new(),
            }
        }))
        .await;
        let mut hosts = Vec::new();
        for (row, jobs) in rows.into_iter().zip(all_jobs) {
            let status = &row.status;
            let point = status.resources.as_ref().map(|r| {
                let gpus: Vec<Value> = r
                    .gpu
                    .iter()
                    .map(|g| json!([g.util_pct, g.mem_used_pct]))
                    .collect();
                json!([
                    now,
                    r.cpu.usage_pct.unwrap_or(-1.0),
                    r.memory.used_pct,
                    gpus
                ])
            });
            if let Some(point) = &point {
                let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
                let series = history.entry(status.name.clone()).or_default();
                series.push_back(point.clone());
                while series
                    .front()
                    .is_some_and(|p| p[0].as_u64().unwrap_or(0) + HISTORY_S < now)
                {
                    series.pop_front();
                }
            }
            let sandboxes: Vec<Value> = row
                .sandboxes
                .iter()
                .flatten()
                .map(|s| {
                    json!({
                        "name": s.sandbox_name, "state": s.state, "expires_at": s.expires_at,
                        "isolation": s.isolation, "network": s.network, "limits": s.limits,
                        "gpus": s.gpus, "ports": s.ports,
                    })
                })
                .collect();
            hosts.push(json!({
                "name": status.name,
                "address": format!("{}@{}", status.user, status.host),
                "alive": status.connection_alive,
                "error": status.connection_error,
                "point": point,
                "resources": status.resources.as_ref().map(|r| json!({
                    "cpus": r.cpu.count, "load": r.cpu.load_1m,
                    "mem_used_mb": r.memory.used_mb, "mem_total_mb": r.memory.total_mb,
                    "gpus": r.gpu.iter().map(|g| json!({
                        "index": g.index, "name": g.name, "util_pct": g.util_pct,
                        "mem_used_mb": g.mem_used_mb, "mem_total_mb": g.mem_total_mb,
                    })).collect::<Vec<_>>(),
                })),
                "sandboxes": sandboxes,
                "jobs": jobs,
            }));
        }
        let audit: Vec<Value> = self
            .audit
            .tail(AUDIT_LINES)
            .unwrap_or_default()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|r| {
                json!({
                    "time": r["time"], "client": r["client"], "tool": r["tool"],
                    "sandbox": r["sandbox"], "outcome": r["outcome"],
                    "duration_ms": r["duration_ms"], "error": r["error"],
                })
            })
            .collect();
        json!({"time": now, "hosts": hosts, "audit": audit})
    }

    /// A host's running jobs and those that ended lately, newest first,
    /// with the last lines of each running one's log.
    async fn jobs(&self, host: &str, now: u64) -> Vec<Value> {
        let Ok(session) = self.fleet.get(Some(host)) else {
            return Vec::new();
        };
        let listed = tokio::time::timeout(DEADLINE, ops::jobs::list(&session, None, JOBS_SHOWN));
        let Ok(Ok((jobs, _))) = listed.await else {
            return Vec::new();
        };
        let shown_jobs: Vec<_> = jobs
            .into_iter()
            .rev()
            .filter(|job| {
                job.ended_unix
                    .is_none_or(|ended| ended + ENDED_SHOWN_S >= now)
            })
            .collect();
        // The running ones' log tails, asked at once.
        let tails = futures::future::join_all(shown_jobs.iter().map(|job| {
            let session = &session;
            async move {
                if job.ended_unix.is_some() {
                    return String::new();
                }
                tokio::time::timeout(
                    DEADLINE,
                    ops::jobs::tail(session, &job.name, TAIL_LINES, 4096),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
            }
        }))
        .await;
        let mut shown = Vec::new();
        for (job, tail) in shown_jobs.into_iter().zip(tails) {
            shown.push(json!({
                "name": job.name,
                "command": ops::audit::truncate(&job.command, 200),
                "state": ops::jobs::state_name(job.state),
                "exit_code": job.exit_code,
                "started": job.started_unix,
                "ended": job.ended_unix,
                "tail": tail,
            }));
        }
        shown
    }
}
