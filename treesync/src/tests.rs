//! End-to-end tests of the engine: scan, plan and apply together, the way a
//! controller drives them, on local directories.
//!
//! They run as an ordinary user or as root. Root ignores permission bits, so
//! "unreadable file" and "read-only directory" cases cannot be produced that
//! way; the scan side of them is exercised with a fifo and a vanished file.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::Instant;

use outpost_protocol::{
    ChunkRef, EntryKind, Expect, FileContent, FilePut, FilterSpec, MetaOp, PartData, PathProblem,
    PutFiles, ReadSpec, TreeEntry,
};

use crate::apply::{self, Applier, read_file};
use crate::cache::StatCache;
use crate::chunk::CHUNKED_MIN_SIZE;
use crate::codec;
use crate::plan::{DiffOptions, Plan, diff};
use crate::scan::{ScanOptions, ScanOutput, scan};
use crate::sys;
use crate::testutil::{TempDir, pseudo_random};

fn opts() -> ScanOptions {
    ScanOptions {
        hashes: true,
        chunk_lists: true,
        recursive: true,
        max_entries: 0,
        reap_stale_temps: false,
    }
}

fn scan_all(root: &Path) -> ScanOutput {
    scan(root, &FilterSpec::default(), &opts(), None)
}

fn p(rel: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(rel))
}

fn set_mtime(path: &Path, secs: i64) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: 123_456_789,
        },
    ];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0);
}

fn put(path: &[u8], data: &[u8], expect: Expect) -> FilePut {
    FilePut {
        path: path.to_vec(),
        mode: 0o640,
        mtime_ns: 1_600_000_000_123_456_789,
        size: data.len() as u64,
        hash: *blake3::hash(data).as_bytes(),
        expect,
        content: FileContent::Inline(codec::compress(data)),
    }
}

fn put_files(ap: &mut Applier, files: Vec<FilePut>) -> outpost_protocol::ApplyReport {
    ap.put_files(&PutFiles {
        root: String::new(),
        create_parents: true,
        files,
    })
}

/// Names of Outpost temporary files anywhere below `root`.
fn temp_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if e.file_name().as_bytes().starts_with(b".outpost-") {
                found.push(e.path().display().to_string());
            }
            if ft.is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// Pushes `src` to `dst` the way a controller does: scan both, plan, then
/// apply the plan's steps in order with whole-file puts.
fn push(src: &Path, dst: &Path, options: &DiffOptions) -> Result<(Plan, Vec<PathProblem>), String> {
    let s = scan_all(src);
    let d = scan_all(dst);
    assert!(s.summary.problems.is_empty(), "{:?}", s.summary.problems);
    let plan = diff(&s.entries, &d.entries, options)?;
    let mut ap = Applier::new(dst);
    let mut problems = Vec::new();
    let mut ops: Vec<MetaOp> = plan
        .replace_removes
        .iter()
        .map(|path| MetaOp::Remove { path: path.clone() })
        .collect();
    ops.extend(plan.mkdirs.iter().map(|e| MetaOp::Mkdir {
        path: e.path.clone(),
        mode: e.mode,
    }));
    problems.extend(ap.apply_meta(&ops).problems);
    let files = plan
        .files
        .iter()
        .map(|f| {
            let data = fs::read(src.join(p(&f.src.path))).unwrap();
            FilePut {
                path: f.src.path.clone(),
                mode: f.src.mode,
                mtime_ns: f.src.mtime_ns,
                size: f.src.size,
                hash: f.src.hash.unwrap(),
                expect: match &f.dst {
                    Some(old) => Expect::File {
                        size: old.size,
                        mtime_ns: old.mtime_ns,
                    },
                    None => Expect::Absent,
                },
                content: FileContent::Inline(codec::compress(&data)),
            }
        })
        .collect();
    problems.extend(put_files(&mut ap, files).problems);
    let mut ops = Vec::new();
    for e in &plan.symlinks {
        if let EntryKind::Symlink { target } = &e.kind {
            ops.push(MetaOp::Symlink {
                path: e.path.clone(),
                target: target.clone(),
            });
        }
    }
    for e in plan.attrs.iter().chain(&plan.dir_attrs) {
        ops.push(MetaOp::SetAttrs {
            path: e.path.clone(),
            mode: e.mode,
            mtime_ns: e.mtime_ns,
        });
    }
    ops.extend(
        plan.removes
            .iter()
            .map(|path| MetaOp::Remove { path: path.clone() }),
    );
    // Directory attributes go last (removals inside would bump mtimes).
    let n = plan.symlinks.len() + plan.attrs.len();
    let dir_attrs: Vec<MetaOp> = ops.drain(n..n + plan.dir_attrs.len()).collect();
    ops.extend(dir_attrs);
    problems.extend(ap.apply_meta(&ops).problems);
    Ok((plan, problems))
}

/// Scans both trees and asserts they describe the same content.
fn assert_same(src: &Path, dst: &Path) {
    let a = scan_all(src).entries;
    let b = scan_all(dst).entries;
    let key = |e: &TreeEntry| {
        let mtime = if matches!(e.kind, EntryKind::Symlink { .. }) {
            0
        } else {
            e.mtime_ns
        };
        (
            e.path.clone(),
            e.kind.clone(),
            e.mode,
            e.size,
            mtime,
            e.hash,
        )
    };
    let a: Vec<_> = a.iter().map(key).collect();
    let b: Vec<_> = b.iter().map(key).collect();
    assert_eq!(a, b);
}

fn odd_tree(root: &Path) {
    fs::create_dir_all(root.join("dir with space/nested")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    fs::write(root.join("dir with space/a file.txt"), b"hello").unwrap();
    fs::write(root.join(p(b"new\nline")), b"newline name").unwrap();
    fs::write(root.join(p(b"bin\xff\xfe")), b"not utf-8").unwrap();
    fs::write(root.join("zero"), b"").unwrap();
    fs::write(root.join("exec.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("exec.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::write(
        root.join("dir with space/nested/deep"),
        pseudo_random(3000, 2),
    )
    .unwrap();
    symlink("dir with space/a file.txt", root.join("link")).unwrap();
    symlink("/nonexistent/target", root.join("dangling")).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o700)).unwrap();
    set_mtime(&root.join("zero"), 1_000_000_000);
    set_mtime(&root.join("empty"), 1_100_000_000);
}

#[test]
fn scan_lists_sorted_raw_entries() {
    let t = TempDir::new();
    odd_tree(t.path());
    let out = scan_all(t.path());
    assert!(out.summary.root_exists);
    assert!(
        out.summary.problems.is_empty(),
        "{:?}",
        out.summary.problems
    );
    let paths: Vec<&[u8]> = out.entries.iter().map(|e| e.path.as_slice()).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted);
    let by: HashMap<&[u8], &TreeEntry> =
        out.entries.iter().map(|e| (e.path.as_slice(), e)).collect();
    assert!(by.contains_key(&b"bin\xff\xfe"[..]));
    assert!(by.contains_key(&b"new\nline"[..]));
    assert_eq!(by[&b"exec.sh"[..]].mode, 0o751);
    assert_eq!(by[&b"zero"[..]].size, 0);
    assert_eq!(by[&b"zero"[..]].mtime_ns, 1_000_000_000_123_456_789);
    assert_eq!(by[&b"zero"[..]].hash, Some(*blake3::hash(b"").as_bytes()));
    assert_eq!(by[&b"empty"[..]].kind, EntryKind::Dir);
    assert_eq!(
        by[&b"link"[..]].kind,
        EntryKind::Symlink {
            target: b"dir with space/a file.txt".to_vec()
        }
    );
    assert_eq!(
        by[&b"link"[..]].hash,
        None,
        "symlinks are not followed or hashed"
    );
    assert!(by.contains_key(&b"dangling"[..]));

    // Without hashes nothing is read.
    let quick = scan(
        t.path(),
        &FilterSpec::default(),
        &ScanOptions {
            hashes: false,
            ..opts()
        },
        None,
    );
    assert!(quick.entries.iter().all(|e| e.hash.is_none()));
    assert_eq!(quick.entries.len(), out.entries.len());
}

