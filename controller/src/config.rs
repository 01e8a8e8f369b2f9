//! Configuration: which hosts exist and how to reach them.
//!
//! Sources, merged in this order:
//! 1. The TOML file `$OUTPOST_CONFIG`, else `~/.config/outpost/config.toml` (optional).
//! 2. remote-sandbox-mcp's environment variables (`REMOTE_SANDBOX_LIST`, or the
//!    single-host `REMOTE_HOST`/`REMOTE_PORT`/`REMOTE_USER`/`REMOTE_PASSWORD`/
//!    `REMOTE_KEY_FILE`/`REMOTE_KEY_PASSPHRASE`), so users of that server swap the
//!    command and keep their settings.
//! 3. `~/.ssh/config` fills what neither gave for a host: `HostName`, `Port`,
//!    `User`, `IdentityFile`, `IdentitiesOnly`, `ProxyJump`,
//!    `StrictHostKeyChecking`, `UserKnownHostsFile`, `ConnectTimeout`, from
//!    its `Host` and `Match` blocks and `Include`s as OpenSSH reads them
//!    ([`ssh_config`]); options that would make Outpost connect elsewhere or
//!    otherwise than `ssh` (`ProxyCommand`, …) are an error.
//!
//! The `local` sandbox (the same agent run as a child process) is always offered
//! unless the file says `local = false`; with no other sandbox it is the active one.

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod slurm;
mod ssh_config;
mod target;
pub use slurm::{SlurmDefaults, check_name as check_slurm_name, check_time as check_slurm_time};
use ssh_config::SshConfigFile;
pub use target::default_keys;
use target::resolve;

/// Name of the built-in sandbox that runs on the controller's own machine.
pub const LOCAL_HOST: &str = "local";

/// The agent's state directory on a host unless `remote_dir` says (`~` is
/// the host's home).
pub const DEFAULT_REMOTE_DIR: &str = "~/.outpost";

/// Live isolated sandboxes one user may have on a host, unless the file says.
pub const DEFAULT_MAX_SANDBOXES_PER_HOST: u32 = 8;

/// Reads `name` as a sandbox name: a configured host (`configured`
/// says which names are), else `HOST/ID`, isolated sandbox ID made on the
/// configured host HOST. Returns the configured name and the id, if any;
/// None when it is neither. The id is not checked here ([`check_sandbox_id`]).
pub fn split_sandbox_name(
    name: &str,
    configured: impl Fn(&str) -> bool,
) -> Option<(&str, Option<&str>)> {
    if configured(name) {
        return Some((name, None));
    }
    let (host, id) = name.rsplit_once('/')?;
    configured(host).then_some((host, Some(id)))
}

/// Longest isolated sandbox id.
pub const MAX_SANDBOX_ID_LEN: usize = 32;

/// An isolated sandbox id: `^[a-z0-9][a-z0-9-]{0,31}$`.
/// `FIRST-LAST`, uids a root agent may give its sandboxes.
fn parse_uid_range(raw: &str) -> Result<(u32, u32)> {
    let bad = || {
        anyhow::anyhow!(
            "sandbox_uids {raw:?}: want \"FIRST-LAST\", free uids from 1000 to 4294967294"
        )
    };
    let (first, last) = raw.split_once('-').ok_or_else(bad)?;
    let first: u32 = first.trim().parse().map_err(|_| bad())?;
    let last: u32 = last.trim().parse().map_err(|_| bad())?;
    if first < 1000 || first > last || last == u32::MAX {
        return Err(bad());
    }
    Ok((first, last))
}

