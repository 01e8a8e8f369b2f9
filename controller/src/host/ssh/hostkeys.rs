//! The SSH client's handler: the host key is checked against the user's
//! `~/.ssh/known_hosts` (read only) and Outpost's own known_hosts
//! (accept-new unless strict; a changed key is always refused), and why a
//! connection ended is kept for the channels that close with it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use russh::client;
use russh::keys::PublicKeyOrCertificate;
use russh::keys::ssh_key::{self, HashAlg};

use super::{KEEPALIVE, KEEPALIVE_MAX};

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
}

pub(super) struct Client {
    pub(super) hostname: String,
    pub(super) port: u16,
    pub(super) known_hosts: Vec<PathBuf>,
    pub(super) own_known_hosts: PathBuf,
    pub(super) strict: bool,
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
        if self.strict {
            *self.verdict.lock().unwrap() = Some(HostKeyVerdict::UnknownStrict { offered });
            return Ok(false);
        }
        // accept-new: record in Outpost's own file, never in the user's.
        if let Err(e) = russh::keys::known_hosts::learn_known_hosts_path(
            &self.hostname,
            self.port,
            &key,
            &self.own_known_hosts,
        ) {
            tracing::warn!(
                "cannot record host key in {}: {e}",
                self.own_known_hosts.display()
            );
        } else {
            tracing::info!(
                "recorded new host key {offered} for {} in {}",
                known_host_pattern(&self.hostname, self.port),
                self.own_known_hosts.display()
            );
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
