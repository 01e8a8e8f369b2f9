use super::*;
use std::collections::BTreeSet;
use std::os::unix::fs::symlink;

/// A scratch tree:
///
/// ```text
/// <tmp>/outside/secret              a file that must never be reached
/// <tmp>/root/a/b/                   directories
/// <tmp>/root/file                   a file
/// <tmp>/root/in -> a                a symlink that stays inside
/// <tmp>/root/up -> ..               one that climbs out (relative)
/// <tmp>/root/out -> <tmp>/outside   one that jumps out (absolute)
/// <tmp>/root/a/deep -> ../../outside
/// <tmp>/link-to-root -> root
/// ```
struct Scratch {
    top: PathBuf,
    root: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let top = std::env::temp_dir().join(format!(
            "outpost-localpath-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let root = top.join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(top.join("outside")).unwrap();
        std::fs::write(top.join("outside/secret"), "secret").unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        symlink("a", root.join("in")).unwrap();
        symlink("..", root.join("up")).unwrap();
        symlink(top.join("outside"), root.join("out")).unwrap();
        symlink("../../outside", root.join("a/deep")).unwrap();
        symlink("root", top.join("link-to-root")).unwrap();
        Scratch { top, root }
    }

    fn roots(&self, beneath: bool) -> Roots {
        let mut roots = Roots::configured(std::slice::from_ref(&self.root));
        roots.beneath = beneath && openat2_supported();
        roots.base = self.root.clone();
        roots.home = None;
        roots.account_home = None;
        roots
    }

    /// Every path under `top` that is not under `root`.
    fn outside_entries(&self) -> BTreeSet<PathBuf> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![self.top.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.starts_with(&self.root) {
                    continue;
                }
                if path.symlink_metadata().unwrap().is_dir() {
                    stack.push(path.clone());
                }
                seen.insert(path);
            }
        }
        seen
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

fn dest() -> Intent {
    Intent::Dest { create: true }
}

#[test]
fn normalize_is_lexical() {
    assert_eq!(
        normalize(Path::new("/a/b/../c/./d")),
        PathBuf::from("/a/c/d")
    );
    assert_eq!(normalize(Path::new("/../../x")), PathBuf::from("/x"));
    assert_eq!(normalize(Path::new("/")), PathBuf::from("/"));
}

#[test]
fn climbing_out_of_a_missing_directory_is_refused() {
    // The finding: the prefix check stopped at the first missing directory,
    // and the OS then resolved `..` outside the root.
    let s = Scratch::new("climb");
    for beneath in [true, false] {
        let roots = s.roots(beneath);
        let raw = format!("{}/nonexist/../../outside/x", s.root.display());
        let err = roots.resolve(&raw, dest()).unwrap_err();
        assert!(err.contains("is outside"), "{err}");
        let raw = format!("{}/q/../../../../tmp/escaped", s.root.display());
        assert!(roots.resolve(&raw, dest()).is_err());
    }
    assert!(!s.top.join("nonexist").exists());
    assert!(!s.root.join("nonexist").exists());
    assert!(!s.root.join("q").exists());
}

#[test]
fn symlinks_that_leave_are_refused() {
    let s = Scratch::new("links");
    for beneath in [true, false] {
        let roots = s.roots(beneath);
        for raw in [
            "out",
            "out/new",
            "up/outside",
            "a/deep",
            "a/deep/x",
            "in/deep",
        ] {
            let err = roots.resolve(raw, dest()).unwrap_err();
            assert!(err.contains("through a symlink"), "{raw}: {err}");
        }
    }
    assert!(!s.top.join("outside/new").exists());
    assert!(!s.top.join("outside/x").exists());
}

#[test]
fn symlinks_that_stay_inside_are_followed_where_the_kernel_allows() {
    let s = Scratch::new("inside");
    if openat2_supported() {
        let got = s.roots(true).resolve("in/b", Intent::Read).unwrap();
        assert_eq!(got.path, s.root.canonicalize().unwrap().join("a/b"));
    }
    // Without openat2 every symlink is refused: stricter, never weaker.
    assert!(s.roots(false).resolve("in/b", Intent::Read).is_err());
}

#[test]
fn missing_destinations_are_created_inside_and_read_needs_existing() {
    let s = Scratch::new("create");
    for beneath in [true, false] {
        let roots = s.roots(beneath);
        let dry = roots
            .resolve("new/deeper", Intent::Dest { create: false })
            .unwrap();
        assert_eq!(dry.path, s.root.canonicalize().unwrap().join("new/deeper"));
        assert!(!s.root.join("new").exists(), "a dry run creates nothing");
        let err = roots.resolve("new/deeper", Intent::Read).unwrap_err();
        assert!(err.contains("not found"), "{err}");
        let made = roots.resolve("new/deeper", dest()).unwrap();
        assert!(made.path.is_dir());
        std::fs::remove_dir_all(s.root.join("new")).unwrap();
        let err = roots.resolve("file/sub", dest()).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
        let err = roots.resolve("file", dest()).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
        assert_eq!(
            roots.resolve("file", Intent::Read).unwrap().path,
            s.root.canonicalize().unwrap().join("file")
        );
    }
}

#[test]
fn a_root_named_through_a_symlink_accepts_both_spellings() {
    let s = Scratch::new("spell");
    let mut roots = Roots::configured(&[s.top.join("link-to-root")]);
    roots.home = None;
    let via_link = format!("{}/a", s.top.join("link-to-root").display());
    let real = format!("{}/a", s.root.display());
    let want = s.root.canonicalize().unwrap().join("a");
    assert_eq!(roots.resolve(&via_link, Intent::Read).unwrap().path, want);
    assert_eq!(roots.resolve(&real, Intent::Read).unwrap().path, want);
}

#[test]
fn the_start_directory_is_never_the_whole_filesystem() {
    let roots = Roots::new(std::iter::once(PathBuf::from("/")), RootSource::StartDir);
    let err = roots.resolve("/etc", Intent::Read).unwrap_err();
    assert!(err.contains("set local_roots"), "{err}");
    // Configured, `/` is the user's explicit choice.
    let roots = Roots::configured(&[PathBuf::from("/")]);
    assert!(roots.resolve("/etc", Intent::Read).is_ok());
}

#[test]
fn credential_stores_are_refused_and_excluded() {
    let s = Scratch::new("secrets");
    let home = s.root.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::create_dir_all(home.join("proj")).unwrap();
    let mut roots = s.roots(true);
    roots.home = Some(home.clone());
    let err = roots.resolve("home/.ssh", dest()).unwrap_err();
    assert!(err.contains("holds credentials"), "{err}");
    assert!(roots.resolve("home/.ssh/authorized_keys2", dest()).is_err());
    let tree = roots.resolve("home", Intent::Read).unwrap();
    assert!(tree.secret_excludes.contains(&"/.ssh".to_string()));
    assert!(
        tree.secret_excludes
            .contains(&"/.config/outpost".to_string())
    );
    assert!(
        roots
            .resolve("home/proj", Intent::Read)
            .unwrap()
            .secret_excludes
            .is_empty()
    );
    // A configured root inside a store is the user's explicit choice.
    let mut roots = Roots::configured(&[home.join(".ssh")]);
    roots.home = Some(home.clone());
    assert!(
        roots
            .resolve(home.join(".ssh").to_str().unwrap(), Intent::Read)
            .is_ok()
    );
}

#[test]
fn a_pull_never_writes_login_files_or_outpost_s_own() {
    let s = Scratch::new("login");
    let home = s.root.join("home");
    let account = s.root.join("account");
    let state = s.root.join("state");
    for dir in [&home, &account, &state] {
        std::fs::create_dir_all(dir.join(".config/autostart")).unwrap();
    }
    std::fs::create_dir_all(account.join(".ssh")).unwrap();
    let mut roots = s
        .roots(true)
        .protecting(vec![state.clone(), s.root.join("my.toml")]);
    // $HOME set to another directory than the account's home: both count.
    roots.home = Some(home.clone());
    roots.account_home = Some(account.clone());

    let pull = roots.resolve("home", dest()).unwrap();
    for pattern in ["/.bashrc", "/.profile", "/.config/autostart", "/.local/bin"] {
        assert!(
            pull.secret_excludes.contains(&pattern.to_string()),
            "{pattern}: {pull:?}"
        );
    }
    // A push may carry them: they hold no secret.
    let push = roots.resolve("home", Intent::Read).unwrap();
    assert!(
        !push.secret_excludes.contains(&"/.bashrc".to_string()),
        "{push:?}"
    );
    let err = roots.resolve("home/.config/autostart", dest()).unwrap_err();
    assert!(err.contains("runs at the next login"), "{err}");
    assert!(
        roots
            .resolve("home/.config/autostart", Intent::Read)
            .is_ok()
    );

    // The account's home, whatever $HOME says.
    let err = roots.resolve("account/.ssh", Intent::Read).unwrap_err();
    assert!(err.contains("holds credentials"), "{err}");
    assert!(roots.resolve("account/.bashrc", dest()).is_err());

    // Outpost's own state and config file, in either direction.
    let err = roots.resolve("state", dest()).unwrap_err();
    assert!(err.contains("is Outpost's own"), "{err}");
    assert!(roots.resolve("state", Intent::Read).is_err());
    let whole = roots.resolve(".", dest()).unwrap();
    for pattern in ["/state", "/my.toml"] {
        assert!(
            whole.secret_excludes.contains(&pattern.to_string()),
            "{whole:?}"
        );
    }
}

#[test]
fn client_roots_are_file_uris() {
    assert_eq!(
        file_uri_path("file:///home/u/my%20proj"),
        Some(PathBuf::from("/home/u/my proj"))
    );
    assert_eq!(
        file_uri_path("file://localhost/x"),
        Some(PathBuf::from("/x"))
    );
    assert_eq!(file_uri_path("https://example.com/x"), None);
    assert_eq!(file_uri_path("file://%zz/"), None);
    let roots = Roots::from_client(&["https://x/".into()]);
    assert_eq!(roots.source(), RootSource::StartDir);
}

/// A small deterministic generator, so a failure replays.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

#[test]
fn random_paths_never_reach_outside_the_root() {
    let iterations: usize = std::env::var("OUTPOST_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(3_000, |n: usize| n.clamp(1, 200_000) / 4 + 1);
    let s = Scratch::new("fuzz");
    let before = s.outside_entries();
    let canonical_root = s.root.canonicalize().unwrap();
    let parts = [
        "..", ".", "a", "b", "in", "up", "out", "deep", "file", "missing", "m2", "outside",
        "secret", "",
    ];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..iterations {
        let len = 1 + rng.next() % 7;
        let mut raw = String::new();
        if rng.next().is_multiple_of(2) {
            raw.push_str(s.root.to_str().unwrap());
        } else if rng.next().is_multiple_of(4) {
            raw.push_str(s.top.to_str().unwrap());
        }
        for _ in 0..len {
            if !raw.is_empty() {
                raw.push('/');
            }
            raw.push_str(rng.pick(&parts));
        }
        let beneath = i % 2 == 0;
        let roots = s.roots(beneath);
        let intent = match rng.next() % 3 {
            0 => Intent::Read,
            1 => Intent::Dest { create: false },
            _ => dest(),
        };
        let Ok(got) = roots.resolve(&raw, intent) else {
            refused += 1;
            continue;
        };
        accepted += 1;
        {
            assert!(
                got.path.starts_with(&canonical_root),
                "{raw:?} resolved to {}",
                got.path.display()
            );
            // What the OS makes of the returned path stays inside too.
            if let Ok(real) = got.path.canonicalize() {
                assert!(real.starts_with(&canonical_root), "{raw:?} → {real:?}");
            }
            if intent == Intent::Read {
                let real = got.path.canonicalize().unwrap();
                assert!(real.starts_with(&canonical_root));
            }
        }
    }
    // Both outcomes are exercised, or the test proves nothing.
    assert!(
        accepted > iterations / 20 && refused > iterations / 20,
        "{accepted} / {refused}"
    );
    assert_eq!(
        s.outside_entries(),
        before,
        "nothing outside the root changed"
    );
}