pub fn check_sandbox_id(id: &str) -> Result<(), String> {
    let first = id
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if first && rest && id.len() <= MAX_SANDBOX_ID_LEN {
        Ok(())
    } else {
        Err(format!(
            "bad sandbox id {id:?}: 1 to {MAX_SANDBOX_ID_LEN} of a-z, 0-9 and -, not starting with -"
        ))
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The configured hosts (each a `[[sandbox]]` entry, as remote-sandbox-mcp
    /// calls them), `local` last.
    pub hosts: Vec<HostConfig>,
    /// Outpost's own known_hosts, where accepted new host keys are recorded.
    pub known_hosts: PathBuf,
    /// The user's OpenSSH known_hosts, read but never written.
    pub user_known_hosts: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// The agent for hosts like this one and for `local`; default: the
    /// `outpost-agent` next to the `outpost` executable (`$OUTPOST_AGENT_BIN`).
    pub agent_bin: Option<PathBuf>,
    /// Where to look for portable agent builds (`$OUTPOST_AGENT_DIR`, `agent_dir`).
    pub agent_dirs: Vec<PathBuf>,
    /// Syncs larger than this (files or bytes to send) run in the background.
    pub inline_sync_max_files: u64,
    pub inline_sync_max_bytes: u64,
    /// When set, local paths given to sync tools must lie inside one of these.
    pub local_roots: Option<Vec<PathBuf>>,
    /// `$OUTPOST_HOME` (default `~/.outpost`): known hosts, event positions.
    pub home: PathBuf,
    /// What runs on this machine when a job event arrives.
    pub hooks: Hooks,
    /// List the watch tools too (`REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS=1`).
    pub expose_advanced_tools: bool,
    /// Which commands may run where (`[policy]` and each sandbox's `policy`);
    /// from the config file only.
    pub policy: PolicyRules,
    /// `[client_budget_s]`: how long MCP clients whose name contains a key
    /// wait for a tool call (`default`: any other client), overriding the
    /// built-in table; 0 means as long as it takes.
    pub client_budgets: Vec<(String, f64)>,
    /// `max_sandboxes_per_host`: live isolated sandboxes this user may have
    /// on one host (0: no cap).
    pub max_sandboxes_per_host: u32,
    /// `[oauth]`: an external authorization server the HTTP server trusts
    /// instead of its own.
    pub oauth: Option<ExternalOauth>,
    pub source: String,
}

/// `[oauth]`: who issues access tokens (`issuer`, exactly as their `iss`)
/// and the keys that sign them (a JWKS file); the audience they must name
/// (default: the MCP URL the request reached).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalOauth {
    pub issuer: String,
    pub jwks: PathBuf,
    pub audience: Option<String>,
}

/// The `[hooks]` section. Only the config file sets these: a tool call that
/// could name a URL or a command would let whoever drives the MCP client run
/// commands on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Hooks {
    /// POSTed each event as JSON (http:// only).
    pub webhook_url: Option<HttpUrl>,
    /// Run by `sh -c` with the event in its environment.
    pub event_command: Option<String>,
    /// Failed reachability checks in a row before `host_unreachable`.
    pub alert_after_failures: u32,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            webhook_url: None,
            event_command: None,
            alert_after_failures: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    pub name: String,
    pub target: Target,
    /// Set for a cluster's login node: `create_sandbox` on it is a Slurm
    /// allocation.
    pub slurm: Option<SlurmDefaults>,
    /// What a `network: false` sandbox on it may reach when the call names
    /// nothing (`allow_hosts`).
    pub allow_hosts: Vec<String>,
    /// Where its agent runs as root: the uids (first, last) its isolated
    /// sandboxes may run as (`sandbox_uids = "FIRST-LAST"`).
    pub sandbox_uids: Option<(u32, u32)>,
}

// One per sandbox: the size of a boxed-or-not target does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Local,
    Ssh(SshTarget),
    /// A command that gives the agent's stdin and stdout (`kubectl exec -i`,
    /// `docker exec -i`, `srun`, …).
    Command(CommandTarget),
}

/// The placeholder a command template's shell command goes into.
pub const COMMAND_PLACEHOLDER: &str = "{command}";

/// A host reached by running a command on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandTarget {
    /// The argv template: exactly one element is [`COMMAND_PLACEHOLDER`],
    /// replaced by a shell command that the template hands to a shell.
    pub argv: Vec<String>,
    /// The agent's state directory in the target; `~` is its home.
    pub remote_dir: String,
}

