//! The SSH client's handler: the host key is checked against the user's
//! `~/.ssh/known_hosts` (read only) and Outpost's own known_hosts (a changed
//! key is always refused). An unknown key is handed back to be confirmed by a
//! person when one can be asked, else accepted and recorded (accept-new)
//! unless strict. Why a connection ended is kept for the channels that close
//! with it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use russh::client;
use russh::keys::PublicKeyOrCertificate;
use russh::keys::ssh_key::{self, HashAlg};

use super::{KEEPALIVE, KEEPALIVE_MAX};
use crate::host::UnknownHostKey;

/// Keys a person trusted once, and keys a person rejected: both hold for as
/// long as this process runs. A rejection binds the connections made where
/// nobody can be asked (an event follower must not accept-new a key the
/// person refused).
static TRUSTED_ONCE: Mutex<Vec<UnknownHostKey>> = Mutex::new(Vec::new());
static REJECTED: Mutex<Vec<UnknownHostKey>> = Mutex::new(Vec::new());

pub(super) fn trust_once(key: UnknownHostKey) {
    TRUSTED_ONCE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(key);
}

pub(super) fn reject(key: UnknownHostKey) {
    REJECTED.lock().unwrap_or_else(|p| p.into_inner()).push(key);
}

fn listed(list: &Mutex<Vec<UnknownHostKey>>, key: &UnknownHostKey) -> bool {
    list.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
}

/// Whether a person trusted or rejected any key of `key`'s host.
fn decided(key: &UnknownHostKey) -> bool {
    [&TRUSTED_ONCE, &REJECTED].into_iter().any(|list| {
        list.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|k| k.host == key.host && k.port == key.port)
    })
}

/// Outcome of the host-key check, kept so a refused connection can explain itself.
#[derive(Debug, Clone)]
pub(super) enum HostKeyVerdict {
    Changed {
        offered: String,
        recorded: String,
        file: String,
    },
    UnknownStrict {
        offered: String,
    },
    /// A person rejected this key earlier in this process.
    Rejected {
        unknown: UnknownHostKey,
        why: &'static str,
    },
    /// Unknown, and a person can be asked: the connection stops here.
    ToConfirm {
        key: Box<ssh_key::PublicKey>,
        unknown: UnknownHostKey,
    },
}

pub(super) struct Client {
    pub(super) hostname: String,
    pub(super) port: u16,
    pub(super) known_hosts: Vec<PathBuf>,
    pub(super) own_known_hosts: PathBuf,
    pub(super) strict: bool,
    /// Hand an unknown key back to be confirmed instead of applying `strict`.
    pub(super) ask: bool,
    pub(super) verdict: Arc<Mutex<Option<HostKeyVerdict>>>,
    /// Why the connection ended, once it has: what a closed channel reports.
    pub(super) ended: Arc<Mutex<Option<String>>>,
}

pub(super) fn known_host_pattern(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => {
                ssh_key::PublicKey::from(cert.public_key().clone())
            }
        };
        let offered = key.fingerprint(HashAlg::Sha256).to_string();
        let mut files: Vec<&PathBuf> = self.known_hosts.iter().collect();
        files.push(&self.own_known_hosts);
        for file in files {
            if !file.exists() {
                continue;
            }
            match russh::keys::check_known_hosts_path(&self.hostname, self.port, &key, file) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(russh::keys::Error::KeyChanged { line }) => {
                    let recorded = russh::keys::known_hosts::known_host_keys_path(
                        &self.hostname,
                        self.port,
                        file,
                    )
                    .ok()
                    .and_then(|keys| keys.into_iter().find(|(l, _)| *l == line))
                    .map(|(_, k)| {
                        format!(
                            "{}:{} records {}",
                            file.display(),
                            line,
                            k.fingerprint(HashAlg::Sha256)
                        )
                    })
                    .unwrap_or_else(|| format!("{}:{line} records another key", file.display()));
                    *self.verdict.lock().unwrap() = Some(HostKeyVerdict::Changed {
                        offered,
                        recorded,
                        file: file.display().to_string(),
                    });
                    return Ok(false);
                }
                Err(e) => {
                    tracing::warn!("cannot read {}: {e}", file.display());
                }
            }
        }
        let unknown = UnknownHostKey {
            host: known_host_pattern(&self.hostname, self.port),
            port: self.port,
            key_type: key.algorithm().as_str().to_string(),
            fingerprint: offered.clone(),
        };
        if listed(&TRUSTED_ONCE, &unknown) {
            return Ok(true);
        }
        // Where nobody can be asked, a host a person has decided about gets
        // no accept-new: not the key they rejected, and not another key than
        // the one they trusted (a person who can be asked may decide again).
        if !self.ask {
            let why = if listed(&REJECTED, &unknown) {
                Some("the user rejected it earlier")
            } else if decided(&unknown) {
                Some("the user decided about another key of this host earlier")
            } else {
                None
            };
            if let Some(why) = why {
                *self.verdict.lock().unwrap() = Some(HostKeyVerdict::Rejected { unknown, why });
                return Ok(false);
            }
        }
        if self.ask {
            *self.verdict.lock().unwrap() = Some(HostKeyVerdict::ToConfirm {
                key: Box::new(key),
                unknown,
            });
            return Ok(false);
        }
        if self.strict {
            *self.verdict.lock().unwrap() = Some(HostKeyVerdict::UnknownStrict { offered });
            return Ok(false);
        }
        // accept-new: record in Outpost's own file, never in the user's.
        if let Err(e) = record(&self.hostname, self.port, &key, &self.own_known_hosts) {
            tracing::warn!("{e}");
        }
        Ok(true)
    }

    async fn disconnected(
        &mut self,
        reason: client::DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        let why = match &reason {
            client::DisconnectReason::ReceivedDisconnect(info) => {
                format!("the host closed the connection ({})", info.message)
            }
            client::DisconnectReason::Error(russh::Error::KeepaliveTimeout) => format!(
                "no answer from the host for {} s (host frozen or network down)",
                KEEPALIVE.as_secs() * (KEEPALIVE_MAX as u64 + 1)
            ),
            client::DisconnectReason::Error(e) => format!("SSH connection failed: {e}"),
        };
        *self.ended.lock().unwrap() = Some(why);
        match reason {
            client::DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            client::DisconnectReason::Error(e) => Err(e),
        }
    }
}

/// Records `key` for `hostname:port` in Outpost's own known_hosts.
pub(super) fn record(
    hostname: &str,
    port: u16,
    key: &ssh_key::PublicKey,
    file: &std::path::Path,
) -> Result<(), String> {
    russh::keys::known_hosts::learn_known_hosts_path(hostname, port, key, file)
        .map_err(|e| format!("cannot record the host key in {}: {e}", file.display()))?;
    tracing::info!(
        "recorded host key {} for {} in {}",
        key.fingerprint(HashAlg::Sha256),
        known_host_pattern(hostname, port),
        file.display()
    );
    Ok(())
}
