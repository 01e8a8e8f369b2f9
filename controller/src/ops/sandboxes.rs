//! Isolated sandboxes: places on a host whose commands and files are kept
//! apart from the rest of it (as far as the host allows: bubblewrap,
//! Landlock, or only their own directories), with limits, and an expiry.
//! The host's agent makes, lists, renews and deletes them and confines what
//! runs in them; this module checks a front end's request, picks the host,
//! and shapes the answers for both front ends.
//!
//! A sandbox is named `HOST/ID` (`gpu1/sbx-3f2a`), HOST a configured
//! sandbox. Every other tool and command works in one through that name:
//! [`Fleet::get`] gives its session, whose requests go inside it.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use outpost_protocol::limits::{MAX_SANDBOX_TTL_MS, MIN_SANDBOX_TTL_MS};
use outpost_protocol::{
    Isolation, Request, Response, SandboxInfo, SandboxLimits, SandboxSpec, SandboxState,
};
use serde::Serialize;

use super::jobs::{ask, unexpected, utc_time};
use super::slurm::{self, Allocation, AllocationRequest};
use crate::config::check_sandbox_id;
use crate::fleet::{Fleet, HostStatus, no_answer};
use crate::resources::Requirements;
use crate::session::Session;

/// A sandbox's life when the caller does not say, in seconds.
pub const DEFAULT_TTL_S: f64 = 3600.0;
/// The shortest and longest life one request may give (renewing extends
/// it again): the agent's bounds.
pub const MIN_TTL_S: f64 = MIN_SANDBOX_TTL_MS as f64 / 1000.0;
pub const MAX_TTL_S: f64 = MAX_SANDBOX_TTL_MS as f64 / 1000.0;
/// The host "auto" asks for: the idlest configured one that fits.
pub const AUTO: &str = "auto";
/// How long a host may take to be measured for "auto", past connecting.
const MEASURE_EXTRA: Duration = Duration::from_secs(5);

/// A sandbox to make, as plain data from a front end.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// A configured host, or [`AUTO`].
    pub host: String,
    /// None: the agent picks one (`sbx-` and 4 hex digits).
    pub id: Option<String>,
    pub ttl_s: f64,
    /// `auto`, `bwrap`, `landlock` or `none`.
    pub isolation: String,
    pub network: bool,
    pub limits: Limits,
    pub gpus: u32,
    /// Set for every command run in it.
    pub env: Vec<(String, String)>,
    /// Leave its files on the host when it ends.
    pub keep_files: bool,
    /// With `network: false`: the names (`*.suffix`, `:port`) its commands
    /// may reach, through the host agent's proxy.
    pub allow_hosts: Vec<String>,
    /// Slurm clusters only: the allocation's time limit (`2:00:00`) and
    /// partition; None: the cluster's defaults.
    pub time: Option<String>,
    pub partition: Option<String>,
}

impl Default for CreateRequest {
    fn default() -> Self {
        CreateRequest {
            host: AUTO.into(),
            id: None,
            ttl_s: DEFAULT_TTL_S,
            isolation: "auto".into(),
            network: true,
            limits: Limits::default(),
            gpus: 0,
            env: Vec::new(),
            keep_files: false,
            allow_hosts: Vec::new(),
            time: None,
            partition: None,
        }
    }
}

/// Resource limits as callers write them; None: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Limits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// CPUs, fractions allowed (1.5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The agent's limits, or what is wrong with these.
    fn to_protocol(&self) -> Result<SandboxLimits, String> {
        fn at_least_1<T: PartialOrd + From<u8> + Copy>(
            name: &str,
            v: Option<T>,
        ) -> Result<Option<T>, String> {
            match v {
                Some(n) if n < T::from(1) => Err(format!("{name} must be at least 1")),
                v => Ok(v),
            }
        }
        let cpu_millis = match self.cpus {
            None => None,
            Some(c) if c.is_finite() && c >= 0.001 && c * 1000.0 <= f64::from(u32::MAX) => {
                Some((c * 1000.0).round() as u32)
            }
            Some(c) => return Err(format!("cpus must be a positive number, got {c}")),
        };
        Ok(SandboxLimits {
            memory_mb: at_least_1("memory_mb", self.memory_mb)?,
            cpu_millis,
            pids: at_least_1("pids", self.pids)?,
            disk_mb: at_least_1("disk_mb", self.disk_mb)?,
        })
    }

    fn of(limits: &SandboxLimits) -> Limits {
        Limits {
            memory_mb: limits.memory_mb,
            cpus: limits.cpu_millis.map(|m| f64::from(m) / 1000.0),
            pids: limits.pids,
            disk_mb: limits.disk_mb,
        }
    }
}