impl CommandTarget {
    /// Checks `argv` as a template: a program, and `{command}` once as a
    /// whole element.
    pub fn new(argv: Vec<String>, remote_dir: String) -> Result<CommandTarget, String> {
        let Some(program) = argv.first() else {
            return Err("\"command\" is empty; give the program and its arguments, one of them \"{command}\", e.g. [\"kubectl\", \"exec\", \"-i\", \"POD\", \"--\", \"sh\", \"-c\", \"{command}\"]".into());
        };
        if program.trim().is_empty() {
            return Err("\"command\" starts with an empty program name".into());
        }
        if program == COMMAND_PLACEHOLDER {
            return Err("\"command\" must start with a program, not \"{command}\" (e.g. [\"sh\", \"-c\", \"{command}\"])".into());
        }
        if let Some(part) = argv
            .iter()
            .find(|a| a.contains(COMMAND_PLACEHOLDER) && *a != COMMAND_PLACEHOLDER)
        {
            return Err(format!(
                "\"command\" has {part:?}: \"{{command}}\" must be an element of its own (the whole shell command goes there, e.g. [\"sh\", \"-c\", \"{{command}}\"])"
            ));
        }
        match argv.iter().filter(|a| *a == COMMAND_PLACEHOLDER).count() {
            1 => Ok(CommandTarget { argv, remote_dir }),
            0 => Err(format!(
                "\"command\" {argv:?} has no \"{{command}}\" element: put it where the shell command goes, e.g. [\"docker\", \"exec\", \"-i\", \"CTR\", \"sh\", \"-c\", \"{{command}}\"]"
            )),
            n => Err(format!(
                "\"command\" {argv:?} has \"{{command}}\" {n} times; it must appear exactly once"
            )),
        }
    }

