//! Authentication, in order: the configured key file (with its passphrase)
//! alone; without one, ssh-agent, then the `IdentityFile`s from
//! `~/.ssh/config`, else the default keys (as OpenSSH does); then the
//! password. With `IdentitiesOnly yes` ssh-agent offers only the keys whose
//! `.pub` sits beside one of those files: a server that allows few attempts
//! is not used up by the agent's other keys.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::client::Handle;
use russh::keys::PrivateKeyWithHashAlg;
use russh::keys::ssh_key::{self, HashAlg};

use super::ConnectError;
use super::hostkeys::Client;
use crate::config::SshTarget;

/// Tries the keys the module docs list, then the password; stops at the
/// first success.
pub(super) async fn authenticate(
    handle: &mut Handle<Client>,
    target: &SshTarget,
    addr: &str,
) -> Result<(), ConnectError> {
    let ssh_err = |e: russh::Error| ConnectError::Ssh {
        addr: addr.to_string(),
        reason: e.to_string(),
    };
    let mut tried: Vec<String> = Vec::new();
    let rsa_hash = handle
        .best_supported_rsa_hash()
        .await
        .map_err(ssh_err)?
        .flatten();

    if let Some(key) = &target.key_file {
        let passphrase = target.key_passphrase.as_deref();
        if try_key(handle, &target.user, key, passphrase, rsa_hash, &mut tried)
            .await
            .map_err(ssh_err)?
        {
            return Ok(());
        }
    } else {
        // The identity files, else OpenSSH's default ones.
        let files = if target.identity_files.is_empty() {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            crate::config::default_keys(home.as_deref())
        } else {
            target.identity_files.clone()
        };
        if let Ok(mut agent) = russh::keys::agent::client::AgentClient::connect_env().await {
            let mut identities = agent.request_identities().await.unwrap_or_default();
            if target.identities_only {
                let configured = configured_public_keys(&files);
                identities.retain(|i| {
                    configured
                        .iter()
                        .any(|k| k.key_data() == i.public_key().key_data())
                });
            }
            let count = identities.len();
            for identity in identities {
                let public = identity.public_key().into_owned();
                let hash = if matches!(public.algorithm(), ssh_key::Algorithm::Rsa { .. }) {
                    rsa_hash
                } else {
                    None
                };
                if let Ok(result) = handle
                    .authenticate_publickey_with(&target.user, public, hash, &mut agent)
                    .await
                    && result.success()
                {
                    return Ok(());
                }
            }
            tried.push(format!("ssh-agent ({count} keys)"));
        }
        for path in &files {
            if try_key(handle, &target.user, path, None, rsa_hash, &mut tried)
                .await
                .map_err(ssh_err)?
            {
                return Ok(());
            }
        }
    }

    if let Some(password) = &target.password {
        let result = handle
            .authenticate_password(&target.user, password)
            .await
            .map_err(ssh_err)?;
        if result.success() {
            return Ok(());
        }
        tried.push("password (refused)".into());
    }
    if tried.is_empty() {
        tried.push("nothing: configure key_file or password".into());
    }
    Err(ConnectError::Auth {
        user: target.user.clone(),
        addr: addr.to_string(),
        tried: tried.join(", "),
    })
}

/// The public halves (`<file>.pub`) of the identity files that have one.
fn configured_public_keys(files: &[PathBuf]) -> Vec<ssh_key::PublicKey> {
    files
        .iter()
        .filter_map(|f| {
            let mut public = f.clone().into_os_string();
            public.push(".pub");
            ssh_key::PublicKey::read_openssh_file(Path::new(&public)).ok()
        })
        .collect()
}

/// Offers one key file; records why it did not work in `tried`.
async fn try_key(
    handle: &mut Handle<Client>,
    user: &str,
    path: &Path,
    passphrase: Option<&str>,
    rsa_hash: Option<HashAlg>,
    tried: &mut Vec<String>,
) -> Result<bool, russh::Error> {
    match russh::keys::load_secret_key(path, passphrase) {
        Ok(key) => {
            let key = PrivateKeyWithHashAlg::new(Arc::new(key), rsa_hash);
            if handle.authenticate_publickey(user, key).await?.success() {
                return Ok(true);
            }
            tried.push(format!("key {} (refused)", path.display()));
        }
        Err(e) => tried.push(format!(
            "key {} ({})",
            path.display(),
            key_load_problem(&e, passphrase.is_some())
        )),
    }
    Ok(false)
}

fn key_load_problem(e: &russh::keys::Error, had_passphrase: bool) -> String {
    let text = e.to_string();
    match e {
        russh::keys::Error::KeyIsEncrypted => "encrypted: set key_passphrase".into(),
        russh::keys::Error::IO(io) if io.kind() == std::io::ErrorKind::NotFound => {
            "not found".into()
        }
        // Decryption with the wrong passphrase surfaces as a crypto error.
        russh::keys::Error::SshKey(_) if had_passphrase => "wrong passphrase?".into(),
        _ => text,
    }
}