/// A sandbox as both front ends show it.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxView {
    /// `HOST/ID`: the `sandbox_name` every other tool takes.
    pub sandbox_name: String,
    /// `running`, `paused`, `expired`, `deleted` or `failed`; a Slurm allocation
    /// may be `pending` (the reason in `note`).
    pub state: &'static str,
    /// UTC.
    pub expires_at: String,
    /// What applies: `bwrap`, `landlock` or `none`.
    pub isolation: &'static str,
    pub network: bool,
    #[serde(skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// How the limits are enforced, and what is not.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub enforcement: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Where commands start and relative paths lead.
    pub work_dir: String,
    /// Its files stay on the host after it ends.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kept_files: bool,
    /// Exposed ports and, where this controller serves one, its URL.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ports: std::collections::BTreeMap<u16, String>,
    /// Why it ended, or what its isolation lacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl SandboxView {
    /// `info` of a sandbox on the configured host `host`.
    pub fn of(host: &str, info: SandboxInfo) -> SandboxView {
        SandboxView {
            sandbox_name: format!("{host}/{}", info.id),
            state: state_name(info.state),
            expires_at: utc_time(info.expires_unix),
            isolation: isolation_name(info.isolation),
            network: info.network,
            limits: Limits::of(&info.limits),
            enforcement: info.enforcement,
            gpus: info.gpus,
            work_dir: info.work_dir,
            kept_files: info.kept_files,
            ports: info.ports.iter().map(|p| (*p, String::new())).collect(),
            note: info.note,
        }
    }

    /// Running, paused, or (a Slurm allocation) queued to run.
    pub fn is_live(&self) -> bool {
        self.state == state_name(SandboxState::Running)
            || self.state == state_name(SandboxState::Paused)
            || self.state == "pending"
    }
}

/// One row of `list_sandboxes`: a configured host and, when its host
/// answered, the isolated sandboxes live on it.
#[derive(Debug, Serialize)]
pub struct HostRow {
    #[serde(flatten)]
    pub status: HostStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<Vec<SandboxView>>,
}

pub fn state_name(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Running => "running",
        SandboxState::Expired => "expired",
        SandboxState::Deleted => "deleted",
        SandboxState::Failed => "failed",
        SandboxState::Paused => "paused",
    }
}

pub fn isolation_name(isolation: Isolation) -> &'static str {
    match isolation {
        Isolation::Auto => "auto",
        Isolation::Bwrap => "bwrap",
        Isolation::Landlock => "landlock",
        Isolation::None => "none",
    }
}

pub fn parse_isolation(s: &str) -> Result<Isolation, String> {
    match s {
        "auto" => Ok(Isolation::Auto),
        "bwrap" => Ok(Isolation::Bwrap),
        "landlock" => Ok(Isolation::Landlock),
        "none" => Ok(Isolation::None),
        _ => Err(format!(
            "isolation must be auto, bwrap, landlock or none, got {s:?}"
        )),
    }
}

/// `ttl_s` in milliseconds, checked to lie within [`MIN_TTL_S`] and
/// [`MAX_TTL_S`].
pub fn ttl_ms(ttl_s: f64) -> Result<u64, String> {
    if !(MIN_TTL_S..=MAX_TTL_S).contains(&ttl_s) {
        return Err(format!(
            "ttl_s must be {MIN_TTL_S} to {MAX_TTL_S} seconds ({} days), got {ttl_s}; renew a sandbox to keep it longer",
            MAX_TTL_S / 86_400.0
        ));
    }
    Ok((ttl_s * 1000.0).round() as u64)
}

/// Seconds from a person's `90s`, `30m`, `1h`, `2d` or plain seconds.
pub fn parse_ttl(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((i, 's')) => (&text[..i], 1.0),
        Some((i, 'm')) => (&text[..i], 60.0),
        Some((i, 'h')) => (&text[..i], 3600.0),
        Some((i, 'd')) => (&text[..i], 86_400.0),
        _ => (text, 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() => Ok(n * unit),
        _ => Err(format!(
            "bad duration {text:?}: give seconds, or a number and s, m, h or d (90s, 30m, 1h, 2d)"
        )),
    }
}

