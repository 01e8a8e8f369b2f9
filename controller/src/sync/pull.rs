//! Pull's file contents: `ReadFiles` of whole small files and of ranges of
//! large ones through a [`Pipeline`], written here through the same
//! [`Applier`] the agent uses: chunks the local file already has are copied
//! from it, a partial file of an interrupted pull is resumed, and a file
//! sent in pieces is staged and then committed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use outpost_protocol::{
    FileContent, MetaOp, PartData, PathProblem, PutFiles, ReadFiles, ReadSpec, RelPath, Request,
    Response,
};
use outpost_treesync::apply::{self, Applier};
use outpost_treesync::codec;
use outpost_treesync::plan::FileChange;

use super::helpers::{
    CHANGED, UNHASHED, add_problems, blocking, check_cancelled, lock, problem, unexpected,
};
use super::limits::{BATCH_FILES, REQUEST_BYTES};
use super::parts::{Pace, Part, Route, Staged, content_of, group_ranges, next_xfer, put_of, route};
use super::pipeline::{Landed, Pipeline};
use super::run::Run;
use super::types::{SyncError, SyncReport};
use crate::session::{CallError, ScopedConn};

enum PullTag {
    /// A `ReadFiles` of whole inline files, in request order.
    Batch(Vec<FileChange>),
    /// A `ReadFiles` of ranges of `staged[i]`, `len` bytes in all.
    Range { staged: usize, len: u64 },
}

/// Commits waiting for the disk at once, in the background, while the
/// pull reads on (each holds up to 256 parent directories open).
const COMMITS_PENDING: usize = 2;

/// A commit in the background: how many files it wrote, and the problems
/// of the others.
type Commit = tokio::task::JoinHandle<(u64, Vec<String>)>;

/// Reads a pull's file contents through a [`Pipeline`] and writes them here.
pub(super) struct PullFiles<'r> {
    root: String,
    local: PathBuf,
    applier: Arc<Mutex<Applier>>,
    run: &'r mut Run,
    pipe: Pipeline<PullTag>,
    staged: Vec<Staged>,
    /// Oldest first; a batch's flush (a journal commit and the writeback of
    /// what it wrote) and its directories' fsyncs wait for the disk.
    commits: VecDeque<Commit>,
    /// Small files not yet asked for, in batches in step with the large
    /// files' ranges ([`Pace`]).
    small: VecDeque<FileChange>,
    pace: Pace,
}

impl<'r> PullFiles<'r> {
    pub(super) fn new(
        conn: ScopedConn,
        root: String,
        local: PathBuf,
        applier: Arc<Mutex<Applier>>,
        run: &'r mut Run,
    ) -> Self {
        PullFiles {
            root,
            local,
            applier,
            run,
            // In order: a file's ranges are then written in order, and
            // hashed as they are (see `Applier::put_part`); as they land,
            // the commit would read each large file back to hash it.
            pipe: Pipeline::in_order(conn),
            staged: Vec::new(),
            commits: VecDeque::new(),
            small: VecDeque::new(),
            pace: Pace::default(),
        }
    }

    pub(super) async fn run(mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let mut result = self.read_all(changes).await;
        if result.is_err() {
            self.pipe.cancel_all();
        }
        // Commits already begun finish whatever happened to the reads.
        let settled = self.settle_commits(0).await;
        if result.is_ok() {
            result = settled;
        }
        if let Err(err) = &result {
            // Partial files are kept for the next pull to resume, whether
            // the connection was lost or the pull cancelled; an abort only
            // releases them here (see `Applier::apply_meta`).
            if matches!(err, SyncError::Call(e) if e.is_connection()) {
                return result;
            }
            let xfers: Vec<u64> = self
                .staged
                .iter()
                .filter(|s| !s.committed)
                .map(|s| s.xfer)
                .collect();
            let _ = self.abort(xfers).await;
        }
        result
    }

    async fn read_all(&mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let mut large = Vec::new();
        for change in changes {
            if change.src.hash.is_none() {
                // The host could not hash it (it kept changing): a commit
                // would have nothing to be checked against.
                self.run.skip(&change, UNHASHED);
                continue;
            }
            match route(&change) {
                Route::Inline => self.small.push_back(change),
                Route::Parts(parts) => large.push((change, parts)),
            }
        }
        self.pace = Pace::new(self.small.iter(), large.iter().map(|(c, _)| c));
        for (change, parts) in large {
            self.catch_up().await?;
            self.read_parts(change, parts).await?;
        }
        self.pace.large_done();
        self.catch_up().await?;
        while let Some(landed) = self.pipe.next().await {
            self.settle(landed).await?;
        }
        Ok(())
    }

