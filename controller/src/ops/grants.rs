//! The built-in OAuth authorization server's records: the clients that
//! registered and the grants the owner approved, in
//! `$OUTPOST_HOME/oauth.json` (mode 0600).
//!
//! Tokens are kept only as BLAKE3 digests, so the file holds no secret: a
//! copy of it lets no one in. Every change is a read-modify-write under
//! an exclusive lock on `oauth.lock`, so running servers and
//! `outpost auth revoke` share the file; a server rereads it whenever its
//! size or modification time moved, so a revocation takes effect on the
//! next request.
//!
//! Refresh tokens rotate: each use answers a new one, and a spent one
//! presented again ends the whole grant (OAuth 2.1 §4.3.1, for public
//! clients), as a reused authorization code does.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::audit::Flock;

const FILE: &str = "oauth.json";
const LOCK: &str = "oauth.lock";
/// How long an access token is good for.
pub const ACCESS_TTL_S: u64 = 3600;
/// How long a refresh token is good for, unused.
pub const REFRESH_TTL_S: u64 = 30 * 86_400;
/// Registered clients kept; past this, those without a grant go first.
const MAX_CLIENTS: usize = 200;
/// Spent refresh tokens remembered per grant, to notice a replay.
const SPENT_KEPT: usize = 8;
/// Live access tokens kept per grant; a refresh past this ends the oldest.
const ACCESS_KEPT: usize = 8;

/// A client that registered itself (RFC 7591); public, so no secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Client {
    pub id: String,
    pub name: String,
    pub redirect_uris: Vec<String>,
    pub registered: u64,
}

/// What the owner approved for one client, with its live tokens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Grant {
    pub id: String,
    pub client_id: String,
    pub subject: String,
    pub scope: String,
    /// The resource (RFC 8707) its access tokens are for: the MCP URL.
    pub resource: String,
    pub created: u64,
    pub refreshed: u64,
    /// Digests of the live access tokens and when each expires.
    access: Vec<(String, u64)>,
    refresh: String,
    pub refresh_expires: u64,
    spent: Vec<String>,
    /// The digest of the authorization code it came from.
    code: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Records {
    pub clients: Vec<Client>,
    pub grants: Vec<Grant>,
}

/// Tokens just issued: the only time they exist in the clear.
#[derive(Debug)]
pub struct Issued {
    pub access: String,
    pub refresh: String,
    pub expires_in: u64,
    pub scope: String,
}

/// Who an access token speaks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Bearer {
    pub subject: String,
    pub client_id: String,
    pub client_name: String,
}

/// Why an access token was refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Invalid {
    /// Never issued, revoked, or its grant ended.
    Unknown,
    Expired,
    /// Issued for another resource (RFC 8707).
    Audience,
}

impl Invalid {
    pub fn describe(self) -> &'static str {
        match self {
            Invalid::Unknown => "the token is not one this server issued, or it was revoked",
            Invalid::Expired => "the access token expired; use the refresh token",
            Invalid::Audience => "the access token was issued for another resource",
        }
    }
}

pub struct Grants {
    path: PathBuf,
    lock: PathBuf,
    cache: Mutex<Cache>,
}

/// What tells a rewritten file: every write is a new inode (temp file,
/// rename), with its own time and size.
type Stamp = (SystemTime, u64, u64);