/// The agent's request for `r`, or what is wrong with it; at most
/// `max_sandboxes` live on the host (0: no cap).
pub fn spec(r: &CreateRequest, max_sandboxes: u32) -> Result<SandboxSpec, String> {
    if let Some(id) = &r.id {
        check_sandbox_id(id)?;
    }
    for (name, _) in &r.env {
        super::exec::check_env_name(name)?;
    }
    Ok(SandboxSpec {
        id: r.id.clone(),
        ttl_ms: ttl_ms(r.ttl_s)?,
        isolation: parse_isolation(&r.isolation)?,
        network: r.network,
        limits: r.limits.to_protocol()?,
        gpus: r.gpus,
        env: r.env.clone(),
        keep_files: r.keep_files,
        max_sandboxes,
        allow_hosts: r.allow_hosts.clone(),
        // The host's, from its config: never a call's.
        sandbox_uids: None,
    })
}

/// Makes a sandbox on `r.host` (for [`AUTO`], the idlest configured host
/// with `r.gpus` GPUs free; the active sandbox stays as it is). On a Slurm
/// cluster it is an allocation ([`super::slurm`]); `progress` hears what
/// that waits for.
pub async fn create(
    fleet: &Fleet,
    r: CreateRequest,
    progress: &(dyn Fn(String) + Send + Sync),
) -> Result<SandboxView, String> {
    let (host, partition) = pick_host(fleet, &r.host, r.gpus).await?;
    let env = r.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    fleet
        .policy
        .check_env(host.name(), env)
        .map_err(|refusal| refusal.to_string())?;
    if let Some(defaults) = host.config.slurm.clone() {
        if !r.allow_hosts.is_empty() {
            return Err(format!(
                "allow_hosts is for a host's bwrap sandboxes; {} is a Slurm cluster, whose network is the cluster's",
                host.name()
            ));
        }
        let mut allocation = allocation_request(host.name(), &r)?;
        allocation.partition = allocation.partition.or(partition);
        let made = slurm::create(fleet, &host, &defaults, &allocation, progress).await?;
        return Ok(allocation_view(host.name(), &made));
    }
    if r.time.is_some() || r.partition.is_some() {
        return Err(format!(
            "time and partition are for Slurm clusters; {} is not one",
            host.name()
        ));
    }
    let mut r = r;
    if r.allow_hosts.is_empty() && !r.network {
        r.allow_hosts = host.config.allow_hosts.clone();
    }
    let mut spec = spec(&r, fleet.config.max_sandboxes_per_host)?;
    spec.sandbox_uids = host.config.sandbox_uids;
    // HOST/ID must name this sandbox and nothing configured.
    let configured = |id: &str| fleet.names().contains(&format!("{}/{id}", host.name()));
    if let Some(id) = &spec.id
        && configured(id)
    {
        return Err(format!(
            "{}/{id} is a configured sandbox's name; pick another id",
            host.name()
        ));
    }
    let answer = ask(&host, Request::SandboxCreate(spec)).await;
    let view = one(host.name(), answer, "creating a sandbox")?;
    let id = view.sandbox_name.rsplit('/').next().unwrap_or_default();
    if configured(id) {
        let _ = ask(&host, Request::SandboxDelete { id: id.to_string() }).await;
        return Err(format!(
            "{} was drawn, a configured sandbox's name; deleted: create again",
            view.sandbox_name
        ));
    }
    Ok(view)
}

/// The host a sandbox would be made on: `host` itself (a configured
/// sandbox), or for [`AUTO`] the idlest configured one with `gpus` GPUs
/// free; for a Slurm cluster picked so, also the partition that has them.
pub async fn pick_host(
    fleet: &Fleet,
    host: &str,
    gpus: u32,
) -> Result<(Arc<Session>, Option<String>), String> {
    let (host, partition) = if host == AUTO && fleet.get(Some(AUTO)).is_err() {
        let need = Requirements {
            min_gpus: (gpus > 0).then_some(gpus),
            ..Requirements::default()
        };
        let deadline = fleet.config.connect_timeout + MEASURE_EXTRA;
        let (name, resources) = fleet.idlest(&need, deadline, &AtomicUsize::new(0)).await?;
        (fleet.get(Some(&name))?, gpu_partition(&resources, gpus))
    } else {
        (fleet.get(Some(host))?, None)
    };
    if host.isolated_in().is_some() {
        return Err(format!(
            "sandboxes are made on a host ({} or auto), not in another sandbox",
            fleet.names().join(", ")
        ));
    }
    Ok((host, partition))
}

