//! Tree sync between this machine and a sandbox, in both directions, with one
//! engine: scan both sides (the remote side by the agent, with its stat cache),
//! diff with [`outpost_treesync::plan`], then send only what is missing —
//! small files batched, large files as FastCDC chunks the other side lacks,
//! compressed unless it would not shrink, and pipelined (no round trip per
//! file) under a bound on bytes in flight, so other calls on the same host
//! stay fast.
//!
//! Push applies on the host through the agent's `PutFiles`/`PutPart`/
//! `ApplyMeta`; pull reads through `ReadFiles` and applies here with the same
//! [`outpost_treesync::apply::Applier`] the agent uses.
//!
//! Both directions apply in the same order, each phase finished before the
//! next starts: paths whose kind changes are removed, directories created
//! (parents first), file contents written, symlinks made, attributes set,
//! extras removed, and directory attributes set last (writing into a
//! directory changes its mtime). A problem with one path is reported and the
//! sync goes on; only a lost connection, an error of a whole request, or a
//! cancel stops it. A sync is never retried: running it again is the retry,
//! and it sends nothing that was already committed.
//!
//! The files of this folder, each using only files listed before it:
//! `types` (the public types), `limits` (request bounds), `helpers`,
//! `local` (the local root and scan), `planning` (from options and scans to
//! a plan), `parts` (how each file travels), `pipeline` (requests in
//! flight), `memo` (the host's recent scans, kept), `remote` (scans, reads
//! and writes through the agent), `run` (a sync being applied: the metadata
//! phases), `single` (one file rather than a tree), `source` (a push's
//! local side, shared by all its hosts), `push` and `pull` (the file
//! contents, each way). This file holds [`push()`],
//! [`push_many()`] and [`pull()`] and re-exports the rest of the public API.
//!
//! A push to many hosts is one push per host, all at once, over one
//! [`source::Source`]: one local scan, each piece of content read, checked
//! and compressed once; each host gets its own plan against what it holds,
//! its own report and its own problems.

mod helpers;
mod limits;
mod local;
mod memo;
mod parts;
mod pipeline;
mod planning;
mod pull;
mod push;
mod remote;
mod run;
mod single;
mod source;
#[cfg(test)]
mod tests;
mod types;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use outpost_protocol::TreeEntry;
use outpost_treesync::apply::Applier;
use outpost_treesync::chunk::CHUNKED_MIN_SIZE;
use outpost_treesync::plan::{self, FileChange};

use self::helpers::{add_problems, lock, until_cancelled};
use self::local::{describe_local, local_dir, record_written, scan_local};
use self::planning::{
    Side, diff_options, dry_run_report, filter_spec, only_name, problem_paths, root_problem,
    spare_unseen, start_progress, take_described, undescribed,
};
use self::pull::PullFiles;
use self::push::PushFiles;
use self::remote::{create_remote_root, describe_on, scan_on, scan_request};
pub use self::remote::{read_remote, scan_remote, write_remote};
use self::run::{Dest, Run, has_partial, partial_set};
pub use self::single::{RemoteKind, file_target, renames};
use self::source::{Planning, Source};
pub use self::types::{PLAN_LISTING, Progress, SyncError, SyncOptions, SyncReport};
use crate::session::Session;

/// Local tree (or one file) → `remote` on the session's host.
pub async fn push(
    session: &Session,
    local: &Path,
    remote: &str,
    options: &SyncOptions,
    progress: Arc<Progress>,
) -> Result<SyncReport, SyncError> {
    let source = Arc::new(Source::new(local, options, 1)?);
    push_from(&source, session, remote, progress).await
}

/// Local tree (or one file) → `remote` on each session's host, all at
/// once: the tree is scanned and hashed once and each piece of content
/// read and compressed once for every host. One report or error per host,
/// in the order given; `Err` only when the source itself is refused.
/// `progress` counts the files and bytes of all hosts together.
pub async fn push_many(
    sessions: &[Arc<Session>],
    local: &Path,
    remote: &str,
    options: &SyncOptions,
    progress: Arc<Progress>,
) -> Result<Vec<Result<SyncReport, SyncError>>, SyncError> {
    let source = Arc::new(Source::new(local, options, sessions.len())?);
    let pushes = sessions.iter().map(|session| async {
        let pushed = push_from(&source, session, remote, Arc::clone(&progress)).await;
        source.reads.host_done();
        pushed
    });
    let results = futures::future::join_all(pushes).await;
    if let Some(refused) = source.scan_error() {
        return Err(SyncError::Invalid(refused.to_string()));
    }
    Ok(results)
}