#[test]
fn scan_root_cases() {
    let t = TempDir::new();
    let missing = scan_all(&t.path().join("missing"));
    assert!(!missing.summary.root_exists);
    assert!(missing.entries.is_empty() && missing.summary.problems.is_empty());
    fs::write(t.path().join("file"), b"x").unwrap();
    let file = scan_all(&t.path().join("file"));
    assert!(file.summary.root_exists);
    assert_eq!(file.summary.problems[0].message, "not a directory");
    assert!(file.entries.is_empty());
    // Special files say what they are rather than "not found" or "not a
    // directory"; a symlink to one is followed like the root itself.
    let fifo = t.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    symlink("/dev/zero", t.path().join("zero")).unwrap();
    for (root, message) in [
        (
            Path::new("/dev/zero"),
            "a character device, not a file or directory",
        ),
        (
            &t.path().join("zero"),
            "a character device, not a file or directory",
        ),
        (&fifo, "a fifo, not a file or directory"),
    ] {
        let out = scan_all(root);
        assert!(out.summary.root_exists, "{}", root.display());
        assert_eq!(out.summary.problems[0].message, message);
        assert!(out.entries.is_empty());
    }
}

#[test]
fn scan_filters_truncates_and_lists_one_level() {
    let t = TempDir::new();
    for name in ["a", "a/b", "a/b/c", "node_modules", "node_modules/x", "src"] {
        fs::create_dir(t.path().join(name)).unwrap();
    }
    for name in [
        "a.txt",
        "a/f",
        "a/b/c/g",
        "node_modules/x/y.js",
        "src/main.pyc",
        "src/.outpost-1.tmp",
        "src/ok",
    ] {
        fs::write(t.path().join(name), name).unwrap();
    }
    let filter = FilterSpec {
        excludes: crate::filter::DEFAULT_EXCLUDES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        use_gitignore: false,
    };
    let full = scan(t.path(), &filter, &opts(), None);
    let names: Vec<String> = full
        .entries
        .iter()
        .map(|e| crate::relpath::display(&e.path))
        .collect();
    assert_eq!(
        names,
        [
            "a", "a.txt", "a/b", "a/b/c", "a/b/c/g", "a/f", "src", "src/ok"
        ]
    );
    for n in 1..names.len() as u64 {
        let cut = scan(
            t.path(),
            &filter,
            &ScanOptions {
                max_entries: n,
                ..opts()
            },
            None,
        );
        assert!(cut.summary.truncated);
        assert_eq!(
            cut.entries,
            full.entries[..n as usize],
            "a cut scan is a prefix of the full one"
        );
    }
    let exact = scan(
        t.path(),
        &filter,
        &ScanOptions {
            max_entries: names.len() as u64,
            ..opts()
        },
        None,
    );
    assert!(!exact.summary.truncated);
    let top = scan(
        t.path(),
        &filter,
        &ScanOptions {
            recursive: false,
            ..opts()
        },
        None,
    );
    let names: Vec<String> = top
        .entries
        .iter()
        .map(|e| crate::relpath::display(&e.path))
        .collect();
    assert_eq!(names, ["a", "a.txt", "src"]);
}

#[test]
fn scan_gitignore_inside_tree() {
    let t = TempDir::new();
    fs::create_dir_all(t.path().join("sub/build")).unwrap();
    fs::write(t.path().join(".gitignore"), "*.log\n").unwrap();
    fs::write(t.path().join("sub/.gitignore"), "build/\n!keep.log\n").unwrap();
    for name in [
        "x.log",
        "sub/y.log",
        "sub/keep.log",
        "sub/build/out",
        "sub/src",
    ] {
        fs::write(t.path().join(name), "x").unwrap();
    }
    let filter = FilterSpec {
        excludes: vec![],
        use_gitignore: true,
    };
    let out = scan(t.path(), &filter, &opts(), None);
    let names: Vec<String> = out
        .entries
        .iter()
        .map(|e| crate::relpath::display(&e.path))
        .collect();
    assert_eq!(
        names,
        [
            ".gitignore",
            "sub",
            "sub/.gitignore",
            "sub/keep.log",
            "sub/src"
        ]
    );
}