/// The partition of a cluster measured as `resources` where `gpus` GPUs
/// are free on one node.
fn gpu_partition(resources: &crate::resources::Resources, gpus: u32) -> Option<String> {
    let slurm = resources.slurm.as_ref()?;
    Some(slurm.partition_for(gpus)?.name.clone())
}

/// Makes the idlest configured host that meets `req` active (see
/// [`Fleet::idlest`]); a Slurm cluster picked for GPUs gets an allocation
/// of them, made active. Its name and idle score, or why none fits.
pub async fn select_auto(
    fleet: &Fleet,
    req: &Requirements,
    deadline: Duration,
    answered: &AtomicUsize,
    progress: &(dyn Fn(String) + Send + Sync),
) -> Result<(String, f64), String> {
    let (name, resources) = fleet.idlest(req, deadline, answered).await?;
    let host = fleet.get(Some(&name))?;
    if host.config.slurm.is_none() {
        fleet.select(&name)?;
        return Ok((name, resources.idle_score));
    }
    // Asked again: the allocation an earlier call made active serves.
    let active = fleet.active_name();
    if active.starts_with(&format!("{name}/job-"))
        && status(fleet, &active).await.is_ok_and(|v| v.is_live())
    {
        return Ok((active, resources.idle_score));
    }
    let gpus = req.min_gpus.unwrap_or(0);
    let request = CreateRequest {
        host: name,
        gpus,
        partition: gpu_partition(&resources, gpus),
        ..CreateRequest::default()
    };
    let view = create(fleet, request, progress).await?;
    fleet.select(&view.sandbox_name)?;
    Ok((view.sandbox_name, resources.idle_score))
}

/// The sandbox named `name` (`HOST/ID`), live or recently ended.
pub async fn status(fleet: &Fleet, name: &str) -> Result<SandboxView, String> {
    let (host, id) = fleet.isolated(name)?;
    if let Some(job) = allocation(&host, &id)? {
        let found = slurm::status(&host, job).await?;
        return Ok(allocation_view(host.name(), &found));
    }
    let all = list_on(&host).await?;
    let mut view = all
        .into_iter()
        .find(|s| s.sandbox_name == name)
        .ok_or_else(|| format!("no sandbox {id} on {} (ended, or never made)", host.name()))?;
    for (port, url) in &mut view.ports {
        *url = fleet.forward_url(name, *port).unwrap_or_default();
    }
    Ok(view)
}

/// Gives `name` `ttl_s` more seconds from now.
pub async fn renew(fleet: &Fleet, name: &str, ttl_s: f64) -> Result<SandboxView, String> {
    let ttl_ms = ttl_ms(ttl_s)?;
    let (host, id) = fleet.isolated(name)?;
    if let Some(job) = allocation(&host, &id)? {
        let renewed = slurm::renew(fleet, &host, job, ttl_ms / 1000).await?;
        return Ok(allocation_view(host.name(), &renewed));
    }
    let answer = ask(&host, Request::SandboxRenew { id, ttl_ms }).await;
    one(host.name(), answer, "renewing a sandbox")
}

/// Ends every process of `name` and removes its files (unless it keeps
/// them).
pub async fn delete(fleet: &Fleet, name: &str) -> Result<SandboxView, String> {
    let (host, id) = fleet.isolated(name)?;
    if let Some(job) = allocation(&host, &id)? {
        let deleted = slurm::delete(fleet, &host, job).await?;
        return Ok(allocation_view(host.name(), &deleted));
    }
    fleet.close_forwards(name);
    let answer = ask(&host, Request::SandboxDelete { id }).await;
    one(host.name(), answer, "deleting a sandbox")
}

/// This user's sandboxes on `host` (a configured host), live and
/// recently ended, newest first.
pub async fn list_on(host: &Session) -> Result<Vec<SandboxView>, String> {
    if host.config.slurm.is_some() {
        let listed = slurm::list_on(host).await?;
        return Ok(listed
            .iter()
            .map(|a| allocation_view(host.name(), a))
            .collect());
    }
    match ask(host, Request::SandboxList)
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Sandboxes(all) => Ok(all
            .into_iter()
            .map(|info| SandboxView::of(host.name(), info))
            .collect()),
        other => Err(unexpected("listing sandboxes", other).to_string()),
    }
}