    /// The program the template runs.
    pub fn program(&self) -> &str {
        &self.argv[0]
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SshTarget {
    /// What the user wrote (an alias or a hostname); shown in listings.
    pub host: String,
    /// What is dialled after `~/.ssh/config` resolution.
    pub hostname: String,
    pub port: u16,
    pub user: String,
    pub key_file: Option<PathBuf>,
    pub key_passphrase: Option<String>,
    pub password: Option<String>,
    /// IdentityFile entries from `~/.ssh/config`.
    pub identity_files: Vec<PathBuf>,
    /// `IdentitiesOnly yes`: offer only the configured keys (of ssh-agent's,
    /// those whose `.pub` sits beside an identity file), never the rest.
    pub identities_only: bool,
    /// `ConnectTimeout` from `~/.ssh/config`; None: the global one.
    pub connect_timeout: Option<Duration>,
    /// Refuse unknown host keys instead of recording them (accept-new).
    pub strict_host_keys: bool,
    /// The agent's state directory on the host; `~` is the remote home.
    pub remote_dir: String,
    /// Hosts to go through first, in order (OpenSSH's `ProxyJump`): each
    /// connection is opened through the one before it, and each host's key
    /// is checked against its own name.
    pub jump: Vec<SshTarget>,
    /// `UserKnownHostsFile` from `~/.ssh/config`: read instead of
    /// `~/.ssh/known_hosts` (never written). None: the default.
    pub user_known_hosts: Option<Vec<PathBuf>>,
    /// Why this sandbox cannot be reached as configured (an `~/.ssh/config`
    /// option Outpost does not follow, a bad hop): every connect fails with
    /// it, and the other sandboxes are not affected.
    pub unusable: Option<String>,
}

impl HostConfig {
    pub fn local() -> Self {
        HostConfig {
            name: LOCAL_HOST.into(),
            target: Target::Local,
            slurm: None,
            allow_hosts: Vec::new(),
            sandbox_uids: None,
        }
    }

    /// (host, port, user) as listed to MCP clients. A command target has
    /// its program as the host, and no port (0) or user (empty).
    pub fn address(&self) -> (String, u16, String) {
        match &self.target {
            Target::Local => ("localhost".into(), 0, current_user()),
            Target::Ssh(t) => (t.host.clone(), t.port, t.user.clone()),
            Target::Command(t) => (t.program().to_string(), 0, String::new()),
        }
    }
}

/// One entry of `REMOTE_SANDBOX_LIST` or `[[sandbox]]` in the TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Option<String>,
    host: Option<String>,
    /// Instead of SSH: an argv template with one `{command}` element that
    /// gives the agent's stdin and stdout (`kubectl exec -i …`).
    command: Option<Vec<String>>,
    port: Option<u16>,
    user: Option<String>,
    password: Option<String>,
    key_file: Option<String>,
    key_passphrase: Option<String>,
    strict_host_keys: Option<bool>,
    remote_dir: Option<String>,
    /// `[user@]host[:port]` hops, comma-separated, as OpenSSH's `ProxyJump`
    /// (also read from `~/.ssh/config`); "none" for a direct connection.
    proxy_jump: Option<String>,
    /// Command rules for this sandbox (config file only).
    policy: Option<RawRules>,
    /// A cluster's login node: allocation defaults (config file only).
    slurm: Option<slurm::RawSlurm>,
    /// Default `allow_hosts` of its `network: false` sandboxes.
    allow_hosts: Option<Vec<String>>,
    /// `FIRST-LAST`: the uids a root agent's sandboxes run as.
    sandbox_uids: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// Offer the `local` sandbox (default true).
    local: Option<bool>,
    strict_host_keys: Option<bool>,
    connect_timeout_s: Option<f64>,
    known_hosts: Option<String>,
    ssh_config: Option<String>,
    agent_dir: Option<String>,
    local_roots: Option<Vec<String>>,
    hooks: Option<RawHooks>,
    policy: Option<RawPolicy>,
    oauth: Option<ExternalOauth>,
    #[serde(default)]
    client_budget_s: BTreeMap<String, f64>,
    max_sandboxes_per_host: Option<u32>,
    #[serde(default)]
    sandbox: Vec<RawHost>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHooks {
    webhook_url: Option<String>,
    event_command: Option<String>,
    alert_after_failures: Option<u32>,
}

impl RawHooks {
    fn resolve(self) -> Result<Hooks> {
        let webhook_url = match self.webhook_url.filter(|u| !u.trim().is_empty()) {
            Some(url) => Some(
                HttpUrl::parse(url.trim())
                    .map_err(|e| anyhow::anyhow!("[hooks] webhook_url: {e}"))?,
            ),
            None => None,
        };
        let alert_after_failures = self.alert_after_failures.unwrap_or(2);
        if alert_after_failures == 0 {
            bail!("[hooks] alert_after_failures must be 1 or more");
        }
        Ok(Hooks {
            webhook_url,
            event_command: self.event_command.filter(|c| !c.trim().is_empty()),
            alert_after_failures,
        })
    }
}

/// `[client_budget_s]`, checked: keys lowercased, longest first (the most
/// specific name wins), seconds finite and not negative.
fn client_budgets(raw: &BTreeMap<String, f64>) -> Result<Vec<(String, f64)>> {
    let mut budgets = Vec::new();
    for (name, &seconds) in raw {
        if !(seconds >= 0.0 && seconds.is_finite()) {
            bail!("[client_budget_s] {name:?} must be 0 or more seconds, got {seconds}");
        }
        if name.trim().is_empty() {
            bail!("[client_budget_s] has an empty client name");
        }
        budgets.push((name.trim().to_lowercase(), seconds));
    }
    budgets.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    Ok(budgets)
}

/// Reads of the process environment, abstracted so tests can pass their own.
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
}

pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().filter(|v| !v.is_empty())
    }
}

impl<const N: usize> Env for [(&str, &str); N] {
    fn var(&self, key: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
            .filter(|v| !v.is_empty())
    }
}