#[test]
fn scan_problems_do_not_abort() {
    // Running as root, permission bits cannot make a file unreadable; a fifo
    // stands in for "a path that cannot be listed", and a file removed
    // between the walk and hashing for a vanished one.
    let t = TempDir::new();
    fs::write(t.path().join("a"), b"a").unwrap();
    let fifo = std::ffi::CString::new(t.path().join("pipe").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    fs::write(t.path().join("z"), b"z").unwrap();
    let out = scan_all(t.path());
    let names: Vec<&[u8]> = out.entries.iter().map(|e| e.path.as_slice()).collect();
    assert_eq!(names, [&b"a"[..], b"z"]);
    assert_eq!(out.summary.problems.len(), 1);
    assert_eq!(out.summary.problems[0].path, b"pipe");
    assert!(out.summary.problems[0].message.contains("fifo"));

    let st = crate::sys::Stat {
        dev: 0,
        ino: 0,
        mode: 0o100644,
        size: 1,
        mtime_ns: 0,
        ctime_ns: 0,
        uid: 0,
        gid: 0,
    };
    let mut buf = Vec::new();
    assert!(matches!(
        crate::scan::hash_one_for_test(t.path(), b"gone", &st, &mut buf),
        Some("vanished")
    ));
    assert!(matches!(
        crate::scan::hash_one_for_test(t.path(), b"a", &st, &mut buf),
        Some("failed")
    ));
}

#[test]
fn stat_cache_skips_hashing() {
    let t = TempDir::new();
    let root = t.path().join("tree");
    fs::create_dir(&root).unwrap();
    for i in 0..2000 {
        fs::write(root.join(format!("f{i:04}")), format!("content {i}")).unwrap();
    }
    fs::write(
        root.join("big"),
        pseudo_random(CHUNKED_MIN_SIZE as usize + 5000, 9),
    )
    .unwrap();
    let mut cache = StatCache::default();
    // The files were written a moment ago; let the cache trust them anyway.
    cache.racy_window_ns = 0;
    let started = Instant::now();
    let cold = scan(&root, &FilterSpec::default(), &opts(), Some(&mut cache));
    let cold_time = started.elapsed();
    assert_eq!(cache.len(), 2001);

    // Poison every cached hash: a scan that trusts the cache returns the
    // poison, which proves it read nothing.
    for rec in cache.records_mut().values_mut() {
        rec.hash = [0xee; 32];
    }
    assert!(cache.is_changed());
    cache.save(&t.path().join("cold")).unwrap();
    let mut cache = StatCache::load(&t.path().join("cold"));
    cache.racy_window_ns = 0;
    assert!(!cache.is_changed());
    let started = Instant::now();
    let warm = scan(&root, &FilterSpec::default(), &opts(), Some(&mut cache));
    let warm_time = started.elapsed();
    assert!(!cache.is_changed(), "a scan that found nothing new");
    assert!(warm.entries.iter().all(|e| e.hash == Some([0xee; 32])));
    let big = warm.entries.iter().find(|e| e.path == b"big").unwrap();
    assert_eq!(
        big.chunks,
        cold.entries
            .iter()
            .find(|e| e.path == b"big")
            .unwrap()
            .chunks
    );
    eprintln!("2001 files: cold scan {cold_time:?}, warm scan {warm_time:?}");

    // A changed stat is hashed again; a removed file leaves the cache.
    fs::write(root.join("f0001"), "changed!!").unwrap();
    fs::remove_file(root.join("f0002")).unwrap();
    let save = t.path().join("cache");
    let again = scan(&root, &FilterSpec::default(), &opts(), Some(&mut cache));
    assert!(cache.is_changed());
    let f1 = again.entries.iter().find(|e| e.path == b"f0001").unwrap();
    assert_eq!(f1.hash, Some(*blake3::hash(b"changed!!").as_bytes()));
    assert_eq!(cache.len(), 2000);
    cache.save(&save).unwrap();
    assert_eq!(StatCache::load(&save).len(), 2000);
}

/// `describe_files` gives what a scan with chunk lists gives, from the
/// cache where it knows the file (poisoned, to prove it read nothing) and
/// by reading it where not; symlinks (of the file or a parent), directories
/// and missing paths are problems, never followed.
#[test]
fn described_files_match_the_scan_and_follow_no_symlink() {
    let t = TempDir::new();
    let root = t.path().join("tree");
    fs::create_dir_all(root.join("d")).unwrap();
    let big = pseudo_random(CHUNKED_MIN_SIZE as usize * 3, 4);
    fs::write(root.join("d/big"), &big).unwrap();
    fs::write(root.join("small"), b"small").unwrap();
    fs::write(t.path().join("outside"), &big).unwrap();
    symlink(t.path().join("outside"), root.join("link")).unwrap();
    symlink(t.path(), root.join("up")).unwrap();
    let scanned = scan_all(&root);
    let of = |path: &[u8]| scanned.entries.iter().find(|e| e.path == path).unwrap();
    assert!(of(b"d/big").chunks.len() > 100);

    let paths: Vec<Vec<u8>> = [
        &b"d/big"[..],
        b"small",
        b"link",
        b"up/outside",
        b"d",
        b"gone",
    ]
    .iter()
    .map(|p| p.to_vec())
    .collect();
    let described = apply::describe_files(&root, &paths, None);
    let (entries, problems) = (described.entries, described.problems);
    assert_eq!(described.read, 2);
    assert_eq!(entries, vec![of(b"d/big").clone(), of(b"small").clone()]);
    let said: Vec<(&[u8], &str)> = problems
        .iter()
        .map(|p| (&p.path[..], p.message.as_str()))
        .collect();
    assert_eq!(
        said,
        [
            (&b"link"[..], "is a symlink; not followed"),
            (b"up/outside", "parent is not a directory (symlink?): up"),
            (b"d", "is a directory, not a file"),
            (b"gone", "does not exist"),
        ]
    );

    let mut cache = StatCache::default();
    cache.racy_window_ns = 0;
    let first = apply::describe_files(&root, &paths[..1], Some(&mut cache));
    assert_eq!((&first.entries[..], first.read), (&entries[..1], 1));
    for rec in cache.records_mut().values_mut() {
        rec.hash = [0xee; 32];
    }
    let cached = apply::describe_files(&root, &paths[..1], Some(&mut cache));
    assert_eq!(cached.read, 0);
    assert_eq!(cached.entries[0].hash, Some([0xee; 32]));
    assert_eq!(cached.entries[0].chunks, entries[0].chunks);

    // Enough files to be read on several threads, more than one window,
    // in between paths that cannot be described: answers keep their order.
    for i in 0..100 {
        fs::write(root.join(format!("f{i:03}")), format!("file {i}")).unwrap();
    }
    let scanned = scan_all(&root);
    let mut many = Vec::new();
    let mut expected = Vec::new();
    for i in 0..100 {
        let name = format!("f{i:03}").into_bytes();
        expected.push(
            scanned
                .entries
                .iter()
                .find(|e| e.path == name)
                .unwrap()
                .clone(),
        );
        many.push(name);
        if i % 7 == 0 {
            many.push(format!("gone{i}").into_bytes());
        }
    }
    let described = apply::describe_files(&root, &many, None);
    assert_eq!(described.read, 100);
    assert_eq!(described.entries, expected);
    let gone: Vec<Vec<u8>> = (0..100)
        .step_by(7)
        .map(|i| format!("gone{i}").into_bytes())
        .collect();
    let problems: Vec<Vec<u8>> = described.problems.into_iter().map(|p| p.path).collect();
    assert_eq!(problems, gone);
}

/// Files an applier commits go into the stat cache: the next scan takes
/// their hashes from there (poisoned here, to prove it read nothing), but
/// not a file whose mtime is too fresh to trust, nor one written since.
#[test]
fn committed_files_are_recorded_for_the_next_scan() {
    let t = TempDir::new();
    let root = t.path().join("tree");
    fs::create_dir(&root).unwrap();
    let mut ap = Applier::new(&root);
    let mut fresh = put(b"fresh", b"new content", Expect::Absent);
    fresh.mtime_ns = sys::now_ns();
    let report = put_files(
        &mut ap,
        vec![
            put(b"old", b"old content", Expect::Absent),
            put(b"d/later", b"to be changed", Expect::Absent),
            fresh,
        ],
    );
    assert_eq!(report.done, 3, "{report:?}");
    let written = ap.take_written();
    let names: Vec<u64> = written.iter().map(|w| w.size).collect();
    assert_eq!(names, [11, 13], "{written:?}");
    assert!(ap.take_written().is_empty());

    let mut cache = StatCache::default();
    cache.record_written(&written);
    for rec in cache.records_mut().values_mut() {
        rec.hash = [0xee; 32];
    }
    // Written since its commit: its mtime is now, not the recorded one.
    fs::write(root.join("d/later"), b"changed after").unwrap();
    let out = scan(&root, &FilterSpec::default(), &opts(), Some(&mut cache));
    let hash = |name: &[u8]| out.entries.iter().find(|e| e.path == name).unwrap().hash;
    assert_eq!(hash(b"old"), Some([0xee; 32]));
    assert_eq!(
        hash(b"d/later"),
        Some(*blake3::hash(b"changed after").as_bytes())
    );
    assert_eq!(
        hash(b"fresh"),
        Some(*blake3::hash(b"new content").as_bytes())
    );
}

/// A large file committed from staged parts is recorded with its hash and
/// no chunk list: a scan that wants no chunk lists (a sync's scan of the
/// host) takes the hash from the cache (poisoned, to prove it read
/// nothing), while a describe, which wants the list, reads the file.
#[test]
fn committed_large_files_serve_scans_without_chunk_lists() {
    let t = TempDir::new();
    let root = t.path().join("tree");
    fs::create_dir(&root).unwrap();
    let big = pseudo_random(CHUNKED_MIN_SIZE as usize * 2 + 77, 11);
    let (hash, size) = (*blake3::hash(&big).as_bytes(), big.len() as u64);
    let mut ap = Applier::new(&root);
    let half = big.len() / 2;
    for (offset, piece) in [(0, &big[..half]), (half, &big[half..])] {
        let data = PartData::Data(codec::compress(piece));
        ap.put_part(1, b"big", (&hash, size), offset as u64, &data)
            .unwrap();
    }
    let staged = FilePut {
        content: FileContent::Staged { xfer: 1 },
        size,
        hash,
        ..put(b"big", b"", Expect::Absent)
    };
    let report = put_files(&mut ap, vec![staged]);
    assert_eq!(report.done, 1, "{report:?}");
    let written = ap.take_written();
    assert_eq!(written.len(), 1, "{written:?}");

    let mut cache = StatCache::default();
    cache.record_written(&written);
    for rec in cache.records_mut().values_mut() {
        rec.hash = [0xee; 32];
    }
    let no_lists = ScanOptions {
        chunk_lists: false,
        ..opts()
    };
    let out = scan(&root, &FilterSpec::default(), &no_lists, Some(&mut cache));
    assert_eq!(out.entries[0].hash, Some([0xee; 32]));
    let described = apply::describe_files(&root, &[b"big".to_vec()], Some(&mut cache));
    assert_eq!(described.read, 1);
    assert_eq!(described.entries[0], scan_all(&root).entries[0]);
    assert!(described.entries[0].chunks.len() > 50);
}

#[test]
fn push_round_trips_odd_trees() {
    let t = TempDir::new();
    let (src, dst) = (t.path().join("src"), t.path().join("dst/deeper"));
    fs::create_dir(&src).unwrap();
    odd_tree(&src);
    let (plan, problems) = push(&src, &dst, &DiffOptions::default()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(plan.unchanged, 0);
    assert_same(&src, &dst);
    assert!(temp_files(&dst).is_empty());
    assert_eq!(
        fs::read_link(dst.join("link")).unwrap(),
        Path::new("dir with space/a file.txt")
    );

    // A second run has nothing to do.
    let (plan, problems) = push(&src, &dst, &DiffOptions::default()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert!(plan.is_empty(), "{plan:?}");

    // Edits, a kind change each way, attributes only, and extras.
    fs::write(src.join("zero"), b"now with content").unwrap();
    fs::remove_file(src.join("exec.sh")).unwrap();
    fs::create_dir(src.join("exec.sh")).unwrap();
    fs::write(src.join("exec.sh/inside"), b"i").unwrap();
    fs::remove_dir(src.join("empty")).unwrap();
    fs::write(src.join("empty"), b"was a dir").unwrap();
    fs::set_permissions(
        src.join(p(b"bin\xff\xfe")),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::remove_file(src.join("link")).unwrap();
    symlink("elsewhere", src.join("link")).unwrap();
    fs::write(dst.join("extra"), b"only in dst").unwrap();
    fs::create_dir_all(dst.join("extra dir/sub")).unwrap();
    fs::write(dst.join("extra dir/sub/f"), b"x").unwrap();
    let (plan, problems) = push(&src, &dst, &DiffOptions::default()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        plan.replace_removes,
        [b"exec.sh".to_vec(), b"empty".to_vec()]
    );
    assert_eq!(plan.attrs.len(), 1);
    assert!(
        dst.join("extra").exists(),
        "extras stay without delete_extras"
    );
    let (plan, problems) = push(
        &src,
        &dst,
        &DiffOptions {
            delete_extras: true,
            force: false,
        },
    )
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(plan.removes, [b"extra dir".to_vec(), b"extra".to_vec()]);
    assert_same(&src, &dst);
}

#[test]
fn symlinks_never_lead_outside() {
    let t = TempDir::new();
    let (root, outside) = (t.path().join("root"), t.path().join("outside"));
    fs::create_dir(&root).unwrap();
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"keep me").unwrap();
    symlink(&outside, root.join("out")).unwrap();
    symlink(outside.join("secret"), root.join("file-link")).unwrap();
    let mut ap = Applier::new(&root);

    let report = put_files(
        &mut ap,
        vec![
            put(b"out/x", b"data", Expect::Any),
            put(b"out/new/y", b"data", Expect::Any),
        ],
    );
    assert_eq!(report.done, 0);
    assert_eq!(report.problems.len(), 2);
    assert!(
        report.problems[0]
            .message
            .contains("parent is not a directory (symlink?)"),
        "{report:?}"
    );
    assert!(!outside.join("x").exists() && !outside.join("new").exists());

    // Writing over a symlink replaces the link, not its target.
    let report = put_files(&mut ap, vec![put(b"file-link", b"new", Expect::Any)]);
    assert_eq!(report.done, 1, "{report:?}");
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"keep me");
    assert_eq!(fs::read(root.join("file-link")).unwrap(), b"new");
    symlink(outside.join("secret"), root.join("file-link2")).unwrap();

    let report = ap.apply_meta(&[
        MetaOp::Mkdir {
            path: b"out/d".to_vec(),
            mode: 0o755,
        },
        MetaOp::Symlink {
            path: b"out/l".to_vec(),
            target: b"x".to_vec(),
        },
        MetaOp::SetAttrs {
            path: b"out/secret".to_vec(),
            mode: 0o777,
            mtime_ns: 0,
        },
        MetaOp::Remove {
            path: b"out/secret".to_vec(),
        },
        MetaOp::SetAttrs {
            path: b"file-link2".to_vec(),
            mode: 0o777,
            mtime_ns: 5_000_000_000,
        },
    ]);
    assert_eq!(report.done, 1, "{report:?}");
    assert_eq!(report.problems.len(), 4);
    let secret = fs::metadata(outside.join("secret")).unwrap();
    assert_ne!(secret.permissions().mode() & 0o777, 0o777);
    assert_ne!(
        secret.modified().unwrap(),
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(5)
    );
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1);

    assert!(
        ap.put_part(
            1,
            b"out/big",
            (&[1; 32], 1 << 20),
            0,
            &PartData::Data(codec::compress(b"x"))
        )
        .is_err()
    );
    let mut sink = |_: u64, _: Vec<u8>| Ok(());
    let spec = |path: &[u8]| ReadSpec {
        path: path.to_vec(),
        ranges: None,
    };
    assert!(read_file(&root, &spec(b"out/secret"), 1024, &mut sink).is_err());
    let err = read_file(&root, &spec(b"file-link2"), 1024, &mut sink).unwrap_err();
    assert!(err.message.contains("symlink"), "{err:?}");

    // Removing a directory that holds a symlink removes the link only.
    fs::create_dir(root.join("d")).unwrap();
    symlink(&outside, root.join("d/inner")).unwrap();
    let report = ap.apply_meta(&[
        MetaOp::Remove {
            path: b"d".to_vec(),
        },
        MetaOp::Remove {
            path: b"out".to_vec(),
        },
    ]);
    assert_eq!(report.done, 2, "{report:?}");
    assert!(!root.join("d").exists() && !root.join("out").exists());
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"keep me");
}