/// What `r` asks of the cluster `cluster`, or why a cluster cannot give it
/// (never silently dropped).
fn allocation_request(cluster: &str, r: &CreateRequest) -> Result<AllocationRequest, String> {
    let refuse = |what: &str| Err(format!("{cluster} is a Slurm cluster: {what}"));
    if r.id.is_some() {
        return refuse("its sandboxes are named by their Slurm job (job-N); give no id");
    }
    if !matches!(r.isolation.as_str(), "auto" | "slurm") {
        return refuse(
            "a sandbox there is an allocation, confined by Slurm (isolation \"auto\"); bwrap, landlock and none are for hosts",
        );
    }
    if !r.network {
        return refuse("an allocation cannot be cut off the network");
    }
    if !r.env.is_empty() {
        return refuse("give env per command (exec_bash's env), not to the allocation");
    }
    if r.limits.pids.is_some() || r.limits.disk_mb.is_some() {
        return refuse("Slurm limits cpus and memory_mb (and gpus, time), not pids or disk_mb");
    }
    Ok(AllocationRequest {
        ttl_s: ttl_ms(r.ttl_s)? / 1000,
        time: r.time.clone(),
        partition: r.partition.clone(),
        cpus: r.limits.cpus,
        memory_mb: r.limits.memory_mb,
        gpus: r.gpus,
    })
}

/// A Slurm allocation on `login` as a sandbox.
fn allocation_view(login: &str, a: &Allocation) -> SandboxView {
    let q = &a.queued;
    let pending = q.state == "PENDING";
    SandboxView {
        sandbox_name: format!("{login}/job-{}", q.job),
        state: match q.state.as_str() {
            "RUNNING" => "running",
            "PENDING" | "CONFIGURING" | "REQUEUED" | "RESIZING" => "pending",
            "CANCELLED" => "deleted",
            "TIMEOUT" | "DEADLINE" | "COMPLETED" | "COMPLETING" => "expired",
            _ => "failed",
        },
        expires_at: if a.ends_unix > 0 {
            utc_time(a.ends_unix)
        } else {
            String::new()
        },
        isolation: "slurm",
        network: true,
        limits: Limits {
            memory_mb: q.memory_mb,
            cpus: q.cpus.map(f64::from),
            pids: None,
            disk_mb: None,
        },
        enforcement: if q.state == "RUNNING" {
            format!("Slurm job {} on {} ({})", q.job, q.node, q.partition)
        } else {
            format!("Slurm job {} ({})", q.job, q.partition)
        },
        gpus: Vec::new(),
        work_dir: a.work_dir.clone(),
        kept_files: false,
        ports: Default::default(),
        note: match q.reason.as_str() {
            // Not yet looked at by the scheduler.
            "None" | "" if pending => Some("waiting for Slurm".to_string()),
            reason if pending => Some(format!("waiting for Slurm: {reason}")),
            _ => a.note.clone(),
        },
    }
}

/// The Slurm job of sandbox `id` on `host`, when `host` is a cluster.
fn allocation(host: &Session, id: &str) -> Result<Option<u64>, String> {
    match host.config.slurm {
        Some(_) => crate::fleet::allocation_job(host.name(), id).map(Some),
        None => Ok(None),
    }
}

/// The sandboxes on each of `hosts` (configured hosts), asked
/// concurrently, each within `deadline`: the host's answer or why there is
/// none.
pub async fn list(
    fleet: &Fleet,
    hosts: &[String],
    deadline: Duration,
) -> Vec<(String, Result<Vec<SandboxView>, String>)> {
    futures::future::join_all(hosts.iter().map(|name| async move {
        let listed = async {
            let host = fleet.get(Some(name))?;
            match tokio::time::timeout(deadline, list_on(&host)).await {
                Ok(result) => result,
                Err(_) => Err(no_answer(deadline)),
            }
        };
        (name.clone(), listed.await)
    }))
    .await
}