impl Config {
    /// What no sync may read or write: Outpost's state dir (its audit log,
    /// tokens, known_hosts), the config file, and the known_hosts file.
    pub fn own_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.home.clone(), self.known_hosts.clone()];
        if !self.policy.source.is_empty() {
            files.push(PathBuf::from(&self.policy.source));
        }
        files
    }

    /// A configuration with these sandboxes and defaults for the rest (for
    /// embedding and tests; users go through [`Config::load`]).
    pub fn new(hosts: Vec<HostConfig>, known_hosts: PathBuf) -> Config {
        let home = known_hosts
            .parent()
            .map_or_else(|| PathBuf::from(".outpost"), Path::to_path_buf);
        Config {
            hosts,
            known_hosts,
            user_known_hosts: None,
            connect_timeout: Duration::from_secs(10),
            agent_bin: None,
            agent_dirs: Vec::new(),
            inline_sync_max_files: 200,
            inline_sync_max_bytes: 64 << 20,
            local_roots: None,
            home,
            hooks: Hooks::default(),
            expose_advanced_tools: false,
            policy: PolicyRules::default(),
            client_budgets: Vec::new(),
            max_sandboxes_per_host: DEFAULT_MAX_SANDBOXES_PER_HOST,
            oauth: None,
            source: "embedded".into(),
        }
    }

    /// Loads the configuration from the process environment and the usual files.
    pub fn load() -> Result<Config> {
        Config::load_from(&ProcessEnv)
    }

    /// Where a sandbox's event follower keeps its position and lock.
    pub fn events_path(&self, sandbox: &str, ext: &str) -> PathBuf {
        let name: String = sandbox
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.home.join(format!("events-{name}.{ext}"))
    }

    pub fn load_from(env: &dyn Env) -> Result<Config> {
        let home = env.var("HOME").map(PathBuf::from);
        let file_path = env.var("OUTPOST_CONFIG").map(PathBuf::from).or_else(|| {
            home.as_ref()
                .map(|h| h.join(".config/outpost/config.toml"))
                .filter(|p| p.exists())
        });
        let (file, source) = match &file_path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                let file: RawFile = toml::from_str(&text)
                    .with_context(|| format!("invalid config file {}", path.display()))?;
                (file, path.display().to_string())
            }
            None => (RawFile::default(), String::new()),
        };

        let mut raw: Vec<RawHost> = file.sandbox;
        let from_file = raw.len();
        // Policies come from the file only: remote-sandbox-mcp's variables
        // describe hosts, never rules.
        let mut sandbox_policies: Vec<(String, RawRules)> = raw
            .iter_mut()
            .filter_map(|r| {
                let rules = r.policy.take()?;
                let name = r
                    .name
                    .clone()
                    .or_else(|| r.host.clone())
                    .unwrap_or_default();
                Some((name, rules))
            })
            .collect();
        let mut sources = vec![source]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>();
        if let Some(list) = env.var("REMOTE_SANDBOX_LIST") {
            let parsed: Vec<RawHost> = serde_json::from_str(&list).context(
                "REMOTE_SANDBOX_LIST must be a JSON array of {name?, host, port?, user, password? | key_file?, key_passphrase?}",
            )?;
            if parsed.iter().any(|r| r.policy.is_some()) {
                bail!(
                    "REMOTE_SANDBOX_LIST: \"policy\" is read only from the config file ([policy] or a [[sandbox]] entry)"
                );
            }
            raw.extend(parsed);
            sources.push("REMOTE_SANDBOX_LIST".into());
        } else if let Some(host) = env.var("REMOTE_HOST") {
            let port = match env.var("REMOTE_PORT") {
                Some(p) => Some(
                    p.parse()
                        .with_context(|| format!("REMOTE_PORT must be a port number, got {p:?}"))?,
                ),
                None => None,
            };
            raw.push(RawHost {
                host: Some(host),
                port,
                user: env.var("REMOTE_USER"),
                password: env.var("REMOTE_PASSWORD"),
                key_file: env.var("REMOTE_KEY_FILE"),
                key_passphrase: env.var("REMOTE_KEY_PASSPHRASE"),
                ..Default::default()
            });
            sources.push("REMOTE_HOST".into());
        }

        let ssh_config_path = file
            .ssh_config
            .as_deref()
            .map(|p| expand_tilde(p, home.as_deref()))
            .or_else(|| home.as_ref().map(|h| h.join(".ssh/config")));
        let ssh_config = match &ssh_config_path {
            Some(p) if p.exists() => Some(SshConfigFile::load(p, home.as_deref())?),
            _ => None,
        };

        let default_user = env.var("USER").unwrap_or_else(current_user);
        let strict_default = file.strict_host_keys.unwrap_or(false);
        let mut hosts: Vec<HostConfig> = Vec::new();
        for (i, mut r) in raw.into_iter().enumerate() {
            let slurm = r.slurm.take();
            let allow_hosts = r.allow_hosts.take().unwrap_or_default();
            let sandbox_uids = r.sandbox_uids.take();
            let mut host = resolve(
                r,
                ssh_config.as_ref(),
                home.as_deref(),
                &default_user,
                strict_default,
            )?;
            host.allow_hosts = allow_hosts;
            host.sandbox_uids = sandbox_uids
                .as_deref()
                .map(parse_uid_range)
                .transpose()
                .map_err(|e| anyhow::anyhow!("sandbox {:?}: {e}", host.name))?;
            host.slurm = slurm
                .map(slurm::RawSlurm::resolve)
                .transpose()
                .map_err(|e| anyhow::anyhow!("sandbox {:?}: {e}", host.name))?;
            let taken = hosts.iter().position(|s| s.name == host.name);
            // The file is the user's considered word; the remote-sandbox-mcp
            // variables are often left over from before it.
            if taken.is_some_and(|t| t < from_file) && i >= from_file {
                tracing::warn!(
                    "sandbox {:?} is in the config file and the environment; the file's is used",
                    host.name
                );
                continue;
            }
            if taken.is_some() {
                bail!(
                    "two sandboxes are named {:?}; give each a distinct \"name\"",
                    host.name
                );
            }
            hosts.push(host);
        }
        if file.local.unwrap_or(true) && !hosts.iter().any(|s| s.name == LOCAL_HOST) {
            hosts.push(HostConfig::local());
        }
        if hosts.is_empty() {
            bail!("no sandbox configured and the local sandbox is disabled (local = false)");
        }
        let mut raw_policy = file.policy.unwrap_or_default();
        sandbox_policies.extend(std::mem::take(&mut raw_policy.sandbox));
        let policy = PolicyRules {
            global: raw_policy.rules(),
            sandboxes: sandbox_policies,
            confirm_timeout_s: raw_policy.confirm_timeout_s,
            source: file_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        };

        let outpost_home = env
            .var("OUTPOST_HOME")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".outpost")))
            .unwrap_or_else(|| PathBuf::from(".outpost"));
        let known_hosts = file
            .known_hosts
            .as_deref()
            .map(|p| expand_tilde(p, home.as_deref()))
            .unwrap_or_else(|| outpost_home.join("known_hosts"));
        let mut agent_dirs = Vec::new();
        if let Some(dir) = env.var("OUTPOST_AGENT_DIR") {
            agent_dirs.push(PathBuf::from(dir));
        }
        if let Some(dir) = &file.agent_dir {
            agent_dirs.push(expand_tilde(dir, home.as_deref()));
        }
        let connect_timeout = match file.connect_timeout_s {
            Some(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
            Some(s) => bail!("connect_timeout_s must be a positive number of seconds, got {s}"),
            None => Duration::from_secs(10),
        };
        let number = |key: &str, default: u64| -> Result<u64> {
            match env.var(key) {
                Some(v) => v
                    .parse()
                    .with_context(|| format!("{key} must be a whole number, got {v:?}")),
                None => Ok(default),
            }
        };
        Ok(Config {
            inline_sync_max_files: number("REMOTE_SANDBOX_INLINE_SYNC_MAX_FILES", 200)?,
            inline_sync_max_bytes: number("REMOTE_SANDBOX_INLINE_SYNC_MAX_BYTES", 64 << 20)?,
            local_roots: file.local_roots.as_ref().map(|roots| {
                roots
                    .iter()
                    .map(|r| expand_tilde(r, home.as_deref()))
                    .collect()
            }),
            hooks: file.hooks.unwrap_or_default().resolve()?,
            expose_advanced_tools: env.var("REMOTE_SANDBOX_EXPOSE_ADVANCED_TOOLS").is_some_and(
                |v| {
                    matches!(
                        v.trim().to_ascii_lowercase().as_str(),
                        "1" | "true" | "yes" | "on"
                    )
                },
            ),
            policy,
            client_budgets: client_budgets(&file.client_budget_s)?,
            max_sandboxes_per_host: file
                .max_sandboxes_per_host
                .unwrap_or(DEFAULT_MAX_SANDBOXES_PER_HOST),
            oauth: file.oauth.map(|o| ExternalOauth {
                jwks: expand_tilde(&o.jwks.to_string_lossy(), home.as_deref()),
                ..o
            }),
            hosts,
            known_hosts,
            home: outpost_home,
            user_known_hosts: home.map(|h| h.join(".ssh/known_hosts")),
            connect_timeout,
            agent_bin: env.var("OUTPOST_AGENT_BIN").map(PathBuf::from),
            agent_dirs,
            source: if sources.is_empty() {
                "none (local sandbox only)".into()
            } else {
                sources.join(" + ")
            },
        })
    }
}

