//! `~/.ssh/config` evaluated for one host the way OpenSSH evaluates it:
//! `Host` and `Match` blocks in file order, `Include` inlined where it
//! stands (conditional when inside a block), the first value of an option
//! winning.
//!
//! ssh2-config parses option values well but knows neither `Match` (its
//! lines would count as options of the block before) nor conditional
//! `Include`. So this module decides which blocks apply to the host, then
//! hands ssh2-config a flat text in which every block that applies is
//! `Host *` and every other one matches nothing, and asks it for the
//! options.
//!
//! `Match` criteria followed: `all`, `host` (the name after any `HostName`
//! so far), `originalhost`, `user` (the login so far), `localuser`, each
//! negatable with `!`. Any other (`exec`, `canonical`, `final`, `tagged`,
//! `localnetwork`, …) cannot be judged here: if such a block would set an
//! option Outpost reads that nothing before it set, the host gets an error
//! naming both, never a silent guess; otherwise the block changes nothing
//! Outpost uses either way.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// OpenSSH's limit on nested `Include`s.
const MAX_INCLUDE_DEPTH: usize = 16;

/// A name no host has, for blocks that do not apply.
const NOWHERE: &str = "outpost-no-match.invalid";

/// The options Outpost reads or refuses (lowercase), which a block it
/// cannot judge must not decide.
const READ_BY_OUTPOST: &[&str] = &[
    "hostname",
    "port",
    "user",
    "identityfile",
    "identitiesonly",
    "proxyjump",
    "stricthostkeychecking",
    "userknownhostsfile",
    "connecttimeout",
    "proxycommand",
    "hostkeyalias",
    "knownhostscommand",
    "pkcs11provider",
    "bindaddress",
    "bindinterface",
    "certificatefile",
];

/// Options a file may give several times, each adding to the last (every
/// other option takes its first value).
const ADDING_UP: &[&str] = &[
    "identityfile",
    "certificatefile",
    "localforward",
    "remoteforward",
    "dynamicforward",
    "sendenv",
    "setenv",
];

/// Whether a block applies to the host being evaluated.
#[derive(Clone, Copy)]
enum Applies {
    Yes,
    No,
    /// A `Match` Outpost cannot judge: the index of its entry.
    Unknown(usize),
}

impl Applies {
    /// A block's own answer inside what encloses it (an `Include` in a
    /// block applies only as far as that block does).
    fn within(self, outer: Applies) -> Applies {
        match (outer, self) {
            (Applies::No, _) | (_, Applies::No) => Applies::No,
            (Applies::Unknown(i), _) | (_, Applies::Unknown(i)) => Applies::Unknown(i),
            (Applies::Yes, Applies::Yes) => Applies::Yes,
        }
    }
}

/// One parsed `~/.ssh/config`, its `Include`s inlined.
#[derive(Debug, Clone)]
pub struct SshConfigFile {
    entries: Vec<Entry>,
    home: Option<PathBuf>,
}

#[derive(Debug, Clone)]
enum Entry {
    Host(Vec<String>),
    Match {
        criteria: Vec<Criterion>,
        at: String,
    },
    Setting {
        key: String,
        value: String,
        line: String,
    },
    IncludeStart,
    IncludeEnd,
}

#[derive(Debug, Clone)]
struct Criterion {
    negated: bool,
    test: Test,
}

#[derive(Debug, Clone)]
enum Test {
    All,
    Host(Vec<String>),
    OriginalHost(Vec<String>),
    User(Vec<String>),
    LocalUser(Vec<String>),
    /// A criterion Outpost cannot judge (`exec`, `final`, …).
    Unjudged(String),
}

impl SshConfigFile {
    pub fn load(path: &Path, home: Option<&Path>) -> Result<Self> {
        let mut entries = Vec::new();
        read_file(path, home, 0, &mut entries)?;
        Ok(SshConfigFile {
            entries,
            home: home.map(Path::to_path_buf),
        })
    }