/// `list_sandboxes`' rows: every configured host (see [`Fleet::list`]),
/// and under each one connected, the isolated sandboxes live on it.
///
/// Each host on its own, all at once. A measured host is connected first
/// (once: a dead host costs its timeout once), then asked for its
/// resources and its sandboxes together, so both requests share one round
/// trip (and one packet each way).
pub async fn hosts(fleet: &Fleet, check_resources: bool, deadline: Duration) -> Vec<HostRow> {
    let active = fleet.active_name();
    let rows = fleet.sessions().iter().map(|session| {
        let active = &active;
        async move {
            let status = Fleet::status(session, active);
            let live = |listed: Result<Vec<SandboxView>, String>| {
                listed
                    .ok()
                    .map(|all| all.into_iter().filter(SandboxView::is_live).collect())
            };
            if !check_resources {
                let sandboxes = match status.connection_alive {
                    true => match tokio::time::timeout(deadline, list_on(session)).await {
                        Ok(listed) => live(listed),
                        Err(_) => None,
                    },
                    false => None,
                };
                return HostRow { status, sandboxes };
            }
            // One deadline for connecting and measuring; a listing that
            // misses it only leaves the row without its sandboxes.
            let until = tokio::time::Instant::now() + deadline;
            let connected = match tokio::time::timeout_at(until, session.connection()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(no_answer(deadline)),
            };
            if let Err(e) = connected {
                return HostRow {
                    status: status.measured(Err(e)),
                    sandboxes: None,
                };
            }
            let (resources, listed) = futures::join!(
                tokio::time::timeout_at(until, Fleet::resources(session, deadline)),
                tokio::time::timeout_at(until, list_on(session))
            );
            let resources = resources.unwrap_or_else(|_| Err(no_answer(deadline)));
            let sandboxes = match (&resources, listed) {
                (Ok(_), Ok(listed)) => live(listed),
                _ => None,
            };
            HostRow {
                status: status.measured(resources),
                sandboxes,
            }
        }
    });
    futures::future::join_all(rows).await
}

