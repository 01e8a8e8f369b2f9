//! The HTTP server's bearer tokens: the default one is
//! `$OUTPOST_HTTP_TOKEN`, else the one in `$OUTPOST_HOME/http-token` (mode
//! 0600), made on first use; each file `$OUTPOST_HOME/http-tokens/NAME`
//! (0600) adds a caller NAME with a token of its own. Tokens are compared
//! in constant time, and the token a request carries names its [`Caller`].

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use subtle::ConstantTimeEq;

use super::Caller;

pub(super) const TOKEN_ENV: &str = "OUTPOST_HTTP_TOKEN";
const TOKEN_FILE: &str = "http-token";
/// One file per further caller, named after it, holding its token.
pub(super) const CALLERS_DIR: &str = "http-tokens";
/// The caller the default token names.
const DEFAULT_CALLER: &str = "default";
/// Shorter tokens are refused: they could be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// The bearer tokens clients may send: the default one, where it came
/// from, and the named callers'.
pub struct Tokens {
    pub(super) value: String,
    pub(super) source: TokenSource,
    /// Each further caller's name and token.
    pub(super) callers: Vec<(String, String)>,
}

pub(super) enum TokenSource {
    Env,
    File(PathBuf),
    /// Made just now (and saved there): the user has not seen it yet.
    Made(PathBuf),
}

impl Tokens {
    /// Only the default token, `value` (for tests of what checks tokens).
    #[cfg(test)]
    pub(super) fn only(value: &str) -> Tokens {
        Tokens {
            value: value.to_string(),
            source: TokenSource::Env,
            callers: Vec::new(),
        }
    }

    /// The caller a request's `Authorization` value names, if any. Every
    /// token is compared, so the time taken does not tell which matched.
    pub(super) fn caller(&self, authorization: Option<&[u8]>) -> Option<Caller> {
        let given = bearer_token(authorization?)?;
        let mut found = None;
        let all = std::iter::once((DEFAULT_CALLER, self.value.as_str()))
            .chain(self.callers.iter().map(|(n, t)| (n.as_str(), t.as_str())));
        for (name, token) in all {
            if bool::from(given.ct_eq(token.as_bytes())) {
                found = Some(Caller::token(name));
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme's case
/// does not matter, RFC 7235).
pub(super) fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
}

/// Refuses a token file others can read, or a token too short to be safe.
fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is readable by other users (mode {:o}); run chmod 600 on it",
            path.display(),
            mode & 0o777
        );
    }
    let value = text.trim().to_string();
    if value.len() < MIN_TOKEN_LEN {
        bail!(
            "{} holds {} characters; use at least {MIN_TOKEN_LEN} (or delete it to get a new token)",
            path.display(),
            value.len()
        );
    }
    Ok(value)
}

/// `$OUTPOST_HTTP_TOKEN`, else the token file under `home`, else a new
/// random token saved there; and the named callers' tokens.
pub fn tokens(home: &Path) -> anyhow::Result<Tokens> {
    let callers = caller_tokens(home)?;
    let (value, source) = default_token(home)?;
    let mut seen = std::collections::HashSet::from([value.as_str()]);
    for (name, token) in &callers {
        if !seen.insert(token.as_str()) {
            bail!(
                "the token of caller `{name}` ({}) is another caller's too; give each its own",
                home.join(CALLERS_DIR).join(name).display()
            );
        }
    }
    Ok(Tokens {
        value,
        source,
        callers,
    })
}

/// Each file of `$OUTPOST_HOME/http-tokens/`: a caller, named by the file.
fn caller_tokens(home: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let dir = home.join(CALLERS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut callers = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if name == DEFAULT_CALLER
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!(
                "{}: a caller's name is letters, digits, '-', '_' and '.', and not `{DEFAULT_CALLER}`",
                entry.path().display()
            );
        }
        callers.push((name, read_token_file(&entry.path())?));
    }
    callers.sort();
    Ok(callers)
}

fn default_token(home: &Path) -> anyhow::Result<(String, TokenSource)> {
    if let Ok(value) = std::env::var(TOKEN_ENV)
        && !value.is_empty()
    {
        let value = value.trim().to_string();
        if value.len() < MIN_TOKEN_LEN {
            bail!(
                "{TOKEN_ENV} is {} characters; use at least {MIN_TOKEN_LEN}",
                value.len()
            );
        }
        return Ok((value, TokenSource::Env));
    }
    let path = home.join(TOKEN_FILE);
    match read_token_file(&path) {
        Ok(value) => Ok((value, TokenSource::File(path))),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
        {
            let value = random_token()?;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home)
                .with_context(|| format!("cannot create {}", home.display()))?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            writeln!(file, "{value}")?;
            Ok((value, TokenSource::Made(path)))
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// 32 random bytes, hex.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom for a token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A POST whose body is one JSON message, read whole (rmcp reads it whole
/// too); else the JSON-RPC error that answers it: `-32700` with its id if
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_names_its_caller() {
        let tokens = Tokens {
            value: "d".repeat(32),
            source: TokenSource::Env,
            callers: vec![("codex".into(), "c".repeat(32))],
        };
        let caller = |h: &str| {
            tokens
                .caller(Some(h.as_bytes()))
                .map(|c| c.name().to_string())
        };
        assert_eq!(
            caller(&format!("Bearer {}", "d".repeat(32))).as_deref(),
            Some("default")
        );
        assert_eq!(
            caller(&format!("Bearer {}", "c".repeat(32))).as_deref(),
            Some("codex")
        );
        assert_eq!(caller(&format!("Bearer {}", "c".repeat(31))), None);
        assert_eq!(caller(&"c".repeat(32)), None);
        assert_eq!(tokens.caller(None), None);
    }

    #[test]
    fn callers_come_from_their_files_and_must_differ() {
        let home = std::env::temp_dir().join(format!("outpost-http-tokens-{}", std::process::id()));
        let dir = home.join(CALLERS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("codex", &format!("{}\n", "c".repeat(32)), 0o600);
        let made = tokens(&home).unwrap();
        assert!(matches!(made.source, TokenSource::Made(_)));
        assert_eq!(made.callers, vec![("codex".into(), "c".repeat(32))]);
        // The same token for two callers could not tell them apart.
        write("cursor", &format!("{}\n", "c".repeat(32)), 0o600);
        let err = tokens(&home).err().unwrap().to_string();
        assert!(err.contains("another caller's too"), "{err}");
        // A token others can read is refused, as the default one is.
        write("cursor", &"e".repeat(32), 0o644);
        let err = tokens(&home).err().unwrap().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::remove_dir_all(&home).unwrap();
    }
}
