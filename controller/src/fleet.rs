//! The configured hosts, which one is active, and queries across all of them.
//! Also the isolated sandboxes made on them, by name (`HOST/ID`, see
//! [`Fleet::get`]).
//!
//! Hosts are queried concurrently, each under its own deadline, so a dead host
//! costs its connect timeout once, in parallel, and never looks idle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use anyhow::Result;
use outpost_protocol::{ExecRequest, ExecResult, GpuLease, GpuLeaseRequest};
use serde::Serialize;

use crate::config::{Config, check_sandbox_id, split_sandbox_name};
use crate::host::HostContext;
use crate::host::bootstrap::Artifacts;
use crate::policy::Policy;
use crate::resources::{Requirements, Resources};
use crate::session::{CallError, Connection, Session, SessionState};

pub struct Fleet {
    sessions: Vec<Arc<Session>>,
    /// Isolated sandboxes named so far (`HOST/ID`), each kept so that what
    /// hangs on its session (an event follower) stays one per name.
    isolated: Mutex<HashMap<String, Arc<Session>>>,
    active: RwLock<String>,
    leases: Mutex<HashMap<String, HeldLease>>,
    /// Sandbox ports served on this machine, by sandbox name.
    forwards: Mutex<HashMap<String, Vec<Forward>>>,
    pub config: Config,
    /// The config's command policy, compiled.
    pub policy: Policy,
    /// Why the user's configuration could not load ([`Fleet::unusable`]):
    /// every tool call answers this, and nothing runs.
    pub problem: Option<String>,
    /// Why no host can be connected: no agent build was found.
    pub agent_missing: Option<String>,
}

/// A sandbox's port served on this machine (see `ops::ports`): its URL, and
/// the task that accepts there.
pub struct Forward {
    pub port: u16,
    pub url: String,
    pub accepting: tokio::task::AbortHandle,
}

/// A GPU lease this controller took. It is valid while the connection that
/// holds it on the host is the session's live one.
pub struct HeldLease {
    pub sandbox: String,
    pub lease: GpuLease,
    conn: Weak<Connection>,
}

impl HeldLease {
    /// `CUDA_VISIBLE_DEVICES` (UUIDs, unambiguous whatever the device order).
    pub fn cuda_visible_devices(&self) -> String {
        if self.lease.uuids.iter().all(|u| !u.is_empty()) {
            self.lease.uuids.join(",")
        } else {
            let idx: Vec<String> = self.lease.indices.iter().map(u32::to_string).collect();
            idx.join(",")
        }
    }
}

/// One row of `list_sandboxes`.
#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
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

impl HostStatus {
    /// The row once its host was measured (connected, or why not).
    pub fn measured(mut self, resources: Result<Resources, String>) -> HostStatus {
        self.connection_alive = resources.is_ok();
        (self.resources, self.connection_error) = match resources {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e)),
        };
        self
    }
}

/// Why a host's row has no answer: it did not come within `deadline`.
pub fn no_answer(deadline: Duration) -> String {
    format!("no answer within {:.0} s", deadline.as_secs_f64())
}

/// The Slurm job an allocation's id (`job-N`) names, on the cluster `login`.
pub fn allocation_job(login: &str, id: &str) -> Result<u64, String> {
    id.strip_prefix("job-")
        .and_then(|n| n.parse::<u64>().ok())
        // One name per job: no `job-017` beside `job-17`.
        .filter(|n| *n > 0 && id == format!("job-{n}"))
        .ok_or_else(|| {
            format!(
                "{login} is a Slurm cluster: its sandboxes are named {login}/job-N (N the Slurm job id), not {login}/{id}"
            )
        })
}

impl Fleet {
    /// The fleet of `config`, or why its policy does not compile.
    pub fn try_new(config: Config) -> anyhow::Result<Fleet> {
        let names: Vec<String> = config.hosts.iter().map(|s| s.name.clone()).collect();
        let policy = Policy::compile(&config.policy, &names)?;
        Ok(Fleet::with_policy(config, policy))
    }