#[test]
fn expect_and_hash_checks_refuse() {
    let t = TempDir::new();
    let root = t.path();
    fs::write(root.join("f"), b"original").unwrap();
    let st = fs::metadata(root.join("f")).unwrap();
    let mtime_ns = {
        use std::os::unix::fs::MetadataExt;
        st.mtime() * 1_000_000_000 + st.mtime_nsec()
    };
    let mut ap = Applier::new(root);

    let mut bad_hash = put(b"new", b"payload", Expect::Absent);
    bad_hash.hash = [0; 32];
    let mut bad_size = put(b"new2", b"payload", Expect::Absent);
    bad_size.size = 3;
    let report = put_files(
        &mut ap,
        vec![
            put(b"f", b"x", Expect::Absent),
            put(
                b"f",
                b"x",
                Expect::File {
                    size: 8,
                    mtime_ns: mtime_ns + 1,
                },
            ),
            bad_hash,
            bad_size,
            put(b"f/under-a-file", b"x", Expect::Any),
        ],
    );
    assert_eq!(report.done, 0);
    let messages: Vec<&str> = report.problems.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(messages[0], "changed underneath since the scan; rerun");
    assert_eq!(messages[1], "changed underneath since the scan; rerun");
    assert!(messages[2].contains("hash"), "{messages:?}");
    assert!(
        messages[3].contains("expands past") || messages[3].contains("bytes"),
        "{messages:?}"
    );
    assert!(messages[4].contains("not a directory"), "{messages:?}");
    assert_eq!(fs::read(root.join("f")).unwrap(), b"original");
    assert!(!root.join("new").exists() && !root.join("new2").exists());
    assert!(temp_files(root).is_empty(), "{:?}", temp_files(root));

    // The matching expectation goes through, with mode and mtime.
    let ok = put(b"f", b"replaced", Expect::File { size: 8, mtime_ns });
    let report = put_files(&mut ap, vec![ok]);
    assert_eq!(report.done, 1, "{report:?}");
    assert_eq!(fs::read(root.join("f")).unwrap(), b"replaced");
    let out = scan_all(root);
    let f = out.entries.iter().find(|e| e.path == b"f").unwrap();
    assert_eq!((f.mode, f.mtime_ns), (0o640, 1_600_000_000_123_456_789));

    // A directory is never replaced by a file.
    fs::create_dir(root.join("dir")).unwrap();
    let report = put_files(&mut ap, vec![put(b"dir", b"x", Expect::Any)]);
    assert_eq!(report.problems[0].message, "a directory is in the way");
    assert!(temp_files(root).is_empty());
}