/// The sandbox an agent's answer describes, on `host`.
fn one(
    host: &str,
    answer: Result<Response, crate::session::CallError>,
    what: &str,
) -> Result<SandboxView, String> {
    match answer.map_err(|e| e.to_string())? {
        Response::Sandbox(info) => Ok(SandboxView::of(host, info)),
        other => Err(unexpected(what, other).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreateRequest {
        CreateRequest {
            host: "local".into(),
            ..CreateRequest::default()
        }
    }

    #[test]
    fn a_request_becomes_the_agents_spec() {
        let r = CreateRequest {
            id: Some("sbx-a1".into()),
            ttl_s: 90.0,
            isolation: "bwrap".into(),
            network: false,
            limits: Limits {
                memory_mb: Some(512),
                cpus: Some(1.5),
                pids: Some(64),
                disk_mb: None,
            },
            gpus: 1,
            env: vec![("CFLAGS".into(), "-O2".into())],
            keep_files: true,
            ..request()
        };
        let spec = spec(&r, 8).unwrap();
        assert_eq!(spec.id.as_deref(), Some("sbx-a1"));
        assert_eq!(spec.ttl_ms, 90_000);
        assert_eq!(spec.isolation, Isolation::Bwrap);
        assert!(!spec.network && spec.keep_files);
        assert_eq!(
            spec.limits,
            SandboxLimits {
                memory_mb: Some(512),
                cpu_millis: Some(1500),
                pids: Some(64),
                disk_mb: None
            }
        );
        assert_eq!((spec.gpus, spec.max_sandboxes), (1, 8));
        assert_eq!(spec.env, vec![("CFLAGS".into(), "-O2".into())]);
        let defaults = super::spec(&request(), 0).unwrap();
        assert_eq!(
            (defaults.ttl_ms, defaults.isolation, defaults.network),
            (3_600_000, Isolation::Auto, true)
        );
        assert_eq!(defaults.limits, SandboxLimits::default());
    }

    #[test]
    fn ttls_lie_within_a_second_and_a_week() {
        assert_eq!(ttl_ms(1.0), Ok(1000));
        assert_eq!(ttl_ms(MAX_TTL_S), Ok(604_800_000));
        for bad in [0.0, 0.5, -1.0, MAX_TTL_S + 1.0, f64::NAN, f64::INFINITY] {
            let err = ttl_ms(bad).unwrap_err();
            assert!(err.contains("ttl_s must be 1 to 604800"), "{bad}: {err}");
        }
    }

    #[test]
    fn people_write_durations_with_units() {
        assert_eq!(parse_ttl("90"), Ok(90.0));
        assert_eq!(parse_ttl("90s"), Ok(90.0));
        assert_eq!(parse_ttl("30m"), Ok(1800.0));
        assert_eq!(parse_ttl("1.5h"), Ok(5400.0));
        assert_eq!(parse_ttl("2d"), Ok(172_800.0));
        for bad in ["", "h", "1w", "abc", "inf"] {
            assert!(
                parse_ttl(bad).unwrap_err().contains("bad duration"),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let err = |r: CreateRequest| spec(&r, 8).unwrap_err();
        let e = err(CreateRequest {
            isolation: "docker".into(),
            ..request()
        });
        assert!(e.contains("auto, bwrap, landlock or none"), "{e}");
        for name in ["BASH_ENV", "LD_PRELOAD", "A-B", "1X", ""] {
            let e = err(CreateRequest {
                env: vec![(name.into(), "x".into())],
                ..request()
            });
            assert!(e.contains("env"), "{name}: {e}");
        }
        let e = err(CreateRequest {
            id: Some("Big_ID".into()),
            ..request()
        });
        assert!(e.contains("bad sandbox id"), "{e}");
        for (limits, field) in [
            (
                Limits {
                    memory_mb: Some(0),
                    ..Limits::default()
                },
                "memory_mb",
            ),
            (
                Limits {
                    cpus: Some(0.0),
                    ..Limits::default()
                },
                "cpus",
            ),
            (
                Limits {
                    cpus: Some(f64::NAN),
                    ..Limits::default()
                },
                "cpus",
            ),
            (
                Limits {
                    pids: Some(0),
                    ..Limits::default()
                },
                "pids",
            ),
        ] {
            let e = err(CreateRequest {
                limits,
                ..request()
            });
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn a_cluster_refuses_what_slurm_cannot_give_and_shows_its_queue() {
        let r = |f: fn(&mut CreateRequest)| {
            let mut r = CreateRequest {
                host: "hpc".into(),
                ..CreateRequest::default()
            };
            f(&mut r);
            allocation_request("hpc", &r)
        };
        let ok = r(|r| {
            r.gpus = 2;
            r.limits.cpus = Some(8.0);
        })
        .unwrap();
        assert_eq!((ok.ttl_s, ok.gpus, ok.cpus), (3600, 2, Some(8.0)));
        for (bad, says) in [
            (r(|r| r.isolation = "bwrap".into()), "isolation"),
            (r(|r| r.network = false), "network"),
            (r(|r| r.env = vec![("A".into(), "b".into())]), "env"),
            (r(|r| r.limits.pids = Some(10)), "pids"),
            (r(|r| r.id = Some("x".into())), "job-N"),
            (r(|r| r.ttl_s = 0.0), "ttl_s"),
        ] {
            let e = bad.unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }

        let queued = slurm::parse_queue("18|PENDING|Resources||2:00:00|1|2G|gpu\n");
        let pending = Allocation {
            queued: queued[0].clone(),
            deadline: None,
            work_dir: String::new(),
            ends_unix: 0,
            note: None,
        };
        let v = allocation_view("hpc", &pending);
        assert_eq!(
            (v.sandbox_name.as_str(), v.state, v.isolation),
            ("hpc/job-18", "pending", "slurm")
        );
        assert_eq!(v.note.as_deref(), Some("waiting for Slurm: Resources"));
        assert_eq!(v.limits.memory_mb, Some(2048));
        assert!(v.is_live());
    }

    #[test]
    fn views_are_compact() {
        let info = SandboxInfo {
            id: "sbx-3f2a".into(),
            state: SandboxState::Running,
            created_unix: 0,
            expires_unix: 951_782_400,
            isolation: Isolation::None,
            network: true,
            limits: SandboxLimits {
                cpu_millis: Some(250),
                ..SandboxLimits::default()
            },
            enforcement: "rlimits+watchdog".into(),
            gpus: Vec::new(),
            work_dir: "/w".into(),
            kept_files: false,
            ports: Vec::new(),
            note: None,
        };
        let view = SandboxView::of("gpu1", info);
        assert!(view.is_live());
        assert_eq!(
            serde_json::to_value(&view).unwrap(),
            serde_json::json!({
                "sandbox_name": "gpu1/sbx-3f2a",
                "state": "running",
                "expires_at": "2000-02-29T00:00:00Z",
                "isolation": "none",
                "network": true,
                "limits": {"cpus": 0.25},
                "enforcement": "rlimits+watchdog",
                "work_dir": "/w"
            })
        );
    }
}