/// Expands a leading `~` or `~/` with `home`.
pub fn expand_tilde(path: &str, home: Option<&Path>) -> PathBuf {
    match (path.strip_prefix('~'), home) {
        (Some(""), Some(h)) => h.to_path_buf(),
        (Some(rest), Some(h)) if rest.starts_with('/') => h.join(&rest[1..]),
        _ => PathBuf::from(path),
    }
}

pub fn current_user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            // SAFETY: geteuid has no preconditions; getpwuid's result is read at once.
            unsafe {
                let pw = libc::getpwuid(libc::geteuid());
                if pw.is_null() {
                    return "unknown".into();
                }
                std::ffi::CStr::from_ptr((*pw).pw_name)
                    .to_string_lossy()
                    .into_owned()
            }
        })
}

/// The rules as written in the config file (`[policy]` or a sandbox's `policy`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRules {
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub confirm: Vec<String>,
    /// In a sandbox, a checkpoint is made before a matching command.
    #[serde(default)]
    pub checkpoint: Vec<String>,
}

/// The `[policy]` section: global rules, per-sandbox rules, the confirmation
/// timeout.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub confirm: Vec<String>,
    #[serde(default)]
    pub checkpoint: Vec<String>,
    /// `[policy.sandbox.NAME]`: rules for one sandbox (also `local` and
    /// sandboxes from the environment).
    #[serde(default)]
    pub sandbox: BTreeMap<String, RawRules>,
    /// Seconds a confirmation question waits for an answer (default 300).
    pub confirm_timeout_s: Option<f64>,
}