#[test]
fn bad_paths_are_problems() {
    let t = TempDir::new();
    let mut ap = Applier::new(t.path());
    let report = put_files(
        &mut ap,
        vec![
            put(b"../escape", b"x", Expect::Any),
            put(b"/abs", b"x", Expect::Any),
            put(b"a//b", b"x", Expect::Any),
        ],
    );
    assert_eq!(report.problems.len(), 3);
    assert!(!t.path().parent().unwrap().join("escape").exists());
}

#[test]
fn meta_ops() {
    let t = TempDir::new();
    let root = t.path().join("new root");
    let mut ap = Applier::new(&root);
    let report = ap.apply_meta(&[
        MetaOp::Mkdir {
            path: b"a/b/c".to_vec(),
            mode: 0o750,
        },
        MetaOp::Mkdir {
            path: b"a/b/c".to_vec(),
            mode: 0o700,
        },
        MetaOp::Symlink {
            path: b"a/l".to_vec(),
            target: b"b/c".to_vec(),
        },
        MetaOp::Symlink {
            path: b"a/l".to_vec(),
            target: b"retargeted".to_vec(),
        },
        MetaOp::SetAttrs {
            path: b"a/l".to_vec(),
            mode: 0o600,
            mtime_ns: 7_000_000_001,
        },
        MetaOp::SetAttrs {
            path: b"a/b".to_vec(),
            mode: 0o711,
            mtime_ns: 8_000_000_002,
        },
        MetaOp::Remove {
            path: b"nope".to_vec(),
        },
        MetaOp::Remove {
            path: b"missing/parent/x".to_vec(),
        },
        MetaOp::Abort { xfer: 99 },
        MetaOp::Symlink {
            path: b"a/b".to_vec(),
            target: b"x".to_vec(),
        },
        MetaOp::SetAttrs {
            path: b"missing".to_vec(),
            mode: 0o600,
            mtime_ns: 0,
        },
    ]);
    assert_eq!(report.done, 9, "{report:?}");
    assert_eq!(report.problems.len(), 2);
    assert_eq!(report.problems[0].message, "a directory is in the way");
    let out = scan_all(&root);
    let by: HashMap<&[u8], &TreeEntry> =
        out.entries.iter().map(|e| (e.path.as_slice(), e)).collect();
    assert_eq!(by[&b"a/b/c"[..]].mode, 0o700);
    assert_eq!(
        (by[&b"a/b"[..]].mode, by[&b"a/b"[..]].mtime_ns),
        (0o711, 8_000_000_002)
    );
    assert_eq!(
        by[&b"a/l"[..]].kind,
        EntryKind::Symlink {
            target: b"retargeted".to_vec()
        }
    );
    assert_eq!(by[&b"a/l"[..]].mtime_ns, 7_000_000_001);
    assert!(temp_files(&root).is_empty());
}

#[test]
fn large_file_edit_changes_few_chunks_and_delta_assembles() {
    let t = TempDir::new();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&dst).unwrap();
    let old = pseudo_random(20 << 20, 42);
    let mut new = old.clone();
    let mid = new.len() / 2;
    new[mid..mid + 4096].copy_from_slice(&pseudo_random(4096, 43));
    fs::write(dst.join("big"), &old).unwrap();
    fs::write(src.join("big"), &new).unwrap();
    let s = scan_all(&src).entries.remove(0);
    let d = scan_all(&dst).entries.remove(0);
    assert!(s.chunks.len() > 100, "{} chunks", s.chunks.len());
    let have: HashMap<[u8; 32], (u64, u32)> = d
        .chunks
        .iter()
        .map(|c| (c.hash, (c.offset, c.len)))
        .collect();
    let missing: Vec<_> = s
        .chunks
        .iter()
        .filter(|c| !have.contains_key(&c.hash))
        .collect();
    assert!(
        !missing.is_empty() && missing.len() <= 3,
        "{} chunks differ",
        missing.len()
    );

    // Delta: reuse what the destination has, send the rest.
    let plan = diff(
        std::slice::from_ref(&s),
        std::slice::from_ref(&d),
        &DiffOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.files.len(), 1);
    let mut ap = Applier::new(&dst);
    let xfer = 7;
    // Parts in reverse order: offsets are explicit.
    for c in s.chunks.iter().rev() {
        let data = match have.get(&c.hash) {
            Some(&(from, len)) => PartData::Copy {
                from_offset: from,
                len: len as u64,
            },
            None => PartData::Data(codec::compress(
                &new[c.offset as usize..c.offset as usize + c.len as usize],
            )),
        };
        ap.put_part(xfer, b"big", (&[7; 32], 1 << 20), c.offset, &data)
            .unwrap();
    }
    assert_eq!(temp_files(&dst).len(), 1);
    let report = put_files(
        &mut ap,
        vec![FilePut {
            path: b"big".to_vec(),
            mode: 0o600,
            mtime_ns: s.mtime_ns,
            size: s.size,
            hash: s.hash.unwrap(),
            expect: Expect::File {
                size: d.size,
                mtime_ns: d.mtime_ns,
            },
            content: FileContent::Staged { xfer },
        }],
    );
    assert_eq!(report.done, 1, "{report:?}");
    assert!(fs::read(dst.join("big")).unwrap() == new);
    assert!(temp_files(&dst).is_empty());

    // A wrong assembly fails the hash check and leaves nothing behind.
    ap.put_part(
        8,
        b"big",
        (&[8; 32], 1 << 20),
        0,
        &PartData::Copy {
            from_offset: 0,
            len: 100,
        },
    )
    .unwrap();
    let report = put_files(&mut ap, vec![put(b"big", &new[..100], Expect::Any)]);
    assert_eq!(report.done, 1);
    let mut staged = put(b"big", b"something else", Expect::Any);
    staged.content = FileContent::Staged { xfer: 8 };
    let report = put_files(&mut ap, vec![staged]);
    assert_eq!(report.done, 0);
    assert!(temp_files(&dst).is_empty());

    // Copy past the end of the current file is an error; Abort and Drop clean up.
    assert!(
        ap.put_part(
            9,
            b"big",
            (&[9; 32], 1 << 20),
            0,
            &PartData::Copy {
                from_offset: 50,
                len: 100
            }
        )
        .is_err()
    );
    ap.apply_meta(&[MetaOp::Abort { xfer: 9 }]);
    assert!(temp_files(&dst).is_empty());
    ap.put_part(
        10,
        b"big",
        (&[10; 32], 1 << 20),
        0,
        &PartData::Data(codec::compress(b"abc")),
    )
    .unwrap();
    assert!(
        ap.put_part(
            10,
            b"other",
            (&[10; 32], 1 << 20),
            0,
            &PartData::Data(codec::compress(b"abc"))
        )
        .is_err()
    );
    assert_eq!(temp_files(&dst).len(), 1);
    // An applier that goes without committing (its connection was lost)
    // leaves a staging file named after its content, for a later transfer to
    // resume; a transfer whose content name was taken stages under its own
    // name, which goes with the applier.
    let mut other = Applier::new(&dst);
    other
        .put_part(
            11,
            b"big",
            (&[10; 32], 1 << 20),
            0,
            &PartData::Data(codec::compress(b"x")),
        )
        .unwrap();
    assert_eq!(temp_files(&dst).len(), 2);
    drop(other);
    drop(ap);
    let left = temp_files(&dst);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with(&apply::resumable_name(&[10; 32], 1 << 20)));
}