    /// Asks for batches of small files while they are behind the large ones.
    async fn catch_up(&mut self) -> Result<(), SyncError> {
        while !self.small.is_empty() && self.pace.small_behind() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(size) = self.small.front().map(|c| c.src.size) {
                if !batch.is_empty() && (batch.len() >= BATCH_FILES || bytes + size > REQUEST_BYTES)
                {
                    break;
                }
                bytes += size;
                batch.extend(self.small.pop_front());
            }
            self.pace.small(bytes);
            self.send_batch(batch, bytes).await?;
        }
        Ok(())
    }

    async fn send_batch(&mut self, batch: Vec<FileChange>, bytes: u64) -> Result<(), SyncError> {
        let reads = batch
            .iter()
            .map(|c| ReadSpec {
                path: c.src.path.clone(),
                ranges: None,
            })
            .collect();
        let request = Request::ReadFiles(ReadFiles {
            root: self.root.clone(),
            reads,
        });
        self.send(request, PullTag::Batch(batch), bytes).await
    }

    /// Takes what a partial file of an interrupted pull holds, copies what
    /// the local file already has, then asks for the rest.
    async fn read_parts(
        &mut self,
        change: FileChange,
        mut parts: Vec<Part>,
    ) -> Result<(), SyncError> {
        let i = self.staged.len();
        let resumable = self.run.resumable(&change);
        self.staged.push(Staged::new(change));
        if resumable {
            let applier = Arc::clone(&self.applier);
            let (xfer, change) = (self.staged[i].xfer, self.staged[i].change.clone());
            let resumed = blocking(move || {
                let (hash, size) = content_of(&change);
                let chunks = &change.src.chunks;
                lock(&applier).resume(xfer, &change.src.path, (&hash, size), chunks)
            })
            .await?;
            match resumed {
                Ok(present) => {
                    self.staged[i].begun = true;
                    self.run
                        .take_resumed(&mut self.staged[i], &present, &mut parts);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        let copies: Vec<Part> = parts
            .iter()
            .filter(|p| matches!(p, Part::Copy { .. }))
            .copied()
            .collect();
        if !copies.is_empty() {
            check_cancelled(&self.run.progress)?;
            let applier = Arc::clone(&self.applier);
            let (xfer, path) = (self.staged[i].xfer, self.staged[i].change.src.path.clone());
            let (hash, size) = content_of(&self.staged[i].change);
            let copied = blocking(move || {
                let mut applier = lock(&applier);
                for part in copies {
                    if let Part::Copy { offset, from, len } = part {
                        let data = PartData::Copy {
                            from_offset: from,
                            len,
                        };
                        applier.put_part(xfer, &path, (&hash, size), offset, &data)?;
                    }
                }
                Ok::<_, String>(())
            })
            .await?;
            match copied {
                Ok(()) => {
                    let len = parts
                        .iter()
                        .filter(|p| matches!(p, Part::Copy { .. }))
                        .map(Part::len)
                        .sum();
                    self.staged[i].counted += len;
                    self.run
                        .progress
                        .bytes_done
                        .fetch_add(len, Ordering::Relaxed);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        // What the local side already holds counts as asked for, for the
        // small files' pace.
        let to_read: u64 = parts
            .iter()
            .filter(|p| matches!(p, Part::Data { .. }))
            .map(Part::len)
            .sum();
        self.pace
            .large(self.staged[i].change.src.size.saturating_sub(to_read));
        for ranges in group_ranges(&parts, REQUEST_BYTES) {
            if self.staged[i].failed {
                break;
            }
            let len = ranges.iter().map(|r| r.1).sum();
            let request = Request::ReadFiles(ReadFiles {
                root: self.root.clone(),
                reads: vec![ReadSpec {
                    path: self.staged[i].change.src.path.clone(),
                    ranges: Some(ranges),
                }],
            });
            self.send(request, PullTag::Range { staged: i, len }, len)
                .await?;
            self.staged[i].sent += 1;
            self.pace.large(len);
            self.catch_up().await?;
        }
        self.staged[i].all_sent = true;
        self.resolve(i).await
    }

    async fn send(&mut self, request: Request, tag: PullTag, weight: u64) -> Result<(), SyncError> {
        while self.pipe.is_full(weight) {
            match self.pipe.next().await {
                Some(landed) => self.settle(landed).await?,
                None => break,
            }
        }
        check_cancelled(&self.run.progress)?;
        self.pipe.start(request, None, tag, weight)?;
        Ok(())
    }

    async fn settle(&mut self, landed: Landed<PullTag>) -> Result<(), SyncError> {
        let mut responses = landed.result?;
        let problems = match responses.pop() {
            Some(Response::ReadDone { problems }) => problems,
            Some(Response::Error(e)) => return Err(CallError::Agent(e).into()),
            Some(other) => return Err(unexpected("a read", &other).into()),
            None => return Err(CallError::Protocol("a read ended without an answer".into()).into()),
        };
        let mut pieces = Vec::with_capacity(responses.len());
        for response in responses {
            match response {
                Response::FileData {
                    index,
                    offset,
                    data,
                } => {
                    self.run.report.bytes_sent += data.len() as u64;
                    pieces.push((index, offset, data));
                }
                other => return Err(unexpected("a read", &other).into()),
            }
        }
        match landed.tag {
            PullTag::Batch(changes) => self.write_batch(changes, pieces, problems).await,
            PullTag::Range { staged: i, len } => self.write_range(i, len, pieces, problems).await,
        }
    }

    /// Writes a batch of whole files: each one that came as a single piece
    /// is committed from it directly; a file that came in several is staged
    /// first.
    async fn write_batch(
        &mut self,
        changes: Vec<FileChange>,
        pieces: Vec<(u32, u64, Vec<u8>)>,
        problems: Vec<PathProblem>,
    ) -> Result<(), SyncError> {
        add_problems(&mut self.run.report, &problems);
        let count = changes.len() as u64;
        let bytes: u64 = changes.iter().map(|c| c.src.size).sum();
        let applier = Arc::clone(&self.applier);
        let root = self.local.display().to_string();
        let pending =
            blocking(move || write_batch(&applier, root, changes, pieces, problems)).await?;
        let applier = Arc::clone(&self.applier);
        self.commit_in_background(move || pending.commit(&applier))
            .await?;
        let progress = &self.run.progress;
        progress.files_done.fetch_add(count, Ordering::Relaxed);
        progress.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    async fn write_range(
        &mut self,
        i: usize,
        len: u64,
        pieces: Vec<(u32, u64, Vec<u8>)>,
        problems: Vec<PathProblem>,
    ) -> Result<(), SyncError> {
        self.staged[i].settled += 1;
        if let Some(p) = problems.first() {
            self.staged[i].fail_with(&p.message, &mut self.run.report);
        }
        if !self.staged[i].failed {
            let applier = Arc::clone(&self.applier);
            let (xfer, path) = (self.staged[i].xfer, self.staged[i].change.src.path.clone());
            let (hash, size) = content_of(&self.staged[i].change);
            let written = blocking(move || {
                let mut applier = lock(&applier);
                for (_, offset, data) in pieces {
                    applier.put_part(xfer, &path, (&hash, size), offset, &PartData::Data(data))?;
                }
                Ok::<_, String>(())
            })
            .await?;
            match written {
                Ok(()) => {
                    self.staged[i].counted += len;
                    self.run
                        .progress
                        .bytes_done
                        .fetch_add(len, Ordering::Relaxed);
                }
                Err(message) => self.staged[i].fail_with(&message, &mut self.run.report),
            }
        }
        self.resolve(i).await
    }

    /// Once a staged file has every range it asked for: commit it, or drop it.
    async fn resolve(&mut self, i: usize) -> Result<(), SyncError> {
        let staged = &mut self.staged[i];
        if !staged.is_settled() {
            return Ok(());
        }
        staged.resolved = true;
        let progress = Arc::clone(&self.run.progress);
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        let rest = staged.change.src.size.saturating_sub(staged.counted);
        progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
        if staged.failed {
            let xfer = staged.xfer;
            return self.abort(vec![xfer]).await;
        }
        staged.committed = true;
        // Files without a hash never get this far.
        let hash = staged.change.src.hash.unwrap_or_default();
        let put = put_of(
            &staged.change,
            hash,
            FileContent::Staged { xfer: staged.xfer },
        );
        let request = PutFiles {
            root: self.local.display().to_string(),
            create_parents: false,
            files: vec![put],
        };
        let applier = Arc::clone(&self.applier);
        self.commit_in_background(move || {
            let report = apply::put_files_shared(&applier, &request);
            (u64::from(report.done), problem_lines(&report.problems))
        })
        .await
    }

    /// Runs `commit` on a blocking thread while the pull goes on, once
    /// fewer than [`COMMITS_PENDING`] others wait.
    async fn commit_in_background(
        &mut self,
        commit: impl FnOnce() -> (u64, Vec<String>) + Send + 'static,
    ) -> Result<(), SyncError> {
        self.commits.push_back(tokio::task::spawn_blocking(commit));
        self.settle_commits(COMMITS_PENDING).await
    }

    /// Waits for the oldest commits until at most `keep` are left, and
    /// counts what they did. One that failed is reported once all the
    /// others waited for have finished.
    async fn settle_commits(&mut self, keep: usize) -> Result<(), SyncError> {
        let mut failed = Ok(());
        while self.commits.len() > keep {
            let Some(commit) = self.commits.pop_front() else {
                break;
            };
            match commit.await {
                Ok((done, lines)) => {
                    self.run.report.files_sent += done;
                    self.run.report.problems.extend(lines);
                }
                Err(e) if failed.is_ok() => {
                    failed = Err(SyncError::Invalid(format!(
                        "a file operation failed unexpectedly: {e}"
                    )));
                }
                Err(_) => {}
            }
        }
        failed
    }

    async fn abort(&mut self, xfers: Vec<u64>) -> Result<(), SyncError> {
        if xfers.is_empty() {
            return Ok(());
        }
        let ops: Vec<MetaOp> = xfers
            .into_iter()
            .map(|xfer| MetaOp::Abort { xfer })
            .collect();
        let applier = Arc::clone(&self.applier);
        blocking(move || lock(&applier).apply_meta(&ops)).await?;
        Ok(())
    }
}

impl Staged {
    fn fail_with(&mut self, message: &str, report: &mut SyncReport) {
        if !self.failed {
            self.failed = true;
            report
                .problems
                .push(problem(&self.change.src.path, message));
        }
    }
}

fn problem_lines(problems: &[PathProblem]) -> Vec<String> {
    problems
        .iter()
        .map(|p| problem(&p.path, &p.message))
        .collect()
}

/// A batch of whole files, those that came in pieces staged, to commit.
struct PendingBatch {
    request: PutFiles,
    lines: Vec<String>,
    /// Staged files: those in the batch, and those that failed before it.
    staged: Vec<(RelPath, u64)>,
    aborts: Vec<MetaOp>,
}

impl PendingBatch {
    /// Commits the batch ([`apply::put_files_shared`]) and drops the staged
    /// files it did not commit (now, not when the applier goes). Returns how
    /// many files were written and the problems of the others.
    fn commit(self, applier: &Mutex<Applier>) -> (u64, Vec<String>) {
        let PendingBatch {
            request,
            mut lines,
            staged,
            mut aborts,
        } = self;
        let report = apply::put_files_shared(applier, &request);
        lines.extend(problem_lines(&report.problems));
        let refused: HashSet<&[u8]> = report.problems.iter().map(|p| &p.path[..]).collect();
        aborts.extend(
            staged
                .into_iter()
                .filter(|(path, _)| refused.contains(&path[..]))
                .map(|(_, xfer)| MetaOp::Abort { xfer }),
        );
        if !aborts.is_empty() {
            lock(applier).apply_meta(&aborts);
        }
        (u64::from(report.done), lines)
    }
}

/// Takes in a batch of whole files read from the host: a file that came in
/// several pieces is staged; the commit comes later.
fn write_batch(
    applier: &Mutex<Applier>,
    root: String,
    changes: Vec<FileChange>,
    pieces: Vec<(u32, u64, Vec<u8>)>,
    problems: Vec<PathProblem>,
) -> PendingBatch {
    let failed: HashSet<RelPath> = problems.into_iter().map(|p| p.path).collect();
    let mut by_file: HashMap<u32, Vec<(u64, Vec<u8>)>> = HashMap::new();
    for (index, offset, data) in pieces {
        by_file.entry(index).or_default().push((offset, data));
    }
    let mut lines = Vec::new();
    let mut puts = Vec::new();
    // Staged files: those in `puts`, and those that failed before it.
    let mut staged = Vec::new();
    let mut aborts = Vec::new();
    for (index, change) in changes.iter().enumerate() {
        if failed.contains(&change.src.path) {
            continue;
        }
        // Files without a hash never get this far.
        let hash = change.src.hash.unwrap_or_default();
        let mut pieces = by_file.remove(&(index as u32)).unwrap_or_default();
        let content = match pieces.len() {
            0 if change.src.size == 0 => FileContent::Inline(codec::compress(&[])),
            // The hash check of the commit would refuse it anyway; say why.
            0 => {
                lines.push(problem(&change.src.path, CHANGED));
                continue;
            }
            1 if pieces[0].0 == 0 => {
                FileContent::Inline(pieces.pop().map(|p| p.1).unwrap_or_default())
            }
            _ => {
                let xfer = next_xfer();
                let mut applier = lock(applier);
                let written = pieces.into_iter().try_for_each(|(offset, data)| {
                    let content = (&hash, change.src.size);
                    applier.put_part(
                        xfer,
                        &change.src.path,
                        content,
                        offset,
                        &PartData::Data(data),
                    )
                });
                if let Err(message) = written {
                    lines.push(problem(&change.src.path, &message));
                    aborts.push(MetaOp::Abort { xfer });
                    continue;
                }
                staged.push((change.src.path.clone(), xfer));
                FileContent::Staged { xfer }
            }
        };
        puts.push(put_of(change, hash, content));
    }
    PendingBatch {
        request: PutFiles {
            root,
            create_parents: false,
            files: puts,
        },
        lines,
        staged,
        aborts,
    }
}