async fn push_from(
    source: &Arc<Source>,
    session: &Session,
    remote: &str,
    progress: Arc<Progress>,
) -> Result<SyncReport, SyncError> {
    let started = Instant::now();
    let options = &source.options;
    let planning = Planning(source);
    // One connection for the whole sync: staged parts live in the agent of
    // that connection, and a sync whose connection dies is not carried on by
    // a new one.
    let conn = until_cancelled(&progress, async { Ok(session.connection().await?) }).await?;
    let remote = match source.single() {
        Some(name) => {
            let is_dir = single::remote_kind(&conn, remote).await? == RemoteKind::Dir;
            let (remote_dir, target) = file_target(remote, is_dir, name);
            if target != name {
                return Err(renames(name, remote));
            }
            remote_dir
        }
        None => remote.to_string(),
    };
    let remote = remote.as_str();
    let remote_scan = scan_on(&conn, scan_request(&conn, remote, &source.spec));
    let (src, (dst, dst_summary)) = until_cancelled(&progress, async {
        tokio::try_join!(source.scanned(), async { Ok(remote_scan.await?) })
    })
    .await?;

    root_problem(remote, &dst_summary)?;
    let mut dst = dst;
    only_name(&mut dst, options);
    let mut report = SyncReport {
        single_file: source.single().is_some(),
        ..SyncReport::default()
    };
    add_problems(&mut report, &src.summary.problems);
    add_problems(&mut report, &dst_summary.problems);
    let mut plan =
        plan::diff(&src.entries, &dst, &diff_options(options)).map_err(SyncError::Invalid)?;
    spare_unseen(&mut plan, &src.problems);
    if let Some(name) = &options.only {
        single::replaces_nothing(&plan, name)?;
    }
    let src_problems = src.problems.clone();
    drop((src, dst, planning));
    if options.dry_run {
        return Ok(dry_run_report(report, &plan, started));
    }
    // The host's chunk lists of the large files it holds and that change:
    // what a delta can reuse there.
    until_cancelled(&progress, async {
        // Without the source's chunks there is nothing to match them with.
        let useful = |c: &FileChange| !c.src.chunks.is_empty();
        let side = Side::Destination;
        Ok(describe_on(&conn, remote, &mut plan.files, side, useful).await?)
    })
    .await?;
    start_progress(&progress, &plan, &mut report);
    let changes = std::mem::take(&mut plan.files);

    let dest = Dest::Remote {
        conn: conn.clone(),
        root: remote.to_string(),
    };
    if !dst_summary.root_exists {
        create_remote_root(&conn, remote, &progress).await?;
    }
    let mut run = Run {
        dest,
        progress,
        report,
        src_problems,
        partials: partial_set(&dst_summary.partials),
    };
    run.before_files(&plan).await?;
    let files = PushFiles::new(conn, remote.to_string(), Arc::clone(source), &mut run);
    files.run(changes).await?;
    run.after_files(&plan).await?;
    Ok(run.finish(&plan, started))
}

/// What `path` is on the session's host.
pub async fn remote_kind(session: &Session, path: &str) -> Result<RemoteKind, SyncError> {
    single::remote_kind(&session.connection().await?, path).await
}

/// Whether `remote` was a directory when this connection last synced it
/// whole: a pull may then go straight to the tree's scan, which says so if
/// it has become something else since ([`is_not_a_directory`]).
pub async fn synced_as_tree(session: &Session, remote: &str) -> bool {
    session
        .connection()
        .await
        .is_ok_and(|conn| memo::was_tree(&conn, remote))
}