#[test]
fn an_interrupted_transfer_is_resumed_from_what_arrived() {
    let t = TempDir::new();
    let content = pseudo_random(3 << 20, 21);
    let hash = *blake3::hash(&content).as_bytes();
    let size = content.len() as u64;
    let chunks: Vec<ChunkRef> = {
        let path = t.path().join("source");
        fs::write(&path, &content).unwrap();
        let (_, chunks) = crate::chunk::hash_file(&path, true).unwrap();
        fs::remove_file(&path).unwrap();
        chunks
    };
    assert!(chunks.len() > 10);
    let part = |c: &ChunkRef| {
        PartData::Data(codec::compress(
            &content[c.offset as usize..c.offset as usize + c.len as usize],
        ))
    };
    // The first transfer gets half the chunks across, then its connection
    // goes (the applier is dropped without a commit).
    let half = chunks.len() / 2;
    let mut first = Applier::new(t.path());
    for c in &chunks[..half] {
        first
            .put_part(1, b"d/model.bin", (&hash, size), c.offset, &part(c))
            .unwrap();
    }
    drop(first);
    // A sync scan lists the partial by directory and content.
    let reaping = ScanOptions {
        reap_stale_temps: true,
        ..opts()
    };
    let out = scan(t.path(), &FilterSpec::default(), &reaping, None);
    assert_eq!(out.summary.partials.len(), 1);
    let partial = &out.summary.partials[0];
    assert_eq!(partial.dir, b"d");
    assert_eq!(
        (partial.hash_prefix, partial.size),
        (hash[..16].try_into().unwrap(), size)
    );
    // The next transfer adopts it: exactly the chunks that arrived are there.
    let mut second = Applier::new(t.path());
    let present = second
        .resume(2, b"d/model.bin", (&hash, size), &chunks)
        .unwrap();
    assert_eq!(present, (0..half as u32).collect::<Vec<_>>());
    // A third transfer of the same content meanwhile cannot take it over.
    let mut third = Applier::new(t.path());
    assert!(
        third
            .resume(3, b"d/model.bin", (&hash, size), &chunks)
            .unwrap()
            .is_empty()
    );
    drop(third);
    for c in &chunks[half..] {
        second
            .put_part(2, b"d/model.bin", (&hash, size), c.offset, &part(c))
            .unwrap();
    }
    let mut put = put(b"d/model.bin", &content, Expect::Absent);
    put.content = FileContent::Staged { xfer: 2 };
    let report = put_files(&mut second, vec![put]);
    assert_eq!(report.done, 1, "{report:?}");
    assert!(fs::read(t.path().join("d/model.bin")).unwrap() == content);
    drop(second);
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );

    // A corrupted partial: chunks that no longer match are not counted, and
    // nothing wrong can reach the final path (the commit checks the hash).
    let mut first = Applier::new(t.path());
    for c in &chunks {
        first
            .put_part(4, b"e/model.bin", (&hash, size), c.offset, &part(c))
            .unwrap();
    }
    drop(first);
    let staging = t.path().join("e").join(apply::resumable_name(&hash, size));
    let mut bytes = fs::read(&staging).unwrap();
    bytes[chunks[1].offset as usize] ^= 1;
    fs::write(&staging, &bytes).unwrap();
    let mut again = Applier::new(t.path());
    let present = again
        .resume(5, b"e/model.bin", (&hash, size), &chunks)
        .unwrap();
    assert_eq!(present.len(), chunks.len() - 1);
    assert!(!present.contains(&1));
    drop(again);

    // A transfer that does not resume (no chunk list, say) takes an unheld
    // partial of its content over from scratch instead of staging a second
    // copy beside it.
    let mut fresh = Applier::new(t.path());
    fresh
        .put_part(6, b"e/model.bin", (&hash, size), 0, &part(&chunks[0]))
        .unwrap();
    let left = temp_files(&t.path().join("e"));
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        fs::metadata(&staging).unwrap().len(),
        u64::from(chunks[0].len)
    );
}

#[test]
fn staged_files_are_checked_against_what_is_on_disk() {
    // Parts sent in order are hashed as they are written; anything else
    // (a part rewritten, parts out of order) is hashed from the file at the
    // commit. Either way the commit holds exactly the bytes that were hashed.
    let t = TempDir::new();
    let mut ap = Applier::new(t.path());
    let data = |b: &[u8]| PartData::Data(codec::compress(b));
    let staged = |xfer, content: &[u8]| {
        let mut p = put(b"f", content, Expect::Any);
        p.content = FileContent::Staged { xfer };
        p
    };
    // In order: committed without reading back.
    ap.put_part(1, b"f", (&[1; 32], 1 << 20), 0, &data(b"abcd"))
        .unwrap();
    ap.put_part(1, b"f", (&[1; 32], 1 << 20), 4, &data(b"efgh"))
        .unwrap();
    assert_eq!(put_files(&mut ap, vec![staged(1, b"abcdefgh")]).done, 1);
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"abcdefgh");
    // A part rewritten after later ones: the file, not the stream, counts.
    ap.put_part(2, b"f", (&[2; 32], 1 << 20), 0, &data(b"abcd"))
        .unwrap();
    ap.put_part(2, b"f", (&[2; 32], 1 << 20), 4, &data(b"efgh"))
        .unwrap();
    ap.put_part(2, b"f", (&[2; 32], 1 << 20), 0, &data(b"XXXX"))
        .unwrap();
    let report = put_files(&mut ap, vec![staged(2, b"abcdefgh")]);
    assert_eq!(report.done, 0, "{report:?}");
    ap.put_part(3, b"f", (&[3; 32], 1 << 20), 4, &data(b"efgh"))
        .unwrap();
    ap.put_part(3, b"f", (&[3; 32], 1 << 20), 0, &data(b"XXXX"))
        .unwrap();
    assert_eq!(put_files(&mut ap, vec![staged(3, b"XXXXefgh")]).done, 1);
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"XXXXefgh");
    // In order but short of the size: refused.
    ap.put_part(4, b"f", (&[4; 32], 1 << 20), 0, &data(b"abcd"))
        .unwrap();
    assert_eq!(put_files(&mut ap, vec![staged(4, b"abcdefgh")]).done, 0);
    // An aborted transfer cannot be begun again by a part or a resume that
    // arrives after its abort.
    ap.apply_meta(&[MetaOp::Abort { xfer: 5 }]);
    let late = ap.put_part(5, b"f", (&[5; 32], 1 << 20), 0, &data(b"abcd"));
    assert!(late.unwrap_err().contains("aborted"));
    assert!(ap.resume(5, b"f", (&[5; 32], 1 << 20), &[]).is_err());
    assert!(temp_files(t.path()).is_empty());
}