    /// The options that apply to `host` (as the user typed it), with
    /// `user` the login given outside `~/.ssh/config` and `local_user`
    /// this machine's.
    pub fn query(
        &self,
        host: &str,
        user: Option<&str>,
        local_user: &str,
    ) -> Result<ssh2_config::HostParams> {
        let mut flat = String::new();
        let mut applies = Applies::Yes;
        // What the blocks around an `Include` allow its blocks.
        let mut outer = Applies::Yes;
        let mut stack: Vec<(Applies, Applies)> = Vec::new();
        let mut hostname: Option<String> = None;
        let mut login: Option<String> = user.map(str::to_string);
        // Options set so far by blocks that apply (the first value wins);
        // a login given outside the file beats the file's.
        let mut set: Vec<&str> = Vec::new();
        if user.is_some() {
            set.push("user");
        }
        let header = |flat: &mut String, applies: Applies| {
            flat.push_str("Host ");
            flat.push_str(if matches!(applies, Applies::Yes) {
                "*"
            } else {
                NOWHERE
            });
            flat.push('\n');
        };
        for (index, entry) in self.entries.iter().enumerate() {
            match entry {
                Entry::Host(patterns) => {
                    let own = if matches_list(host, patterns, true) {
                        Applies::Yes
                    } else {
                        Applies::No
                    };
                    applies = own.within(outer);
                    header(&mut flat, applies);
                }
                Entry::Match { criteria, .. } => {
                    let now = Now {
                        host: hostname.as_deref().unwrap_or(host),
                        original: host,
                        user: login.as_deref().unwrap_or(local_user),
                        local_user,
                    };
                    let own = match judge(criteria, &now) {
                        Some(true) => Applies::Yes,
                        Some(false) => Applies::No,
                        None => Applies::Unknown(index),
                    };
                    applies = own.within(outer);
                    header(&mut flat, applies);
                }
                Entry::Setting { key, value, line } => match applies {
                    Applies::Yes => {
                        let adds = ADDING_UP.contains(&key.as_str());
                        if set.contains(&key.as_str()) && !adds {
                            // ssh2-config would keep a block's last value.
                            continue;
                        }
                        // The value as ssh reads it: unquoted, no comment.
                        let first = words(value).into_iter().next().unwrap_or_default();
                        if key == "hostname" {
                            hostname = Some(expand_host_token(&first, host));
                        } else if key == "user" {
                            login = Some(first);
                        }
                        set.push(key);
                        flat.push_str(line);
                        flat.push('\n');
                    }
                    Applies::No => {}
                    Applies::Unknown(at) => {
                        let decides = READ_BY_OUTPOST.contains(&key.as_str())
                            && (ADDING_UP.contains(&key.as_str()) || !set.contains(&key.as_str()));
                        if decides && let Entry::Match { criteria, at } = &self.entries[at] {
                            let word = criteria
                                .iter()
                                .find_map(|c| match &c.test {
                                    Test::Unjudged(w) => Some(w.as_str()),
                                    _ => None,
                                })
                                .unwrap_or("?");
                            bail!(
                                "{at}: `Match {word}`, which Outpost cannot evaluate, may set {key} for {host}; give the host a Host block of its own above it, or configure it in Outpost's config file"
                            );
                        }
                    }
                },
                Entry::IncludeStart => {
                    stack.push((applies, outer));
                    outer = applies.within(outer);
                }
                Entry::IncludeEnd => {
                    (applies, outer) = stack.pop().unwrap_or((Applies::Yes, Applies::Yes));
                    header(&mut flat, applies);
                }
            }
        }
        let mut config = ssh2_config::SshConfig::default();
        if let Some(home) = &self.home {
            config = config.home_dir(home);
        }
        let config = config
            .parse(
                &mut flat.as_bytes(),
                ssh2_config::ParseRule::ALLOW_UNKNOWN_FIELDS
                    | ssh2_config::ParseRule::ALLOW_UNSUPPORTED_FIELDS,
            )
            .context("cannot parse ~/.ssh/config")?;
        let mut params = config.query(host);
        // What ssh2-config left as written: `%h` in HostName is the host.
        if let Some(name) = &params.host_name {
            params.host_name = Some(expand_host_token(name, host));
        }
        Ok(params)
    }
}

