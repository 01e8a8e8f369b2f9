//! One configured host resolved into how it is reached: a command, or
//! SSH with what `~/.ssh/config` adds (its options, `ProxyJump` hops, known
//! hosts files) and refuses (options Outpost would not follow).

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ssh_config::SshConfigFile;
use super::{
    CommandTarget, DEFAULT_REMOTE_DIR, HostConfig, LOCAL_HOST, RawHost, SshTarget, Target,
    expand_tilde,
};

pub(super) fn resolve(
    raw: RawHost,
    ssh_config: Option<&SshConfigFile>,
    home: Option<&Path>,
    default_user: &str,
    strict_default: bool,
) -> Result<HostConfig> {
    if raw.command.is_some() {
        let ssh = ssh_fields(&raw);
        let argv = raw.command.unwrap_or_default();
        return resolve_command(raw.name, argv, raw.remote_dir, ssh);
    }
    let Some(host) = raw.host.clone() else {
        bail!(
            "a sandbox{} has neither \"host\" (reached over SSH) nor \"command\" (reached through a command)",
            raw.name.map(|n| format!(" ({n:?})")).unwrap_or_default()
        );
    };
    if host.trim().is_empty() {
        bail!("a sandbox has an empty \"host\"");
    }
    let name = raw.name.clone().unwrap_or_else(|| host.clone());
    if name == LOCAL_HOST {
        bail!("the name {LOCAL_HOST:?} is reserved for the built-in local sandbox");
    }
    let mut unusable: Option<String> = None;
    let params = match ssh_config.map(|c| c.query(&host, raw.user.as_deref(), default_user)) {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            unusable = Some(format!("{e:#}"));
            None
        }
        None => None,
    };
    if let Some(Err(e)) = params.as_ref().map(|p| refuse_unsupported(&host, p)) {
        unusable = Some(format!("{e:#}"));
    }
    let hostname = params
        .as_ref()
        .and_then(|p| p.host_name.clone())
        .unwrap_or_else(|| host.clone());
    let port = raw
        .port
        .or_else(|| params.as_ref().and_then(|p| p.port))
        .unwrap_or(22);
    let user = raw
        .user
        .or_else(|| params.as_ref().and_then(|p| p.user.clone()))
        .unwrap_or_else(|| default_user.to_string());
    let identity_files: Vec<PathBuf> = params
        .as_ref()
        .and_then(|p| p.identity_file.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| expand_tilde(&p.to_string_lossy(), home))
        .collect();
    let key_file = raw.key_file.map(|k| expand_tilde(&k, home));
    let strict_host_keys = raw
        .strict_host_keys
        .or_else(|| params.as_ref().and_then(strict_host_key_checking))
        .unwrap_or(strict_default);
    let hops: Vec<String> = match &raw.proxy_jump {
        Some(list) => list.split(',').map(|h| h.trim().to_string()).collect(),
        None => params
            .as_ref()
            .and_then(|p| p.proxy_jump.clone())
            .unwrap_or_default(),
    };
    let hops: Vec<&str> = hops
        .iter()
        .map(String::as_str)
        .filter(|h| !h.is_empty())
        .collect();
    let jump = if hops.iter().any(|h| h.eq_ignore_ascii_case("none")) {
        Vec::new()
    } else {
        hops.iter()
            .map(|hop| {
                jump_host(hop, ssh_config, home, default_user).map(|mut j| {
                    // A hop with no IdentityFile of its own keeps the default
                    // keys, as OpenSSH would try them.
                    if j.identity_files.is_empty() {
                        j.identity_files.extend(default_keys(home));
                    }
                    // The sandbox's keys are tried on a hop too, after the
                    // agent and the hop's own (never its password).
                    j.identity_files.extend(key_file.iter().cloned());
                    j.identity_files.extend(identity_files.iter().cloned());
                    j.key_passphrase = raw.key_passphrase.clone();
                    j.strict_host_keys = strict_host_keys;
                    j
                })
            })
            .collect::<Result<Vec<_>>>()
            .unwrap_or_else(|e| {
                unusable.get_or_insert(format!("proxy_jump: {e:#}"));
                Vec::new()
            })
    };
    let user_known_hosts = match params.as_ref().map(|p| user_known_hosts(&host, p, home)) {
        Some(Ok(files)) => files,
        Some(Err(e)) => {
            unusable.get_or_insert(format!("{e:#}"));
            None
        }
        None => None,
    };
    Ok(HostConfig {
        name,
        slurm: None,
        allow_hosts: Vec::new(),
        sandbox_uids: None,
        target: Target::Ssh(SshTarget {
            host,
            hostname,
            port,
            user,
            key_file,
            key_passphrase: raw.key_passphrase,
            password: raw.password,
            identity_files,
            identities_only: params.as_ref().is_some_and(identities_only),
            connect_timeout: params.as_ref().and_then(ssh_connect_timeout),
            strict_host_keys,
            remote_dir: raw.remote_dir.unwrap_or_else(|| DEFAULT_REMOTE_DIR.into()),
            jump,
            user_known_hosts,
            unusable,
        }),
    })
}

