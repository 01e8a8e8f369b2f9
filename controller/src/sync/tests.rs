//! Unit tests of the parts of a sync that need no host: local root checks,
//! part planning, metadata batching, remote path splitting, excludes.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use outpost_protocol::{ChunkRef, EntryKind, Expect, MetaOp, PathProblem, ScanSummary, TreeEntry};
use outpost_treesync::filter::{DEFAULT_EXCLUDES, Filter};

use super::limits::{META_BYTES, META_OPS};
use super::local::local_dir;
use super::parts::{Part, expect_of, group_ranges, plan_parts};
use super::planning::{filter_spec, root_problem};
use super::remote::{only, split_remote};
use super::run::meta_batches;
use super::types::SyncOptions;

#[test]
fn special_files_say_what_they_are() {
    let err = local_dir(Path::new("/dev/zero"), true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "local path /dev/zero is a character device, not a file or directory"
    );
    // Pulling into one is refused the same way.
    assert!(local_dir(Path::new("/dev/null"), false).is_err());
    let dir = std::env::temp_dir().join(format!("outpost-sync-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = local_dir(&fifo, true).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.ends_with("is a fifo, not a file or directory"), "{err}");
    // A remote root (the agent's scan says what it is).
    let summary = ScanSummary {
        root_exists: true,
        problems: vec![PathProblem {
            path: Vec::new(),
            message: "a character device, not a file or directory".into(),
        }],
        ..Default::default()
    };
    assert_eq!(
        root_problem("/dev/zero", &summary).unwrap_err().to_string(),
        "/dev/zero is a character device, not a file or directory"
    );
}

fn chunk(offset: u64, len: u32, tag: u8) -> ChunkRef {
    ChunkRef {
        offset,
        len,
        hash: [tag; 32],
    }
}

/// Chunks of the given lengths and tags, laid end to end.
fn chunks(spec: &[(u32, u8)]) -> Vec<ChunkRef> {
    let mut offset = 0;
    spec.iter()
        .map(|&(len, tag)| {
            let c = chunk(offset, len, tag);
            offset += u64::from(len);
            c
        })
        .collect()
}

#[test]
fn parts_copy_what_the_receiver_has() {
    let dst = chunks(&[(10, 1), (10, 2), (10, 3), (10, 4)]);
    // 2 and 3 kept in order, 9 new, 4 moved ahead, 1 dropped.
    let src = chunks(&[(10, 2), (10, 3), (5, 9), (10, 4)]);
    assert_eq!(
        plan_parts(35, &src, &dst, 100, &HashSet::new()),
        vec![
            Part::Copy {
                offset: 0,
                from: 10,
                len: 20
            },
            Part::Data { offset: 20, len: 5 },
            Part::Copy {
                offset: 25,
                from: 30,
                len: 10
            },
        ]
    );
}

#[test]
fn copies_from_distant_places_stay_apart() {
    let dst = chunks(&[(10, 1), (10, 2), (10, 3)]);
    let src = chunks(&[(10, 3), (10, 1)]);
    assert_eq!(
        plan_parts(20, &src, &dst, 100, &HashSet::new()),
        vec![
            Part::Copy {
                offset: 0,
                from: 20,
                len: 10
            },
            Part::Copy {
                offset: 10,
                from: 0,
                len: 10
            },
        ]
    );
}

#[test]
fn data_parts_are_bounded() {
    let src = chunks(&[(10, 5), (10, 6), (10, 7), (10, 8)]);
    let parts = plan_parts(40, &src, &[], 25, &HashSet::new());
    assert_eq!(
        parts,
        vec![
            Part::Data { offset: 0, len: 20 },
            Part::Data {
                offset: 20,
                len: 20
            },
        ]
    );
    // A chunk larger than the bound is split.
    assert_eq!(
        plan_parts(60, &chunks(&[(45, 5), (15, 6)]), &[], 20, &HashSet::new()),
        vec![
            Part::Data { offset: 0, len: 20 },
            Part::Data {
                offset: 20,
                len: 20
            },
            Part::Data { offset: 40, len: 5 },
            Part::Data {
                offset: 45,
                len: 15
            },
        ]
    );
    // No chunk list: plain ranges of at most the bound.
    assert_eq!(
        plan_parts(50, &[], &[], 20, &HashSet::new()),
        vec![
            Part::Data { offset: 0, len: 20 },
            Part::Data {
                offset: 20,
                len: 20
            },
            Part::Data {
                offset: 40,
                len: 10
            },
        ]
    );
}

#[test]
fn chunk_lists_that_do_not_tile_are_not_trusted() {
    let dst = chunks(&[(10, 1)]);
    // A gap, and a list shorter than the file.
    let gap = vec![chunk(0, 10, 1), chunk(15, 10, 2)];
    assert_eq!(
        plan_parts(25, &gap, &dst, 100, &HashSet::new()),
        vec![Part::Data { offset: 0, len: 25 }]
    );
    assert_eq!(
        plan_parts(30, &chunks(&[(10, 1)]), &dst, 100, &HashSet::new()),
        vec![Part::Data { offset: 0, len: 30 }]
    );
    assert!(plan_parts(0, &[], &[], 100, &HashSet::new()).is_empty());
}

#[test]
fn parts_cover_the_file() {
    let dst = chunks(&[(7, 1), (9, 2), (11, 3), (13, 4), (5, 5)]);
    let src = chunks(&[(9, 2), (4, 8), (7, 1), (13, 4), (6, 9), (11, 3)]);
    let size = src.iter().map(|c| u64::from(c.len)).sum();
    let parts = plan_parts(size, &src, &dst, 8, &HashSet::new());
    let mut end = 0;
    for part in &parts {
        let (Part::Copy { offset, .. } | Part::Data { offset, .. }) = *part;
        assert_eq!(offset, end);
        end += part.len();
    }
    assert_eq!(end, size);
}

#[test]
fn ranges_are_grouped_under_the_bound() {
    let parts = [
        Part::Data { offset: 0, len: 10 },
        Part::Copy {
            offset: 10,
            from: 0,
            len: 5,
        },
        Part::Data {
            offset: 15,
            len: 10,
        },
        Part::Data {
            offset: 40,
            len: 30,
        },
    ];
    assert_eq!(
        group_ranges(&parts, 25),
        vec![vec![(0, 10), (15, 10)], vec![(40, 30)]]
    );
}

#[test]
fn meta_batches_keep_order_and_bounds() {
    let ops: Vec<MetaOp> = (0..5000u32)
        .map(|i| MetaOp::Remove {
            path: i.to_string().into_bytes(),
        })
        .collect();
    let batches = meta_batches(ops.clone());
    assert!(batches.iter().all(|b| b.len() <= META_OPS));
    assert_eq!(batches.concat(), ops);
    let long = vec![
        MetaOp::Symlink {
            path: vec![b'a'; 4000],
            target: vec![b'b'; 4000],
        };
        1000
    ];
    for batch in meta_batches(long) {
        let size: usize = batch.len() * 8032;
        assert!(size <= META_BYTES, "{size}");
    }
}

#[test]
fn remote_paths_split_into_root_and_name() {
    let split = |p: &str| split_remote(p).map(|(r, n)| (r, String::from_utf8(n).unwrap()));
    assert_eq!(split("~/a/b.txt").unwrap(), ("~/a".into(), "b.txt".into()));
    assert_eq!(split("~/b").unwrap(), ("~".into(), "b".into()));
    assert_eq!(
        split("/etc/hosts").unwrap(),
        ("/etc".into(), "hosts".into())
    );
    assert_eq!(split("/x").unwrap(), ("/".into(), "x".into()));
    assert_eq!(split("notes.md").unwrap(), (".".into(), "notes.md".into()));
    for bad in ["", "~", "/", "a/", "a/..", "."] {
        assert!(split_remote(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn new_files_expect_nothing_and_replacements_expect_the_scan() {
    assert_eq!(expect_of(&None), Expect::Absent);
    let dst = TreeEntry {
        path: b"f".to_vec(),
        kind: EntryKind::File,
        mode: 0o644,
        size: 3,
        mtime_ns: 42,
        hash: None,
        chunks: vec![],
    };
    assert_eq!(
        expect_of(&Some(dst)),
        Expect::File {
            size: 3,
            mtime_ns: 42
        }
    );
}

#[test]
fn a_filter_can_single_out_any_name() {
    let root = Path::new("/x");
    for name in [
        "plain.txt",
        "a b*{c}[d]?.txt",
        "!bang",
        "#hash",
        "trailing ",
        "back\\slash",
    ] {
        let filter = Filter::new(root, &only(name.as_bytes())).unwrap();
        assert!(
            !filter.excluded(name.as_bytes(), false),
            "{name:?} excluded"
        );
        assert!(filter.excluded(b"other", false), "{name:?}: others kept");
        assert!(
            filter.excluded(b"plain.txtx", false),
            "{name:?}: prefix kept"
        );
    }
}

#[test]
fn defaults_come_first_so_the_caller_can_reinclude() {
    let options = SyncOptions {
        excludes: vec!["!.vscode/".into(), "*.log".into()],
        ..SyncOptions::default()
    };
    let spec = filter_spec(&options, Path::new("/nonexistent")).unwrap();
    assert_eq!(spec.excludes.len(), DEFAULT_EXCLUDES.len() + 2);
    assert_eq!(spec.excludes.last().unwrap(), "*.log");
    let bad = SyncOptions {
        excludes: vec!["a{b".into()],
        ..SyncOptions::default()
    };
    let err = filter_spec(&bad, Path::new("/x")).unwrap_err();
    assert!(err.to_string().contains("a{b"), "{err}");
    // Refused too, though the gitignore parser alone would take them
    // (an unclosed class as a literal, `#…` as a comment), from the
    // options and from an exclude file alike.
    for pattern in ["src/[abc", "#scratch"] {
        let bad = SyncOptions {
            excludes: vec![pattern.into()],
            ..SyncOptions::default()
        };
        let err = filter_spec(&bad, Path::new("/x")).unwrap_err();
        assert!(err.to_string().contains(pattern), "{err}");
    }
    let file = std::env::temp_dir().join(format!("outpost-excludes-{}", std::process::id()));
    std::fs::write(&file, "# a comment\n*.o\nbuild/[ab\n").unwrap();
    let from_file = SyncOptions {
        exclude_file: Some(file.clone()),
        ..SyncOptions::default()
    };
    let err = filter_spec(&from_file, Path::new("/x")).unwrap_err();
    std::fs::remove_file(&file).unwrap();
    assert!(err.to_string().contains("build/[ab"), "{err}");
}