#[test]
fn a_batch_is_written_and_committed_outside_its_applier() {
    // A batch's staged files are claimed from the applier, which then
    // takes the next parts while the batch is written and committed.
    let t = TempDir::new();
    let mut ap = Applier::new(t.path());
    let data = |b: &[u8]| PartData::Data(codec::compress(b));
    let staged = |path: &[u8], xfer, content: &[u8]| {
        let mut p = put(path, content, Expect::Any);
        p.content = FileContent::Staged { xfer };
        p
    };
    ap.put_part(1, b"d/big", (&[1; 32], 1 << 20), 0, &data(b"big one"))
        .unwrap();
    ap.put_part(2, b"elsewhere", (&[2; 32], 1 << 20), 0, &data(b"other"))
        .unwrap();
    let req = PutFiles {
        root: String::new(),
        create_parents: true,
        files: vec![
            put(b"d/small", b"small one", Expect::Any),
            staged(b"d/big", 1, b"big one"),
            // Staged for another path: refused, and left for that path.
            staged(b"d/wrong", 2, b"other"),
            staged(b"d/never", 9, b"nothing"),
        ],
    };
    let claimed = ap.claim(&req);
    // The applier goes on meanwhile.
    ap.put_part(3, b"d/next", (&[3; 32], 1 << 20), 0, &data(b"next"))
        .unwrap();
    let prepared = apply::prepare_files(t.path(), &req, claimed, || ());
    assert!(!t.path().join("d/small").exists());
    assert!(!t.path().join("d/big").exists());
    let (report, written) = prepared.commit();
    assert_eq!(report.done, 2, "{report:?}");
    let messages: Vec<&str> = report.problems.iter().map(|p| &p.message[..]).collect();
    assert_eq!(
        messages,
        [
            "transfer 2 was staged for elsewhere, not for this path",
            "no staged transfer 9"
        ]
    );
    assert_eq!(written.len(), 2);
    assert_eq!(fs::read(t.path().join("d/small")).unwrap(), b"small one");
    assert_eq!(fs::read(t.path().join("d/big")).unwrap(), b"big one");
    assert!(!t.path().join("d/wrong").exists());
    ap.add_written(written);
    assert_eq!(ap.take_written().len(), 2);
    let report = put_files(
        &mut ap,
        vec![
            staged(b"elsewhere", 2, b"other"),
            staged(b"d/next", 3, b"next"),
        ],
    );
    assert_eq!(report.done, 2, "{report:?}");
    assert_eq!(fs::read(t.path().join("d/next")).unwrap(), b"next");
    assert!(temp_files(t.path()).is_empty());
}

#[test]
fn a_cancelled_transfer_leaves_its_partial_for_the_next_one() {
    let t = TempDir::new();
    let content = pseudo_random(3 << 20, 22);
    let hash = *blake3::hash(&content).as_bytes();
    let size = content.len() as u64;
    let chunks: Vec<ChunkRef> = {
        let path = t.path().join("source");
        fs::write(&path, &content).unwrap();
        let (_, chunks) = crate::chunk::hash_file(&path, true).unwrap();
        fs::remove_file(&path).unwrap();
        chunks
    };
    let half = chunks.len() / 2;
    assert!(half > 4);
    let part = |c: &ChunkRef| {
        PartData::Data(codec::compress(
            &content[c.offset as usize..c.offset as usize + c.len as usize],
        ))
    };
    let reaping = ScanOptions {
        reap_stale_temps: true,
        ..opts()
    };
    let staging = |dir: &str| t.path().join(dir).join(apply::resumable_name(&hash, size));

    // Half the chunks arrive, then the sender gives the transfer up (a
    // cancel) on a connection that stays open.
    let mut ap = Applier::new(t.path());
    for c in &chunks[..half] {
        ap.put_part(1, b"d/model.bin", (&hash, size), c.offset, &part(c))
            .unwrap();
    }
    let report = ap.apply_meta(&[MetaOp::Abort { xfer: 1 }]);
    assert!(report.problems.is_empty(), "{report:?}");
    // The partial stays, as for a transfer cut short; nothing at the final
    // path, and a part that lands after the abort does not stage it again.
    assert!(staging("d").exists());
    assert!(!t.path().join("d/model.bin").exists());
    let late = ap.put_part(1, b"d/model.bin", (&hash, size), 0, &part(&chunks[0]));
    assert!(late.unwrap_err().contains("aborted"));
    let out = scan(t.path(), &FilterSpec::default(), &reaping, None);
    assert_eq!(out.summary.partials.len(), 1, "{:?}", out.summary.partials);
    // The next transfer, on the same connection, adopts what arrived.
    let present = ap
        .resume(2, b"d/model.bin", (&hash, size), &chunks)
        .unwrap();
    assert_eq!(present, (0..half as u32).collect::<Vec<_>>());
    for c in &chunks[half..] {
        ap.put_part(2, b"d/model.bin", (&hash, size), c.offset, &part(c))
            .unwrap();
    }
    let mut staged = put(b"d/model.bin", &content, Expect::Absent);
    staged.content = FileContent::Staged { xfer: 2 };
    assert_eq!(put_files(&mut ap, vec![staged]).done, 1);
    assert!(fs::read(t.path().join("d/model.bin")).unwrap() == content);
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );

    // A staging file a write failed on is not kept.
    ap.put_part(3, b"e/model.bin", (&hash, size), 0, &part(&chunks[0]))
        .unwrap();
    let corrupt = PartData::Data(b"\x01not zstd at all".to_vec());
    let offset = chunks[1].offset;
    assert!(
        ap.put_part(3, b"e/model.bin", (&hash, size), offset, &corrupt)
            .is_err()
    );
    ap.apply_meta(&[MetaOp::Abort { xfer: 3 }]);
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );

    // Nor is one staged under the transfer's own name (its content's name
    // was held by another live transfer): it could never be resumed.
    ap.put_part(4, b"f/model.bin", (&hash, size), 0, &part(&chunks[0]))
        .unwrap();
    ap.put_part(5, b"f/model.bin", (&hash, size), 0, &part(&chunks[0]))
        .unwrap();
    assert_eq!(temp_files(&t.path().join("f")).len(), 2);
    ap.apply_meta(&[MetaOp::Abort { xfer: 5 }]);
    let left = temp_files(&t.path().join("f"));
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(staging("f").exists());

    // A released partial that nothing resumes goes with the next sync scan
    // a day on; until then it is kept.
    ap.apply_meta(&[MetaOp::Abort { xfer: 4 }]);
    assert!(staging("f").exists());
    apply::CLOCK_SKEW_NS.set(3600 * 1_000_000_000);
    scan(t.path(), &FilterSpec::default(), &reaping, None);
    assert!(staging("f").exists());
    apply::CLOCK_SKEW_NS.set(2 * 86_400 * 1_000_000_000);
    scan(t.path(), &FilterSpec::default(), &reaping, None);
    apply::CLOCK_SKEW_NS.set(0);
    assert!(
        temp_files(t.path()).is_empty(),
        "{:?}",
        temp_files(t.path())
    );
}

