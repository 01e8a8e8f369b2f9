//! From options and scans to a plan, and from a plan to a report: the
//! filter spec of a sync (default excludes first), its diff options, what
//! scan problems do to a plan (a root refused, removals spared), the
//! dry-run report and the progress totals. The diff itself is
//! [`outpost_treesync::plan::diff`]; this file is named apart from it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use outpost_protocol::{FilterSpec, RelPath, ScanSummary, TreeEntry};
use outpost_treesync::chunk::CHUNKED_MIN_SIZE;
use outpost_treesync::filter::{self, DEFAULT_EXCLUDES, Filter};
use outpost_treesync::plan::{DiffOptions, FileChange, Plan};
use outpost_treesync::relpath;

use super::types::{PLAN_LISTING, Progress, SyncError, SyncOptions, SyncReport};

/// Which entry of a change a description fills in.
#[derive(Clone, Copy)]
pub(super) enum Side {
    /// The file a change replaces (a push's on the host, a pull's here).
    Destination,
    /// The new content (a push's here, a pull's on the host).
    Source,
}

impl Side {
    fn of(self, change: &mut FileChange) -> Option<&mut TreeEntry> {
        match self {
            Side::Destination => change.dst.as_mut(),
            Side::Source => Some(&mut change.src),
        }
    }
}

/// The changes (those `useful` picks) whose `side` is a large file listed
/// with its hash and without its chunk list, by path: what a describe of
/// that side fills in.
pub(super) fn undescribed(
    changes: &mut [FileChange],
    side: Side,
    useful: impl Fn(&FileChange) -> bool,
) -> HashMap<RelPath, usize> {
    let mut wanted = HashMap::new();
    for (i, change) in changes.iter_mut().enumerate() {
        if !useful(change) {
            continue;
        }
        if let Some(entry) = side.of(change)
            && entry.size >= CHUNKED_MIN_SIZE
            && entry.hash.is_some()
            && entry.chunks.is_empty()
        {
            wanted.insert(entry.path.clone(), i);
        }
    }
    wanted
}

/// Takes the chunk lists of `described` files in, for those still the
/// content the scan listed (a file changed since keeps none, and travels
/// whole: it costs bytes, never correctness).
pub(super) fn take_described(
    changes: &mut [FileChange],
    side: Side,
    wanted: &HashMap<RelPath, usize>,
    described: Vec<TreeEntry>,
) {
    for d in described {
        let Some(&i) = wanted.get(&d.path) else {
            continue;
        };
        if let Some(entry) = side.of(&mut changes[i])
            && entry.hash == d.hash
            && entry.size == d.size
        {
            entry.chunks = d.chunks;
        }
    }
}

/// The excludes of a sync: the defaults first, so that the caller's own
/// `!pattern`s can re-include what they exclude.
pub(super) fn filter_spec(options: &SyncOptions, local: &Path) -> Result<FilterSpec, SyncError> {
    let mut excludes = Vec::new();
    if let Some(name) = &options.only {
        // Spares scanning the rest; `only_name` makes it exact (a caller's
        // `!pattern` below could re-include other names).
        excludes.push("/*".to_string());
        excludes.push(format!("!/{}", filter::escape(name)));
    }
    if options.default_excludes {
        excludes.extend(DEFAULT_EXCLUDES.iter().map(|p| p.to_string()));
    }
    excludes.extend(options.excludes.iter().cloned());
    if let Some(file) = &options.exclude_file {
        excludes.extend(filter::read_exclude_file(file).map_err(SyncError::Invalid)?);
    }
    let spec = FilterSpec {
        excludes,
        use_gitignore: options.use_gitignore,
    };
    // Checked here so a bad pattern is refused before anything is scanned.
    Filter::new(local, &spec).map_err(SyncError::Invalid)?;
    Ok(spec)
}