#[derive(Default)]
struct Cache {
    stamp: Option<Stamp>,
    records: Records,
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A token's digest, as the file keeps it.
pub fn digest(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// `bytes` random bytes from the kernel, base64url without padding.
pub fn random(bytes: usize) -> std::io::Result<String> {
    use base64::Engine;
    let mut buf = vec![0u8; bytes];
    std::io::Read::read_exact(&mut File::open("/dev/urandom")?, &mut buf)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

impl Grants {
    pub fn new(home: &Path) -> Grants {
        Grants {
            path: home.join(FILE),
            lock: home.join(LOCK),
            cache: Mutex::new(Cache::default()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records as the file has them now.
    pub fn read(&self) -> std::io::Result<Records> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::other(format!("{} is not valid: {e}", self.path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Records::default()),
            Err(e) => Err(e),
        }
    }

    /// Runs `change` on the records under the lock and writes them back
    /// (temp file, rename), even when it answers an error: a replayed
    /// token ends its grant and is refused.
    pub fn change<T>(
        &self,
        change: impl FnOnce(&mut Records) -> Result<T, String>,
    ) -> Result<T, String> {
        let locked = || -> std::io::Result<File> {
            if let Some(dir) = self.lock.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&self.lock)
        };
        let io = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let file = locked().map_err(io)?;
        let _held = Flock::exclusive(&file).map_err(io)?;
        let mut records = self.read().map_err(io)?;
        let before = serde_json::to_vec(&records).map_err(|e| e.to_string())?;
        let answer = change(&mut records);
        let now = now();
        records.grants.retain(|g| g.refresh_expires > now);
        for grant in &mut records.grants {
            grant.access.retain(|(_, expires)| *expires > now);
        }
        // A request that changed nothing (an unknown token revoked) costs
        // no write.
        if serde_json::to_vec(&records).map_err(|e| e.to_string())? == before {
            return answer;
        }
        self.write(&records).map_err(io)?;
        // A write within the clock's grain could leave the same stamp.
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).stamp = None;
        answer
    }

    fn write(&self, records: &Records) -> std::io::Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(records).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }

    /// A read of the records that rereads the file only when it changed.
    fn current<T>(&self, read: impl FnOnce(&Records) -> T) -> T {
        let stamp = std::fs::metadata(&self.path).ok().and_then(|m| {
            Some((
                m.modified().ok()?,
                m.len(),
                std::os::unix::fs::MetadataExt::ino(&m),
            ))
        });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.stamp != stamp || stamp.is_none() {
            match self.read() {
                Ok(records) => cache.records = records,
                Err(e) => {
                    tracing::warn!("{e}");
                    cache.records = Records::default();
                }
            }
            cache.stamp = stamp;
        }
        read(&cache.records)
    }

    pub fn client(&self, id: &str) -> Option<Client> {
        self.current(|r| r.clients.iter().find(|c| c.id == id).cloned())
    }

    /// Records a new client (RFC 7591).
    pub fn register(&self, name: &str, redirect_uris: Vec<String>) -> Result<Client, String> {
        let client = Client {
            id: random(16).map_err(|e| e.to_string())?,
            name: name.to_string(),
            redirect_uris,
            registered: now(),
        };
        let made = client.clone();
        self.change(move |records| {
            if records.clients.len() >= MAX_CLIENTS {
                let granted: Vec<String> =
                    records.grants.iter().map(|g| g.client_id.clone()).collect();
                let idle = records
                    .clients
                    .iter()
                    .position(|c| !granted.contains(&c.id))
                    .ok_or(
                        "too many clients hold grants; revoke some with `outpost auth revoke`",
                    )?;
                records.clients.remove(idle);
            }
            records.clients.push(client);
            Ok(())
        })?;
        Ok(made)
    }

    /// A new grant for an approved authorization code, and its tokens.
    pub fn issue(
        &self,
        client_id: &str,
        subject: &str,
        scope: &str,
        resource: &str,
        code: &str,
    ) -> Result<Issued, String> {
        let issued = fresh_tokens(scope)?;
        let now = now();
        let grant = Grant {
            id: format!("g-{}", &random(6).map_err(|e| e.to_string())?),
            client_id: client_id.to_string(),
            subject: subject.to_string(),
            scope: scope.to_string(),
            resource: resource.to_string(),
            created: now,
            refreshed: now,
            access: vec![(digest(&issued.access), now + ACCESS_TTL_S)],
            refresh: digest(&issued.refresh),
            refresh_expires: now + REFRESH_TTL_S,
            spent: Vec::new(),
            code: digest(code),
        };
        self.change(|records| {
            records.grants.push(grant);
            Ok(())
        })?;
        Ok(issued)
    }

    /// New tokens for a refresh token, which is spent. A spent one
    /// presented again ends its grant.
    pub fn refresh(
        &self,
        refresh: &str,
        client_id: &str,
        resource: Option<&str>,
    ) -> Result<Issued, String> {
        let hash = digest(refresh);
        self.change(|records| {
            if let Some(i) = records.grants.iter().position(|g| g.spent.contains(&hash)) {
                records.grants.remove(i);
                return Err("the refresh token was already used; the grant is revoked".into());
            }
            let grant = records
                .grants
                .iter_mut()
                .find(|g| g.refresh == hash)
                .ok_or("unknown or revoked refresh token")?;
            if grant.client_id != client_id {
                return Err("the refresh token belongs to another client".into());
            }
            if resource.is_some_and(|r| r != grant.resource) {
                return Err("the refresh token is for another resource".into());
            }
            let issued = fresh_tokens(&grant.scope)?;
            let now = now();
            grant.spent.push(std::mem::replace(
                &mut grant.refresh,
                digest(&issued.refresh),
            ));
            if grant.spent.len() > SPENT_KEPT {
                grant.spent.remove(0);
            }
            grant
                .access
                .push((digest(&issued.access), now + ACCESS_TTL_S));
            if grant.access.len() > ACCESS_KEPT {
                grant.access.remove(0);
            }
            grant.refreshed = now;
            grant.refresh_expires = now + REFRESH_TTL_S;
            Ok(issued)
        })
    }

    /// Who `token` speaks for, if it is a live access token for `resource`.
    pub fn verify(&self, token: &str, resource: &str) -> Result<Bearer, Invalid> {
        let hash = digest(token);
        let now = now();
        self.current(|records| {
            let grant = records
                .grants
                .iter()
                .find(|g| g.access.iter().any(|(h, _)| *h == hash))
                .ok_or(Invalid::Unknown)?;
            let expires = grant
                .access
                .iter()
                .find(|(h, _)| *h == hash)
                .map_or(0, |(_, e)| *e);
            if expires <= now {
                return Err(Invalid::Expired);
            }
            if grant.resource != resource {
                return Err(Invalid::Audience);
            }
            let client_name = records
                .clients
                .iter()
                .find(|c| c.id == grant.client_id)
                .map_or_else(String::new, |c| c.name.clone());
            Ok(Bearer {
                subject: grant.subject.clone(),
                client_id: grant.client_id.clone(),
                client_name,
            })
        })
    }

    /// Ends the grant `token` (access or refresh) belongs to (RFC 7009);
    /// whether there was one.
    pub fn revoke_token(&self, token: &str) -> Result<bool, String> {
        let hash = digest(token);
        self.end(|g| g.refresh == hash || g.access.iter().any(|(h, _)| *h == hash))
    }

    /// Ends the grant made from the authorization code `code`: it was
    /// presented twice, so it may be in other hands.
    pub fn revoke_code(&self, code: &str) -> Result<bool, String> {
        let hash = digest(code);
        self.end(|g| g.code == hash)
    }

    /// Ends the grants whose id or client id is `id` (`outpost auth
    /// revoke`); how many.
    pub fn revoke(&self, id: &str) -> Result<usize, String> {
        self.change(|records| {
            let before = records.grants.len();
            records.grants.retain(|g| g.id != id && g.client_id != id);
            Ok(before - records.grants.len())
        })
    }

    fn end(&self, which: impl Fn(&Grant) -> bool) -> Result<bool, String> {
        self.change(|records| {
            let before = records.grants.len();
            records.grants.retain(|g| !which(g));
            Ok(records.grants.len() < before)
        })
    }
}

fn fresh_tokens(scope: &str) -> Result<Issued, String> {
    let token = |prefix: &str| {
        random(32)
            .map(|r| format!("{prefix}{r}"))
            .map_err(|e| format!("cannot read /dev/urandom: {e}"))
    };
    Ok(Issued {
        access: token("opa_")?,
        refresh: token("opr_")?,
        expires_in: ACCESS_TTL_S,
        scope: scope.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants() -> (Grants, PathBuf) {
        let home =
            std::env::temp_dir().join(format!("outpost-grants-{}-{}", std::process::id(), now()));
        (Grants::new(&home), home)
    }

    #[test]
    fn tokens_verify_rotate_and_end() {
        let (grants, home) = grants();
        let client = grants
            .register("Claude", vec!["http://127.0.0.1:9/cb".into()])
            .unwrap();
        let resource = "http://127.0.0.1:8742/mcp";
        let first = grants
            .issue(&client.id, "owner", "mcp", resource, "code-1")
            .unwrap();
        let bearer = grants.verify(&first.access, resource).unwrap();
        assert_eq!(bearer.client_name, "Claude");
        assert_eq!(
            grants.verify(&first.access, "http://localhost:8742/mcp"),
            Err(Invalid::Audience)
        );
        assert_eq!(grants.verify("opa_nope", resource), Err(Invalid::Unknown));
        // The file holds digests only.
        let text = std::fs::read_to_string(grants.path()).unwrap();
        assert!(!text.contains(&first.access) && !text.contains(&first.refresh));

        let second = grants.refresh(&first.refresh, &client.id, None).unwrap();
        assert!(grants.verify(&second.access, resource).is_ok());
        let err = grants.refresh(&second.refresh, "other", None).unwrap_err();
        assert!(err.contains("another client"), "{err}");
        // The spent refresh token again: the grant ends, every token with it.
        let err = grants
            .refresh(&first.refresh, &client.id, None)
            .unwrap_err();
        assert!(err.contains("already used"), "{err}");
        assert_eq!(
            grants.verify(&second.access, resource),
            Err(Invalid::Unknown)
        );

        let third = grants
            .issue(&client.id, "owner", "mcp", resource, "code-2")
            .unwrap();
        assert!(grants.revoke_code("code-2").unwrap());
        assert_eq!(
            grants.verify(&third.access, resource),
            Err(Invalid::Unknown)
        );
        let fourth = grants
            .issue(&client.id, "owner", "mcp", resource, "code-3")
            .unwrap();
        assert_eq!(grants.revoke(&client.id).unwrap(), 1);
        assert!(grants.refresh(&fourth.refresh, &client.id, None).is_err());
        std::fs::remove_dir_all(home).unwrap();
    }
}