/// The names a `Match` is judged against.
struct Now<'a> {
    host: &'a str,
    original: &'a str,
    user: &'a str,
    local_user: &'a str,
}

/// Whether every criterion holds; None when one cannot be judged (and
/// none that can fails).
fn judge(criteria: &[Criterion], now: &Now) -> Option<bool> {
    let mut unjudged = false;
    for c in criteria {
        let hit = match &c.test {
            Test::All => true,
            Test::Host(p) => matches_list(now.host, p, true),
            Test::OriginalHost(p) => matches_list(now.original, p, true),
            // User names are compared as they are.
            Test::User(p) => matches_list(now.user, p, false),
            Test::LocalUser(p) => matches_list(now.local_user, p, false),
            Test::Unjudged(_) => {
                unjudged = true;
                continue;
            }
        };
        if hit == c.negated {
            return Some(false);
        }
    }
    if unjudged { None } else { Some(true) }
}

/// OpenSSH's pattern lists: some pattern matches and no `!pattern` does;
/// `fold`: host names, compared without case.
fn matches_list(name: &str, patterns: &[String], fold: bool) -> bool {
    let fold = |s: &str| {
        if fold {
            s.to_ascii_lowercase()
        } else {
            s.to_string()
        }
    };
    let name = fold(name);
    let mut hit = false;
    for pattern in patterns {
        let pattern = fold(pattern);
        match pattern.strip_prefix('!') {
            Some(negated) if wildcard(negated.as_bytes(), name.as_bytes()) => return false,
            Some(_) => {}
            None => hit |= wildcard(pattern.as_bytes(), name.as_bytes()),
        }
    }
    hit
}

/// `*` and `?` globbing, as OpenSSH's `match_pattern`.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| wildcard(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && wildcard(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && wildcard(rest, &name[1..]),
    }
}

/// `%h` (the host as typed) and `%%` in a `HostName`.
fn expand_host_token(value: &str, host: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('%', Some('h')) => {
                out.push_str(host);
                chars.next();
            }
            ('%', Some('%')) => {
                out.push('%');
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

fn read_file(path: &Path, home: Option<&Path>, depth: usize, out: &mut Vec<Entry>) -> Result<()> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read ssh config {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    for (number, raw) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), number + 1);
        let Some((key, value)) = split_line(raw) else {
            continue;
        };
        match key.as_str() {
            "host" => out.push(Entry::Host(words(&value))),
            "match" => out.push(Entry::Match {
                criteria: criteria(&value).with_context(|| at.clone())?,
                at,
            }),
            "include" => {
                if depth >= MAX_INCLUDE_DEPTH {
                    bail!("{at}: Include nested more than {MAX_INCLUDE_DEPTH} deep");
                }
                out.push(Entry::IncludeStart);
                for name in words(&value) {
                    for file in include_files(&name, home).with_context(|| at.clone())? {
                        read_file(&file, home, depth + 1, out)?;
                    }
                }
                out.push(Entry::IncludeEnd);
            }
            _ => out.push(Entry::Setting {
                key,
                value,
                line: raw.trim().to_string(),
            }),
        }
    }
    Ok(())
}

/// `Keyword value` or `Keyword=value`: the keyword lowercased; None for a
/// blank or comment line.
fn split_line(raw: &str) -> Option<(String, String)> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(line.len());
    let (key, rest) = line.split_at(end);
    let value = rest.trim_start();
    let value = value.strip_prefix('=').unwrap_or(value).trim();
    Some((key.to_ascii_lowercase(), value.to_string()))
}