/// The SSH fields an entry sets, by name: none may go with `command`.
fn ssh_fields(raw: &RawHost) -> Vec<&'static str> {
    [
        ("host", raw.host.is_some()),
        ("port", raw.port.is_some()),
        ("user", raw.user.is_some()),
        ("password", raw.password.is_some()),
        ("key_file", raw.key_file.is_some()),
        ("key_passphrase", raw.key_passphrase.is_some()),
        ("strict_host_keys", raw.strict_host_keys.is_some()),
        ("proxy_jump", raw.proxy_jump.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect()
}

/// A sandbox reached through a command (`command = [...]`).
fn resolve_command(
    name: Option<String>,
    argv: Vec<String>,
    remote_dir: Option<String>,
    ssh_fields: Vec<&str>,
) -> Result<HostConfig> {
    let Some(name) = name.filter(|n| !n.trim().is_empty()) else {
        bail!("a sandbox with \"command\" needs a \"name\"");
    };
    if name == LOCAL_HOST {
        bail!("the name {LOCAL_HOST:?} is reserved for the built-in local sandbox");
    }
    if !ssh_fields.is_empty() {
        bail!(
            "sandbox {name:?} has \"command\" and SSH settings ({}): a sandbox is reached either through its command or over SSH; for SSH inside the command, put ssh in the command (e.g. [\"ssh\", \"-p\", \"2222\", \"user@host\", \"{{command}}\"])",
            ssh_fields.join(", ")
        );
    }
    let target = CommandTarget::new(
        argv,
        remote_dir.unwrap_or_else(|| DEFAULT_REMOTE_DIR.into()),
    )
    .map_err(|e| anyhow::anyhow!("sandbox {name:?}: {e}"))?;
    Ok(HostConfig {
        name,
        target: Target::Command(target),
        slurm: None,
        allow_hosts: Vec::new(),
        sandbox_uids: None,
    })
}

/// `~/.ssh/config` options that change where or how a host is reached and
/// that Outpost does not follow: present for a sandbox's host, they are an
/// error that names them, never silently skipped (Outpost would connect
/// somewhere, or somehow, other than `ssh` does).
const UNFOLLOWED_SSH_OPTIONS: &[(&str, &str)] = &[
    ("proxycommand", "ProxyCommand (use ProxyJump)"),
    ("hostkeyalias", "HostKeyAlias"),
    ("knownhostscommand", "KnownHostsCommand"),
    ("pkcs11provider", "PKCS11Provider"),
];

fn refuse_unsupported(host: &str, params: &ssh2_config::HostParams) -> Result<()> {
    let mut found: Vec<&str> = UNFOLLOWED_SSH_OPTIONS
        .iter()
        .filter(|(key, _)| {
            params
                .unsupported_fields
                .keys()
                .any(|k| k.eq_ignore_ascii_case(key))
        })
        .map(|(_, name)| *name)
        .collect();
    if params.bind_address.is_some() || params.bind_interface.is_some() {
        found.push("BindAddress/BindInterface");
    }
    if params.certificate_file.is_some() {
        found.push("CertificateFile");
    }
    if !found.is_empty() {
        bail!(
            "~/.ssh/config sets {} for {host}, which Outpost does not follow; remove it for this host (a separate Host alias for Outpost works) or configure the sandbox in Outpost's config file",
            found.join(", ")
        );
    }
    Ok(())
}

/// `UserKnownHostsFile` from `~/.ssh/config` (several files, `~` expanded).
fn user_known_hosts(
    host: &str,
    params: &ssh2_config::HostParams,
    home: Option<&Path>,
) -> Result<Option<Vec<PathBuf>>> {
    let Some((_, args)) = params
        .unsupported_fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("userknownhostsfile"))
    else {
        return Ok(None);
    };
    let files: Vec<&str> = args.iter().flat_map(|a| a.split_whitespace()).collect();
    // A token left as is would name a file that never exists, and the
    // user's pinned keys would silently not count.
    if files.iter().any(|f| f.contains('%')) {
        bail!(
            "~/.ssh/config sets UserKnownHostsFile with % tokens for {host}, which Outpost does not expand; name the file plainly for this host"
        );
    }
    Ok(Some(
        files.into_iter().map(|f| expand_tilde(f, home)).collect(),
    ))
}