#[test]
fn leftovers_of_a_killed_writer_are_reaped_by_the_next_sync_scan() {
    let t = TempDir::new();
    fs::create_dir(t.path().join("d")).unwrap();
    fs::write(t.path().join("d/kept.txt"), b"user data").unwrap();
    // Temporary files of a writer that was killed.
    let dead_part = t.path().join("d/.outpost-part-3.tmp");
    let dead_temp = t.path().join(".outpost-00000000deadbeef.tmp");
    // Partials a later transfer may resume.
    let resumable = t.path().join(apply::resumable_name(&[5; 32], 100));
    // Not one of ours by its name, though it has our prefix.
    let other = t.path().join(".outpost-notes");
    for path in [&dead_part, &dead_temp, &resumable, &other] {
        fs::write(path, b"partial").unwrap();
    }
    // A verified temporary file carries the source's (old) mtime until its
    // rename: age must not be read from it.
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(30 * 86_400);
    fs::File::options()
        .write(true)
        .open(&dead_temp)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    // A live applier's staging file: locked, so kept however old.
    let mut ap = Applier::new(t.path());
    let data = PartData::Data(codec::compress(b"abc"));
    ap.put_part(9, b"d/big", (&[9; 32], 1 << 20), 0, &data)
        .unwrap();
    let live = t
        .path()
        .join("d")
        .join(apply::resumable_name(&[9; 32], 1 << 20));
    assert!(live.exists());

    let reaping = ScanOptions {
        reap_stale_temps: true,
        ..opts()
    };
    let reap_at = |skew_s: i64| {
        apply::CLOCK_SKEW_NS.set(skew_s * 1_000_000_000);
        let out = scan(t.path(), &FilterSpec::default(), &reaping, None);
        apply::CLOCK_SKEW_NS.set(0);
        assert!(
            out.summary.problems.is_empty(),
            "{:?}",
            out.summary.problems
        );
        let mut sizes: Vec<u64> = out.summary.partials.iter().map(|p| p.size).collect();
        sizes.sort();
        sizes
    };
    // Listings never remove anything, and a sync scan nothing young.
    apply::CLOCK_SKEW_NS.set(3 * 86_400 * 1_000_000_000);
    scan_all(t.path());
    apply::CLOCK_SKEW_NS.set(0);
    assert_eq!(temp_files(t.path()).len(), 5);
    assert_eq!(reap_at(0), vec![100, 1 << 20]);
    assert_eq!(temp_files(t.path()).len(), 5);
    // An hour on: the dead writer's files go, partials stay a day.
    assert_eq!(reap_at(3600), vec![100, 1 << 20]);
    assert!(!dead_part.exists() && !dead_temp.exists());
    assert!(resumable.exists() && live.exists() && other.exists());
    // Two days on: unheld partials go too; the held one stays.
    assert_eq!(reap_at(2 * 86_400), vec![1 << 20]);
    assert!(!resumable.exists() && live.exists() && other.exists());
    assert!(t.path().join("d/kept.txt").exists());
    // The live transfer still commits.
    let mut staged = put(b"d/big", b"abc", Expect::Any);
    staged.content = FileContent::Staged { xfer: 9 };
    assert_eq!(put_files(&mut ap, vec![staged]).done, 1);
    assert_eq!(fs::read(t.path().join("d/big")).unwrap(), b"abc");
}

#[test]
fn read_file_pieces_and_ranges() {
    let t = TempDir::new();
    let data = pseudo_random(10_000, 5);
    fs::write(t.path().join("f"), &data).unwrap();
    fs::write(t.path().join("empty"), b"").unwrap();
    let mut got = Vec::new();
    let spec = ReadSpec {
        path: b"f".to_vec(),
        ranges: None,
    };
    read_file(t.path(), &spec, 3000, &mut |off, encoded| {
        let bytes = codec::decompress(&encoded, 3000).unwrap();
        got.push((off, bytes.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(
        got.iter().flat_map(|(_, b)| b.clone()).collect::<Vec<u8>>(),
        data
    );
    let mut got = Vec::new();
    let spec = ReadSpec {
        path: b"f".to_vec(),
        ranges: Some(vec![(100, 50), (9_990, 100)]),
    };
    read_file(t.path(), &spec, 30, &mut |off, encoded| {
        let bytes = codec::decompress(&encoded, 30).unwrap();
        got.push((off, bytes.to_vec()));
        Ok(())
    })
    .unwrap();
    let offsets: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(offsets, [100, 130, 9_990]);
    assert_eq!(got[0].1, &data[100..130]);
    assert_eq!(got[2].1, &data[9_990..]);
    let mut pieces = 0;
    let spec = ReadSpec {
        path: b"empty".to_vec(),
        ranges: None,
    };
    read_file(t.path(), &spec, 30, &mut |_, encoded| {
        assert!(codec::decompress(&encoded, 0).unwrap().is_empty());
        pieces += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(pieces, 1);
    let spec = ReadSpec {
        path: b"f".to_vec(),
        ranges: None,
    };
    let err = read_file(t.path(), &spec, 30, &mut |_, _| Err("closed".to_string())).unwrap_err();
    assert_eq!(err.message, "closed");
    let spec = ReadSpec {
        path: b"nope".to_vec(),
        ranges: None,
    };
    assert!(read_file(t.path(), &spec, 30, &mut |_, _| Ok(())).is_err());
}

#[test]
fn types_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Applier>();
    send::<StatCache>();
    send_sync::<crate::filter::Filter>();
}

#[test]
fn batch_over_many_directories() {
    // More parents than the applier keeps open at once: committed in groups.
    let t = TempDir::new();
    let mut ap = Applier::new(t.path());
    let files: Vec<FilePut> = (0..600)
        .map(|i| {
            put(
                format!("d{i:03}/f").as_bytes(),
                format!("{i}").as_bytes(),
                Expect::Absent,
            )
        })
        .collect();
    let mut bad = put(b"d000/g", b"x", Expect::Absent);
    bad.hash = [1; 32];
    let mut files = files;
    files.insert(300, bad);
    let report = put_files(&mut ap, files);
    assert_eq!(report.done, 600, "{:?}", report.problems);
    assert_eq!(report.problems.len(), 1);
    assert_eq!(fs::read(t.path().join("d599/f")).unwrap(), b"599");
    assert!(temp_files(t.path()).is_empty());
}

/// Permission bits only bind ordinary users; as root these checks are skipped.
fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn unreadable_paths_as_a_user() {
    if is_root() {
        eprintln!("skipped: root ignores permission bits");
        return;
    }
    let t = TempDir::new();
    fs::write(t.path().join("secret"), b"x").unwrap();
    fs::set_permissions(t.path().join("secret"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::create_dir(t.path().join("closed")).unwrap();
    fs::write(t.path().join("closed/inner"), b"x").unwrap();
    fs::set_permissions(t.path().join("closed"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::write(t.path().join("z"), b"z").unwrap();
    let out = scan_all(t.path());
    let names: Vec<&[u8]> = out.entries.iter().map(|e| e.path.as_slice()).collect();
    assert_eq!(names, [&b"closed"[..], b"secret", b"z"]);
    let problems: Vec<&[u8]> = out
        .summary
        .problems
        .iter()
        .map(|p| p.path.as_slice())
        .collect();
    assert_eq!(problems, [&b"closed"[..], b"secret"]);
    assert!(out.entries[1].hash.is_none());
    fs::set_permissions(t.path().join("closed"), fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn read_only_directory_as_a_user() {
    if is_root() {
        eprintln!("skipped: root ignores permission bits");
        return;
    }
    let t = TempDir::new();
    fs::create_dir(t.path().join("ro")).unwrap();
    fs::write(t.path().join("ro/f"), b"old").unwrap();
    fs::set_permissions(t.path().join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    let mut ap = Applier::new(t.path());
    let report = put_files(
        &mut ap,
        vec![
            put(b"ro/f", b"new", Expect::Any),
            put(b"ok", b"ok", Expect::Any),
        ],
    );
    assert_eq!(report.done, 1);
    assert_eq!(report.problems.len(), 1);
    assert_eq!(fs::read(t.path().join("ro/f")).unwrap(), b"old");
    fs::set_permissions(t.path().join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
    assert!(temp_files(t.path()).is_empty());
}