/// Keeps the entries of the one name a single-file sync moves.
pub(super) fn only_name(entries: &mut Vec<TreeEntry>, options: &SyncOptions) {
    if let Some(name) = &options.only {
        entries.retain(|e| relpath::components(&e.path).is_ok_and(|c| c[0] == name.as_bytes()));
    }
}

pub(super) fn diff_options(options: &SyncOptions) -> DiffOptions {
    DiffOptions {
        delete_extras: options.delete_extras && options.only.is_none(),
        force: options.force,
    }
}

pub(super) fn dry_run_report(mut report: SyncReport, plan: &Plan, started: Instant) -> SyncReport {
    report.would_send = plan
        .files
        .iter()
        .map(|f| &f.src.path)
        .chain(plan.symlinks.iter().map(|l| &l.path))
        .take(PLAN_LISTING)
        .map(|p| relpath::display(p))
        .collect();
    report.would_delete = plan
        .removes
        .iter()
        .take(PLAN_LISTING)
        .map(|p| relpath::display(p))
        .collect();
    report.files_sent = plan.files.len() as u64;
    report.files_unchanged = plan.unchanged;
    report.dirs_created = plan.mkdirs.len() as u64;
    report.symlinks = plan.symlinks.len() as u64;
    report.attrs_updated = plan.attrs.len() as u64;
    report.deleted = plan.removes.len() as u64;
    count_deleted(&mut report, plan);
    report.bytes_total = plan.content_bytes();
    report.duration_s = started.elapsed().as_secs_f64();
    report.dry_run = true;
    report
}

/// Adds the plan's work to the totals (a push to many hosts shares one
/// [`Progress`]).
pub(super) fn start_progress(progress: &Progress, plan: &Plan, report: &mut SyncReport) {
    report.bytes_total = plan.content_bytes();
    progress
        .files_total
        .fetch_add(plan.files.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .fetch_add(report.bytes_total, Ordering::Relaxed);
}

pub(super) fn problem_paths(summary: &ScanSummary) -> HashSet<RelPath> {
    summary.problems.iter().map(|p| p.path.clone()).collect()
}

/// Drops removals that touch a path the source scan could not fully see (an
/// unreadable directory is listed without its contents): its destination copy
/// is not an extra, and deleting it would lose data.
pub(super) fn spare_unseen(plan: &mut Plan, src_problems: &HashSet<RelPath>) {
    let related = |a: &[u8], b: &[u8]| {
        a.is_empty()
            || b.is_empty()
            || a == b
            || (a.len() > b.len() && a.starts_with(b) && a[b.len()] == b'/')
            || (b.len() > a.len() && b.starts_with(a) && b[a.len()] == b'/')
    };
    plan.removes
        .retain(|r| !src_problems.iter().any(|p| related(r, p)));
    plan.removed
        .retain(|r| r.replaced || !src_problems.iter().any(|p| related(&r.path, p)));
}

/// What the plan's deletes take away, by kind.
pub(super) fn count_deleted(report: &mut SyncReport, plan: &Plan) {
    report.deleted_dirs = plan.removed.iter().map(|r| r.dirs).sum();
    report.deleted_files = plan.removed.iter().map(|r| r.files).sum();
}

/// The error of a root that a scan found to be a file.
pub(super) fn not_a_directory(root: &str) -> String {
    format!("{root}: not a directory")
}

/// A root that exists but cannot be synced (not a directory, unreadable):
/// the scan reports it as a problem with an empty path.
pub(super) fn root_problem(root: &str, summary: &ScanSummary) -> Result<(), SyncError> {
    match summary.problems.iter().find(|p| p.path.is_empty()) {
        Some(p) if p.message == "not a directory" => Err(SyncError::Invalid(not_a_directory(root))),
        // "a character device, not a file or directory"
        Some(p) if p.message.ends_with(", not a file or directory") => {
            Err(SyncError::Invalid(format!("{root} is {}", p.message)))
        }
        Some(p) => Err(SyncError::Invalid(format!("{root}: {}", p.message))),
        None => Ok(()),
    }
}