/// OpenSSH's default identities that exist under `home`.
pub fn default_keys(home: Option<&Path>) -> Vec<PathBuf> {
    let Some(home) = home else {
        return Vec::new();
    };
    ["id_ed25519", "id_ecdsa", "id_rsa"]
        .iter()
        .map(|name| home.join(".ssh").join(name))
        .filter(|p| p.exists())
        .collect()
}

/// `ConnectTimeout` from `~/.ssh/config`; 0 is OpenSSH's "no limit of my
/// own", which leaves Outpost's.
fn ssh_connect_timeout(params: &ssh2_config::HostParams) -> Option<Duration> {
    params.connect_timeout.filter(|t| !t.is_zero())
}

/// `IdentitiesOnly yes` from `~/.ssh/config`.
fn identities_only(params: &ssh2_config::HostParams) -> bool {
    params
        .unsupported_fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("identitiesonly"))
        .and_then(|(_, args)| args.first())
        .is_some_and(|v| v.eq_ignore_ascii_case("yes"))
}

/// `StrictHostKeyChecking` from `~/.ssh/config`: yes refuses unknown keys;
/// no, off and accept-new record them (Outpost never accepts a changed key).
fn strict_host_key_checking(params: &ssh2_config::HostParams) -> Option<bool> {
    let (_, args) = params
        .unsupported_fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("stricthostkeychecking"))?;
    match args.first()?.to_ascii_lowercase().as_str() {
        "yes" => Some(true),
        "no" | "off" | "accept-new" => Some(false),
        _ => None,
    }
}

/// One `ProxyJump` hop, `[user@]host[:port]` with `host` perhaps an alias
/// of `~/.ssh/config`.
fn jump_host(
    hop: &str,
    ssh_config: Option<&SshConfigFile>,
    home: Option<&Path>,
    default_user: &str,
) -> Result<SshTarget> {
    if hop.contains("://") {
        bail!("{hop:?}: ssh:// URLs are not supported; write [user@]host[:port]");
    }
    let (user, rest) = match hop.rsplit_once('@') {
        Some((u, r)) => (Some(u.to_string()), r),
        None => (None, hop),
    };
    let port_of = |p: &str| {
        p.parse::<u16>()
            .with_context(|| format!("{hop:?}: bad port {p:?}"))
    };
    // `[v6]:port`, `[v6]`, `v6` (more than one colon), `host:port`, `host`.
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (h, after) = bracketed
            .split_once(']')
            .with_context(|| format!("{hop:?}: no closing ]"))?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(port_of(p)?)),
            None if after.is_empty() => (h, None),
            None => bail!("{hop:?}: unexpected {after:?} after ]"),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) if !p.contains(':') => (h, Some(port_of(p)?)),
            _ => (rest, None),
        }
    };
    if host.is_empty() {
        bail!("{hop:?}: no host");
    }
    let params = ssh_config
        .map(|c| c.query(host, user.as_deref(), default_user))
        .transpose()?;
    if let Some(p) = &params {
        refuse_unsupported(host, p)?;
        if p.proxy_jump.as_ref().is_some_and(|j| {
            j.iter()
                .any(|h| !h.trim().is_empty() && !h.eq_ignore_ascii_case("none"))
        }) {
            bail!(
                "jump host {host} has a ProxyJump of its own in ~/.ssh/config; list every hop in the sandbox's ProxyJump instead"
            );
        }
    }
    Ok(SshTarget {
        host: host.to_string(),
        hostname: params
            .as_ref()
            .and_then(|p| p.host_name.clone())
            .unwrap_or_else(|| host.to_string()),
        port: port
            .or_else(|| params.as_ref().and_then(|p| p.port))
            .unwrap_or(22),
        user: user
            .or_else(|| params.as_ref().and_then(|p| p.user.clone()))
            .unwrap_or_else(|| default_user.to_string()),
        key_file: None,
        key_passphrase: None,
        password: None,
        identity_files: params
            .as_ref()
            .and_then(|p| p.identity_file.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| expand_tilde(&p.to_string_lossy(), home))
            .collect(),
        identities_only: params.as_ref().is_some_and(identities_only),
        connect_timeout: params.as_ref().and_then(ssh_connect_timeout),
        strict_host_keys: false,
        remote_dir: String::new(),
        jump: Vec::new(),
        user_known_hosts: match &params {
            Some(p) => user_known_hosts(host, p, home)?,
            None => None,
        },
        unusable: None,
    })
}