/// Whitespace-separated words, double quotes grouping; an unquoted word
/// starting with `#` begins a comment.
fn words(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in value.chars() {
        match c {
            '#' if !quoted && word.is_empty() => break,
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn criteria(value: &str) -> Result<Vec<Criterion>> {
    let words = words(value);
    let mut out = Vec::new();
    let mut rest = words.iter();
    while let Some(word) = rest.next() {
        let lower = word.to_ascii_lowercase();
        let (negated, name) = match lower.strip_prefix('!') {
            Some(n) => (true, n),
            None => (false, lower.as_str()),
        };
        let mut list = || -> Result<Vec<String>> {
            let arg = rest
                .next()
                .with_context(|| format!("Match {name} needs an argument"))?;
            Ok(arg.split(',').map(str::to_string).collect())
        };
        let test = match name {
            "all" => Test::All,
            "host" => Test::Host(list()?),
            "originalhost" => Test::OriginalHost(list()?),
            "user" => Test::User(list()?),
            "localuser" => Test::LocalUser(list()?),
            // Take the argument along, so it is not read as a criterion.
            "exec" | "localnetwork" | "tagged" | "version" | "sessiontype" | "command" => {
                let _ = rest.next();
                Test::Unjudged(name.to_string())
            }
            other => Test::Unjudged(other.to_string()),
        };
        out.push(Criterion { negated, test });
    }
    if out.is_empty() {
        bail!("Match needs a criterion (Match all, Match host …)");
    }
    Ok(out)
}

/// The files one `Include` argument names: `~` is the home, a relative
/// path is under `~/.ssh`, globs expand in sorted order.
fn include_files(name: &str, home: Option<&Path>) -> Result<Vec<PathBuf>> {
    let path = match (name.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => home.join(rest),
        (Some(_), None) => bail!("Include {name}: no home directory"),
        (None, _) if Path::new(name).is_absolute() => PathBuf::from(name),
        (None, Some(home)) => home.join(".ssh").join(name),
        (None, None) => bail!("Include {name}: no home directory"),
    };
    let pattern = path.to_string_lossy();
    // As OpenSSH's glob: `*` does not match a leading dot (an editor's
    // .config.swp is not a config file).
    let options = glob::MatchOptions {
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    let mut files: Vec<PathBuf> = glob::glob_with(&pattern, options)
        .with_context(|| format!("Include {name}: bad pattern"))?
        .filter_map(Result::ok)
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home directory for one test, removed with it.
    struct Home(PathBuf);

    impl Drop for Home {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn config(files: &[(&str, &str)]) -> (SshConfigFile, Home) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let home = Home(
            std::env::temp_dir().join(format!("outpost-ssh-config-{}-{n}", std::process::id())),
        );
        std::fs::create_dir_all(home.0.join(".ssh")).unwrap();
        for (name, text) in files {
            std::fs::write(home.0.join(".ssh").join(name), text).unwrap();
        }
        let file = SshConfigFile::load(&home.0.join(".ssh/config"), Some(&home.0)).unwrap();
        (file, home)
    }

    fn get(c: &SshConfigFile, host: &str) -> ssh2_config::HostParams {
        c.query(host, None, "me").unwrap()
    }

    #[test]
    fn match_host_sees_the_hostname_and_its_options_stay_in_its_block() {
        let (c, _home) = config(&[(
            "config",
            "Host gpu\n  HostName \"gpu7.lab.example\" # the box\nHost other\n  Port 2200\n\
             Match host *.lab.example\n  User labuser\n  Port 2222\n\
             Match originalhost gpu !user root\n  IdentityFile ~/.ssh/lab\n\
             Host *\n  User fallback\n",
        )]);
        let gpu = get(&c, "gpu");
        assert_eq!(gpu.host_name.as_deref(), Some("gpu7.lab.example"));
        assert_eq!(
            (gpu.user.as_deref(), gpu.port),
            (Some("labuser"), Some(2222))
        );
        assert_eq!(gpu.identity_file.unwrap().len(), 1);
        // Not matched: the Match block's options are not `other`'s.
        let other = get(&c, "other");
        assert_eq!(
            (other.user.as_deref(), other.port),
            (Some("fallback"), Some(2200))
        );
        assert!(other.identity_file.is_none());
        // A login given elsewhere is what `Match user` sees.
        let root = c.query("gpu", Some("root"), "me").unwrap();
        assert!(root.identity_file.is_none());
    }

    #[test]
    fn include_inside_a_block_applies_only_with_it() {
        let (c, _home) = config(&[
            ("config", "Host a\n  Include extra\nHost b\n  Port 2\n"),
            ("extra", "User inc\nHost *\n  Port 9\n"),
        ]);
        let a = get(&c, "a");
        assert_eq!((a.user.as_deref(), a.port), (Some("inc"), Some(9)));
        // The included `Host *` sits inside `Host a`: b never sees it.
        let b = get(&c, "b");
        assert_eq!((b.user, b.port), (None, Some(2)));
    }

    #[test]
    fn a_match_outpost_cannot_judge_is_an_error_where_it_could_decide() {
        let (c, _home) = config(&[(
            "config",
            "Host early\n  User set\nMatch exec \"test -f /x\" host *\n  User x\n  ForwardAgent yes\n\
             Match exec true host other\n  Port 1\n",
        )]);
        // Sets User, which nothing set before for `late`.
        let err = format!("{:#}", c.query("late", None, "me").unwrap_err());
        assert!(
            err.contains("Match exec") && err.contains("config:3") && err.contains("user"),
            "{err}"
        );
        // For `early` User is set already and ForwardAgent is not Outpost's;
        // the last block's `host other` fails whatever exec would say.
        let early = get(&c, "early");
        assert_eq!((early.user.as_deref(), early.port), (Some("set"), None));
    }

    #[test]
    fn the_first_value_wins_within_a_block_and_across_includes() {
        let (c, _home) = config(&[
            (
                "config",
                "Host gpu # the box\n  HostName a.lab\n  HostName b.lab\n  IdentityFile ~/k1\n  IdentityFile ~/k2\n\
                 Match exec true\n  Include more\n",
            ),
            ("more", "Host gpu\n  Port 2222\n"),
            (".more.swp", "\u{0}\u{ff}garbage"),
        ]);
        // The Include under `Match exec` may set Port: Outpost cannot tell.
        let err = format!("{:#}", c.query("gpu", None, "me").unwrap_err());
        assert!(err.contains("Match exec") && err.contains("port"), "{err}");
        let (c, _home) = config(&[(
            "config",
            "Host gpu # the box\n  HostName a.lab\n  HostName b.lab\n  IdentityFile ~/k1\n  IdentityFile ~/k2\n",
        )]);
        let gpu = get(&c, "gpu");
        assert_eq!(gpu.host_name.as_deref(), Some("a.lab"));
        assert_eq!(gpu.identity_file.unwrap().len(), 2);
        // `# the box` is a comment, not a pattern.
        assert!(get(&c, "box").host_name.is_none());
    }

    #[test]
    fn patterns_follow_openssh() {
        let list = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        assert!(matches_list("gpu7.Lab", &list("*.lab"), true));
        assert!(!matches_list("gpu7.lab", &list("*.lab,!gpu7*"), true));
        assert!(matches_list("n1", &list("n?"), true));
        assert!(!matches_list("n12", &list("n?"), true));
        assert!(!matches_list("Alice", &list("alice"), false));
        assert_eq!(words("prod # the box"), ["prod"]);
        assert_eq!(expand_host_token("%h.lab%%", "gpu"), "gpu.lab%");
    }
}