/// Whether a pull failed because its remote path is not a directory (a
/// file, or something that is neither).
pub fn is_not_a_directory(error: &SyncError, remote: &str) -> bool {
    matches!(error, SyncError::Invalid(m)
        if *m == planning::not_a_directory(remote)
            || (m.starts_with(&format!("{remote} is ")) && m.ends_with(", not a file or directory")))
}

/// `remote` on the session's host → local tree.
pub async fn pull(
    session: &Session,
    remote: &str,
    local: &Path,
    options: &SyncOptions,
    progress: Arc<Progress>,
) -> Result<SyncReport, SyncError> {
    let started = Instant::now();
    let local = local_dir(local, false)?;
    let spec = filter_spec(options, &local)?;
    let conn = session.connection().await?;
    let remote_scan = scan_on(&conn, scan_request(&conn, remote, &spec));
    // Chunk lists only of the local files the pull replaces (below).
    let local_scan = scan_local(local.clone(), spec, false);
    let ((src, src_summary), dst) = until_cancelled(&progress, async {
        tokio::try_join!(async { Ok(remote_scan.await?) }, local_scan)
    })
    .await?;
    if !src_summary.root_exists {
        return Err(SyncError::Invalid(format!(
            "remote path not found: {remote}"
        )));
    }
    root_problem(remote, &src_summary)?;
    root_problem(&local.display().to_string(), &dst.summary)?;
    let (mut src, mut dst) = (src, dst);
    only_name(&mut src, options);
    only_name(&mut dst.entries, options);
    if let Some(name) = &options.only {
        single::the_file_is_there(&src, name)?;
    }
    let src_problems = problem_paths(&src_summary);

    let mut report = SyncReport::default();
    add_problems(&mut report, &src_summary.problems);
    add_problems(&mut report, &dst.summary.problems);
    let mut plan =
        plan::diff(&src, &dst.entries, &diff_options(options)).map_err(SyncError::Invalid)?;
    spare_unseen(&mut plan, &src_problems);
    if let Some(name) = &options.only {
        single::replaces_nothing(&plan, name)?;
    }
    let local_exists = dst.summary.root_exists;
    let partials = partial_set(&dst.summary.partials);
    drop((src, dst));
    if options.dry_run {
        return Ok(dry_run_report(report, &plan, started));
    }
    // At once: the chunk lists of the large local files the pull replaces
    // with large files (which the local scan left out where its cache held
    // only a hash), and of the large files to pull that a local file or a
    // partial file of an interrupted pull may have chunks of.
    until_cancelled(&progress, async {
        let large = |c: &FileChange| c.src.size >= CHUNKED_MIN_SIZE && c.src.hash.is_some();
        let local_wanted = undescribed(&mut plan.files, Side::Destination, large);
        let useful = |c: &FileChange| {
            let chunked =
                |d: &TreeEntry| !d.chunks.is_empty() || local_wanted.contains_key(&d.path);
            c.dst.as_ref().is_some_and(chunked) || has_partial(&partials, &c.src)
        };
        let here = describe_local(&local, local_wanted.keys().cloned().collect());
        let there = describe_on(&conn, remote, &mut plan.files, Side::Source, useful);
        let (described, ()) = tokio::try_join!(async { Ok(here.await) }, there)?;
        take_described(&mut plan.files, Side::Destination, &local_wanted, described);
        Ok(())
    })
    .await?;
    start_progress(&progress, &plan, &mut report);
    let changes = std::mem::take(&mut plan.files);

    if !local_exists {
        std::fs::create_dir_all(&local)
            .map_err(|e| SyncError::Invalid(format!("cannot create {}: {e}", local.display())))?;
    }
    let applier = Arc::new(Mutex::new(Applier::new(&local)));
    let mut run = Run {
        dest: Dest::Local {
            applier: Arc::clone(&applier),
        },
        progress,
        report,
        src_problems,
        partials,
    };
    run.before_files(&plan).await?;
    let files = PullFiles::new(
        conn,
        remote.to_string(),
        local.clone(),
        applier.clone(),
        &mut run,
    );
    let sent = files.run(changes).await;
    let written = lock(&applier).take_written();
    record_written(local, written).await;
    sent?;
    run.after_files(&plan).await?;
    Ok(run.finish(&plan, started))
}