    /// The fleet of `config`.
    ///
    /// # Panics
    ///
    /// If the config's policy does not compile; see [`Fleet::try_new`].
    pub fn new(config: Config) -> Fleet {
        Fleet::try_new(config).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn with_policy(config: Config, policy: Policy) -> Fleet {
        let ctx = Arc::new(HostContext {
            known_hosts: config.known_hosts.clone(),
            user_known_hosts: config.user_known_hosts.clone(),
            connect_timeout: config.connect_timeout,
            artifacts: Artifacts::discover(config.agent_bin.as_deref(), &config.agent_dirs),
        });
        let agent_missing = ctx.artifacts.missing();
        let sessions: Vec<Arc<Session>> = config
            .hosts
            .iter()
            .map(|s| Arc::new(Session::new(s.clone(), ctx.clone())))
            .collect();
        // The first configured host is active, as in remote-sandbox-mcp; `local`
        // is listed last, so it is active only when nothing else is configured.
        let active = sessions[0].name().to_string();
        Fleet {
            sessions,
            isolated: Mutex::new(HashMap::new()),
            active: RwLock::new(active),
            leases: Mutex::new(HashMap::new()),
            forwards: Mutex::default(),
            config,
            policy,
            problem: None,
            agent_missing,
        }
    }

    /// The URL serving `port` of sandbox `name`, if one does.
    pub fn forward_url(&self, name: &str, port: u16) -> Option<String> {
        let forwards = self.forwards.lock().unwrap();
        let found = forwards.get(name)?.iter().find(|f| f.port == port)?;
        Some(found.url.clone())
    }

    pub fn add_forward(&self, name: &str, forward: Forward) {
        let mut forwards = self.forwards.lock().unwrap();
        forwards.entry(name.to_string()).or_default().push(forward);
    }

    /// Stops serving the ports of `name` (it was deleted).
    pub fn close_forwards(&self, name: &str) {
        for f in self
            .forwards
            .lock()
            .unwrap()
            .remove(name)
            .unwrap_or_default()
        {
            f.accepting.abort();
        }
    }

    /// A fleet that serves nothing: the configuration could not load, so
    /// an MCP server answers every call with `problem` (a client shows a
    /// server that exits only as "failed to connect"). Listing still works,
    /// from the zero configuration; no host, rule or hook of it applies.
    pub fn unusable(problem: String) -> anyhow::Result<Fleet> {
        let nowhere = "/nonexistent/outpost-config-problem";
        let mut fleet = Fleet::try_new(Config::load_from(&[("HOME", nowhere)])?)?;
        fleet.problem = Some(problem);
        Ok(fleet)
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

    /// The named session, or the active one: a configured host, or an
    /// isolated sandbox `HOST/ID` on one (a view of HOST's session, made on
    /// first use; whether the sandbox exists is for its host to say).
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Session>, String> {
        let name = match name {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => self.active_name(),
        };
        let configured = |n: &str| self.sessions.iter().find(|s| s.name() == n);
        match split_sandbox_name(&name, |n| configured(n).is_some()) {
            Some((host, None)) => Ok(configured(host).expect("configured").clone()),
            Some((host, Some(id))) => {
                check_sandbox_id(id)?;
                let host = configured(host).expect("configured");
                let job = match host.config.slurm {
                    Some(_) => Some(allocation_job(host.name(), id)?),
                    None => None,
                };
                let mut isolated = self.isolated.lock().unwrap();
                Ok(isolated
                    .entry(name.clone())
                    .or_insert_with(|| match job {
                        Some(job) => Arc::new(Session::allocation(host.clone(), job)),
                        None => Arc::new(Session::isolated(host.clone(), id)),
                    })
                    .clone())
            }
            None => Err(format!(
                "unknown sandbox {name:?}; available: {}",
                self.names().join(", ")
            )),
        }
    }

    /// An isolated sandbox's host and id, from its name `HOST/ID`.
    pub fn isolated(&self, name: &str) -> Result<(Arc<Session>, String), String> {
        let session = self.get(Some(name))?;
        match session.isolated_in() {
            Some((host, id)) => Ok((host.clone(), id.to_string())),
            None => Err(format!(
                "{name} is a configured sandbox, not one create_sandbox made (those are named HOST/ID)"
            )),
        }
    }

    /// Drops the session kept for the isolated sandbox `name` (`HOST/ID`)
    /// once it is deleted, so that sandboxes made and deleted by the
    /// thousand (one-shot runs) leave nothing behind here. A later use of
    /// the name makes a fresh one.
    pub fn forget(&self, name: &str) {
        self.isolated.lock().unwrap().remove(name);
    }

    pub fn select(&self, name: &str) -> Result<(), String> {
        let session = self.get(Some(name))?;
        *self.active.write().unwrap() = session.name().to_string();
        Ok(())
    }

    /// Status of every configured host. With `check_resources`, every host is connected
    /// and measured concurrently, each within `deadline`.
    pub async fn list(&self, check_resources: bool, deadline: Duration) -> Vec<HostStatus> {
        let active = self.active_name();
        let rows = self.sessions.iter().map(|session| {
            let active = &active;
            async move {
                let mut row = Self::status(session, active);
                if !row.connection_alive && row.connection_error.is_none() {
                    row.connection_error = self.agent_missing.clone();
                }
                match check_resources {
                    true => row.measured(Self::resources(session, deadline).await),
                    false => row,
                }
            }
        });
        futures::future::join_all(rows).await
    }

    /// A host's row as it stands, without connecting: whether its
    /// connection is alive now, or why it closed.
    pub fn status(session: &Session, active: &str) -> HostStatus {
        let (host, port, user) = session.config.address();
        let mut row = HostStatus {
            name: session.name().to_string(),
            host,
            port,
            user,
            is_active: session.name() == active,
            connection_alive: false,
            connection_error: None,
            resources: None,
        };
        match session.state() {
            SessionState::Connected => row.connection_alive = true,
            SessionState::Closed(reason) => row.connection_error = Some(reason),
            SessionState::Disconnected => {}
        }
        row
    }

    /// Connects the named (or active) host or sandbox and reports whether it is alive
    /// (an isolated one: whether its host answers inside it).
    pub async fn check(
        &self,
        name: Option<&str>,
    ) -> Result<(Arc<Session>, Option<CallError>), String> {
        let session = self.get(name)?;
        let err = match session.isolated_in() {
            Some(_) => session.ping().await.err(),
            None => session.connection().await.err(),
        };
        Ok((session, err))
    }

    /// Resources of one host or sandbox, connecting if needed, within `deadline`.
    pub async fn resources(session: &Session, deadline: Duration) -> Result<Resources, String> {
        match tokio::time::timeout(deadline, session.metrics()).await {
            Ok(Ok(m)) => Ok(Resources::from_metrics(&m)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(no_answer(deadline)),
        }
    }

    /// Measures every configured host concurrently; the idlest one that
    /// meets `req`, with its resources, or why none fits. `answered` counts
    /// the hosts measured (or given up on) so far.
    ///
    /// A Slurm cluster is a candidate only when `req` asks for GPUs, and
    /// only after every host: it fits when a partition has an idle node
    /// with that many GPUs (its login node's own load and memory do not
    /// count), and what it offers is an allocation, which may queue.
    pub async fn idlest(
        &self,
        req: &Requirements,
        deadline: Duration,
        answered: &AtomicUsize,
    ) -> Result<(String, Resources), String> {
        let measured = futures::future::join_all(self.sessions.iter().map(|s| async move {
            let result = Self::resources(s, deadline).await;
            answered.fetch_add(1, Ordering::Relaxed);
            (s.name().to_string(), s.config.slurm.is_some(), result)
        }))
        .await;
        let need_gpus = req.min_gpus.unwrap_or(0);
        let mut best: Option<(String, Resources)> = None;
        let mut cluster: Option<(String, Resources, u32)> = None;
        let mut rejected = Vec::new();
        for (name, is_cluster, result) in measured {
            match result {
                Err(e) => rejected.push(format!("{name}: unreachable ({e})")),
                Ok(_) if is_cluster && need_gpus == 0 => rejected.push(format!(
                    "{name}: a Slurm cluster (picked for min_gpus only)"
                )),
                Ok(r) if is_cluster => {
                    let idle = r
                        .slurm
                        .as_ref()
                        .and_then(|s| s.partition_for(need_gpus))
                        .map(|p| p.nodes.idle);
                    match idle {
                        Some(idle) if cluster.as_ref().is_none_or(|(_, _, i)| idle > *i) => {
                            cluster = Some((name, r, idle));
                        }
                        Some(_) => {}
                        None => rejected.push(format!(
                            "{name}: no partition with an idle node of {need_gpus} GPUs"
                        )),
                    }
                }
                Ok(r) => match req.misfit(&r) {
                    Some(why) => rejected.push(format!("{name}: {why}")),
                    None => {
                        if best
                            .as_ref()
                            .is_none_or(|(_, b)| r.idle_score > b.idle_score)
                        {
                            best = Some((name, r));
                        }
                    }
                },
            }
        }
        best.or(cluster.map(|(name, r, _)| (name, r)))
            .ok_or_else(|| format!("no sandbox fits: {}", rejected.join("; ")))
    }

    /// Runs `req` on each named host or sandbox concurrently.
    pub async fn exec_many(
        &self,
        names: &[String],
        req: &ExecRequest,
    ) -> Vec<(String, Result<ExecResult, CallError>)> {
        futures::future::join_all(names.iter().map(|name| async move {
            let result = match self.get(Some(name)) {
                Ok(session) => session.exec(req.clone(), |_, _| {}).await,
                Err(e) => Err(CallError::Connect(e)),
            };
            (name.clone(), result)
        }))
        .await
    }

    /// Reserves GPUs on the named (or active) configured host.
    pub async fn reserve_gpus(
        &self,
        name: Option<&str>,
        request: GpuLeaseRequest,
    ) -> Result<String, CallError> {
        let session = self.get(name).map_err(CallError::Connect)?;
        if session.isolated_in().is_some() {
            return Err(CallError::Connect(format!(
                "{} is an isolated sandbox: its GPUs are leased when it is made (create_sandbox's gpus)",
                session.name()
            )));
        }
        let (lease, conn) = session.lease(request).await?;
        let id = lease.lease_id.clone();
        self.leases.lock().unwrap().insert(
            id.clone(),
            HeldLease {
                sandbox: session.name().to_string(),
                lease,
                conn: Arc::downgrade(&conn),
            },
        );
        Ok(id)
    }

    /// Runs `f` on a lease this controller holds, if it is still live.
    pub fn with_lease<T>(&self, id: &str, f: impl FnOnce(&HeldLease) -> T) -> Result<T, String> {
        let mut leases = self.leases.lock().unwrap();
        let Some(held) = leases.get(id) else {
            return Err(format!("no GPU lease {id:?}; reserve_gpus gives one"));
        };
        let live = held
            .conn
            .upgrade()
            .is_some_and(|c| c.closed_reason().is_none());
        if !live {
            leases.remove(id);
            return Err(format!(
                "GPU lease {id:?} ended when its connection dropped; reserve again"
            ));
        }
        Ok(f(held))
    }

    pub async fn release_gpus(&self, id: &str) -> Result<(), String> {
        let sandbox = self.with_lease(id, |h| h.sandbox.clone())?;
        let session = self.get(Some(&sandbox))?;
        session.release(id).await.map_err(|e| e.to_string())?;
        self.leases.lock().unwrap().remove(id);
        Ok(())
    }
}