impl RawPolicy {
    /// The global rules.
    pub fn rules(&self) -> RawRules {
        RawRules {
            deny: self.deny.clone(),
            allow: self.allow.clone(),
            confirm: self.confirm.clone(),
            checkpoint: self.checkpoint.clone(),
        }
    }
}

/// The command policy as the config file states it; compiled by
/// `policy::Policy::compile`.
#[derive(Debug, Clone, Default)]
pub struct PolicyRules {
    /// `[policy]`: every sandbox.
    pub global: RawRules,
    /// Each sandbox's own rules, added to the global ones.
    pub sandboxes: Vec<(String, RawRules)>,
    pub confirm_timeout_s: Option<f64>,
    /// The config file, for messages.
    pub source: String,
}

/// An `http://` URL: what the built-in client can POST to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl HttpUrl {
    pub fn parse(url: &str) -> Result<HttpUrl, String> {
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(if url.starts_with("https://") {
                format!(
                    "{url}: https is not supported (Outpost carries no TLS client); use an http:// \
                     endpoint such as a local relay, or an event_command that runs curl"
                )
            } else {
                format!("{url}: expected an http:// URL")
            });
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        let path = path.split('#').next().unwrap_or("/").to_string();
        if authority.contains('@') {
            return Err(format!("{url}: credentials in the URL are not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{url}: unclosed [ in the host"))?;
            (host.to_string(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| format!("{url}: bad port {p:?}"))?,
            None => 80,
        };
        Ok(HttpUrl { host, port, path })
    }

    /// The `Host` header value.
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.host_header(), self.path)
    }
}

#[cfg(test)]
mod tests;
