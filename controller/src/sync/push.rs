//! Push's file contents: small files read here in batches and sent whole
//! in `PutFiles`, large ones as `PutPart`s (resumed where the host holds a
//! partial file) and committed once every part is acknowledged, all through
//! a [`Pipeline`]; on an error or a cancel, what is in flight lands and
//! every uncommitted transfer is aborted on the host.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use outpost_protocol::{
    ApplyReport, FileContent, FilePut, PartData, PutFiles, PutPart, RelPath, Request, Response,
    Resume, TreeEntry,
};
use outpost_treesync::plan::FileChange;
use outpost_treesync::{codec, relpath};

use super::helpers::{
    CHANGED, UNHASHED, add_problems, blocking, check_cancelled, problem, unexpected,
    until_cancelled,
};
use super::limits::{BATCH_FILES, BATCH_RAW, REQUEST_BYTES};
use super::parts::{Pace, Part, Route, Staged, put_of, route};
use super::pipeline::{Landed, Pipeline, final_answer, final_of};
use super::remote::abort_remote;
use super::run::Run;
use super::source::{Piece, Read, Source};
use super::types::SyncError;
use crate::session::{CallError, ScopedConn};

enum PushTag {
    /// A `PutFiles` of inline files: their paths and sizes.
    Batch(Vec<(RelPath, u64)>),
    /// A `PutPart` of `staged[i]`, covering `len` bytes of the file.
    Part { staged: usize, len: u64 },
    /// The `PutFiles` committing `staged[i]`.
    Commit { staged: usize },
}

/// Inline files read and compressed for one `PutFiles`.
struct Batch {
    puts: Vec<FilePut>,
    /// Files that could not be read: path and message.
    problems: Vec<(RelPath, String)>,
    /// Bytes of the files in `problems`.
    skipped_bytes: u64,
    /// Compressed bytes plus a per-file allowance: the request's weight.
    weight: u64,
    compressed: u64,
    /// Where the next batch starts.
    next: usize,
}

/// Reads and compresses files of `changes` from `start` until the batch is
/// full. Each file is checked against the scan (size and hash), so what is
/// sent is exactly what the plan describes.
fn read_batch(source: &Source, changes: &[FileChange], start: usize) -> Batch {
    let mut batch = Batch {
        puts: Vec::new(),
        problems: Vec::new(),
        skipped_bytes: 0,
        weight: 0,
        compressed: 0,
        next: start,
    };
    let mut raw = 0;
    while batch.next < changes.len()
        && batch.puts.len() + batch.problems.len() < BATCH_FILES
        && batch.weight < REQUEST_BYTES
        && raw < BATCH_RAW
    {
        let change = &changes[batch.next];
        batch.next += 1;
        let piece = Piece {
            path: change.src.path.clone(),
            hash: change.src.hash,
            whole: true,
            offset: 0,
            len: change.src.size,
        };
        match source
            .reads
            .get(&piece, || read_whole(&source.root, &change.src))
        {
            Ok((data, hash)) => {
                raw += change.src.size;
                batch.compressed += data.len() as u64;
                batch.weight += data.len() as u64 + change.src.path.len() as u64 + 128;
                let data = Arc::unwrap_or_clone(data);
                batch
                    .puts
                    .push(put_of(change, hash, FileContent::Inline(data)));
            }
            Err(message) => {
                batch.skipped_bytes += change.src.size;
                batch.problems.push((change.src.path.clone(), message));
            }
        }
    }
    batch
}

/// Reads a whole file, checks it against the scan and compresses it.
fn read_whole(local: &Path, src: &TreeEntry) -> Read {
    let path = relpath::join(local, &src.path)?;
    let data = std::fs::read(&path).map_err(|e| format!("cannot read: {e}"))?;
    let hash = *blake3::hash(&data).as_bytes();
    if data.len() as u64 != src.size || src.hash.is_some_and(|h| h != hash) {
        return Err(CHANGED.into());
    }
    Ok((Arc::new(codec::compress(&data)), hash))
}

/// Reads `len` bytes at `offset` and compresses them, once for every host.
fn read_range(
    source: &Source,
    src: &TreeEntry,
    offset: u64,
    len: u64,
) -> Result<Arc<Vec<u8>>, String> {
    let piece = Piece {
        path: src.path.clone(),
        hash: src.hash,
        whole: false,
        offset,
        len,
    };
    let read = source.reads.get(&piece, || {
        let data = read_range_once(&source.root, src, offset, len)?;
        Ok((Arc::new(data), [0; 32]))
    });
    read.map(|(data, _)| data)
}

fn read_range_once(
    local: &Path,
    src: &TreeEntry,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, String> {
    let path = relpath::join(local, &src.path)?;
    let file = std::fs::File::open(&path).map_err(|e| format!("cannot read: {e}"))?;
    match codec::read_at(&file, offset, len as usize) {
        Ok((blob, n)) if n as u64 == len => Ok(blob),
        Ok(_) => Err(CHANGED.to_string()),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

/// Sends a push's file contents through a [`Pipeline`].
pub(super) struct PushFiles<'r> {
    root: String,
    source: Arc<Source>,
    run: &'r mut Run,
    pipe: Pipeline<PushTag>,
    staged: Vec<Staged>,
    /// Staged files whose parts are all acknowledged, to commit.
    ready: VecDeque<usize>,
    /// Transfers that will not be committed.
    aborts: Vec<u64>,
    inline: Inline,
}

/// The small files of a push, sent in batches in step with the large files'
/// parts ([`Pace`]).
#[derive(Default)]
struct Inline {
    changes: Arc<Vec<FileChange>>,
    /// Where the next batch starts.
    next: usize,
    pace: Pace,
}

impl Inline {
    /// Whether a batch of small files goes next.
    fn behind(&self) -> bool {
        self.next < self.changes.len() && self.pace.small_behind()
    }
}

impl<'r> PushFiles<'r> {
    pub(super) fn new(
        conn: ScopedConn,
        root: String,
        source: Arc<Source>,
        run: &'r mut Run,
    ) -> Self {
        PushFiles {
            root,
            source,
            run,
            pipe: Pipeline::new(conn),
            staged: Vec::new(),
            ready: VecDeque::new(),
            aborts: Vec::new(),
            inline: Inline::default(),
        }
    }

    pub(super) async fn run(mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let result = self.send_all(changes).await;
        if result.is_err() {
            self.wind_down().await;
        }
        result
    }

    async fn send_all(&mut self, changes: Vec<FileChange>) -> Result<(), SyncError> {
        let mut inline = Vec::new();
        let mut parted = Vec::new();
        for change in changes {
            match route(&change) {
                Route::Inline => inline.push(change),
                Route::Parts(parts) => parted.push((change, parts)),
            }
        }

        self.inline = Inline {
            pace: Pace::new(inline.iter(), parted.iter().map(|(c, _)| c)),
            changes: Arc::new(inline),
            next: 0,
        };
        for (change, parts) in parted {
            self.catch_up().await?;
            if change.src.hash.is_none() {
                // The scan could not hash it: nothing to check a commit
                // against.
                self.inline.pace.large(change.src.size);
                self.run.skip(&change, UNHASHED);
                continue;
            }
            self.send_parts(change, parts).await?;
            self.commit_ready().await?;
        }
        self.inline.pace.large_done();
        self.catch_up().await?;

        loop {
            self.commit_ready().await?;
            match self.pipe.next().await {
                Some(landed) => self.settle(landed)?,
                None => break,
            }
        }
        let aborts = std::mem::take(&mut self.aborts);
        self.abort(&aborts).await;
        Ok(())
    }

    /// Sends batches of small files while they are behind the large ones.
    async fn catch_up(&mut self) -> Result<(), SyncError> {
        while self.inline.behind() {
            self.send_batch().await?;
            self.commit_ready().await?;
        }
        Ok(())
    }

    /// Reads and sends the next batch of small files.
    async fn send_batch(&mut self) -> Result<(), SyncError> {
        check_cancelled(&self.run.progress)?;
        // Read on a blocking thread; what is in flight meanwhile keeps
        // the link busy.
        let (source, changes) = (Arc::clone(&self.source), Arc::clone(&self.inline.changes));
        let next = self.inline.next;
        let batch = blocking(move || read_batch(&source, &changes, next)).await?;
        let inline = &mut self.inline;
        inline
            .pace
            .small(changes_size(&inline.changes[next..batch.next]));
        inline.next = batch.next;
        for (path, message) in &batch.problems {
            self.run.report.problems.push(problem(path, message));
        }
        let progress = &self.run.progress;
        progress
            .files_done
            .fetch_add(batch.problems.len() as u64, Ordering::Relaxed);
        progress
            .bytes_done
            .fetch_add(batch.skipped_bytes, Ordering::Relaxed);
        if batch.puts.is_empty() {
            return Ok(());
        }
        let files = batch
            .puts
            .iter()
            .map(|p| (p.path.clone(), p.size))
            .collect();
        let request = Request::PutFiles(PutFiles {
            root: self.root.clone(),
            create_parents: false,
            files: batch.puts,
        });
        self.send(request, None, PushTag::Batch(files), batch.weight)
            .await?;
        self.run.report.bytes_sent += batch.compressed;
        Ok(())
    }

    async fn send_parts(
        &mut self,
        change: FileChange,
        mut parts: Vec<Part>,
    ) -> Result<(), SyncError> {
        let i = self.staged.len();
        let resumable = self.run.resumable(&change);
        self.staged.push(Staged::new(change));
        if resumable {
            // From here the agent may hold staging for it, even if this sync
            // is cancelled before the answer comes.
            self.staged[i].begun = true;
            match self.resume(i).await? {
                Ok(present) => self
                    .run
                    .take_resumed(&mut self.staged[i], &present, &mut parts),
                Err(message) => self.fail(i, &message),
            }
        }
        // What the host already holds counts as sent, for the small files'
        // pace.
        let to_send: u64 = parts.iter().map(Part::len).sum();
        let held = self.staged[i].change.src.size.saturating_sub(to_send);
        self.inline.pace.large(held);
        for part in parts {
            if self.staged[i].failed {
                break;
            }
            let staged = &self.staged[i];
            // A range's content goes with the request, not in it: every
            // host's frame writes the one buffer read for them all.
            let (data, content, weight) = match part {
                Part::Copy { from, len, .. } => (
                    PartData::Copy {
                        from_offset: from,
                        len,
                    },
                    None,
                    0,
                ),
                Part::Data { offset, len } => {
                    check_cancelled(&self.run.progress)?;
                    let (source, src) = (Arc::clone(&self.source), staged.change.src.clone());
                    match blocking(move || read_range(&source, &src, offset, len)).await? {
                        Ok(content) => {
                            let weight = content.len() as u64;
                            (PartData::Data(Vec::new()), Some(content), weight)
                        }
                        Err(message) => {
                            self.fail(i, &message);
                            break;
                        }
                    }
                }
            };
            let staged = &self.staged[i];
            let offset = match part {
                Part::Copy { offset, .. } | Part::Data { offset, .. } => offset,
            };
            let request = Request::PutPart(PutPart {
                root: self.root.clone(),
                xfer: staged.xfer,
                path: staged.change.src.path.clone(),
                offset,
                data,
                hash: staged.change.src.hash.unwrap_or_default(),
                size: staged.change.src.size,
            });
            let tag = PushTag::Part {
                staged: i,
                len: part.len(),
            };
            self.send(request, content, tag, weight).await?;
            self.staged[i].sent += 1;
            self.run.report.bytes_sent += weight;
            self.inline.pace.large(part.len());
            self.catch_up().await?;
        }
        self.staged[i].all_sent = true;
        self.resolve(i);
        Ok(())
    }

    /// Asks the agent to adopt the partial file of `staged[i]`'s content;
    /// `Err` is the reason it could not begin the transfer at all.
    async fn resume(&mut self, i: usize) -> Result<Result<Vec<u32>, String>, SyncError> {
        let change = &self.staged[i].change;
        let request = Request::Resume(Resume {
            root: self.root.clone(),
            xfer: self.staged[i].xfer,
            path: change.src.path.clone(),
            hash: change.src.hash.unwrap_or_default(),
            size: change.src.size,
            chunks: change.src.chunks.clone(),
        });
        let call = self.pipe.conn.start(request)?;
        match until_cancelled(&self.run.progress, async { Ok(final_answer(call).await?) }).await? {
            Response::Resumed { present } => Ok(Ok(present)),
            Response::Error(e) => Ok(Err(e.message)),
            other => Err(unexpected("a resume", &other).into()),
        }
    }

    /// Starts a request, with the content it carries beside it if any (see
    /// [`Pipeline::start`]), once there is room, settling answers meanwhile.
    async fn send(
        &mut self,
        request: Request,
        content: Option<Arc<Vec<u8>>>,
        tag: PushTag,
        weight: u64,
    ) -> Result<(), SyncError> {
        while self.pipe.is_full(weight) {
            match self.pipe.next().await {
                Some(landed) => self.settle(landed)?,
                None => break,
            }
        }
        check_cancelled(&self.run.progress)?;
        self.pipe.start(request, content, tag, weight)?;
        Ok(())
    }

    async fn commit_ready(&mut self) -> Result<(), SyncError> {
        while let Some(i) = self.ready.pop_front() {
            let staged = &self.staged[i];
            // Checked before the first part was sent.
            let hash = staged.change.src.hash.unwrap_or_default();
            let put = put_of(
                &staged.change,
                hash,
                FileContent::Staged { xfer: staged.xfer },
            );
            let request = Request::PutFiles(PutFiles {
                root: self.root.clone(),
                create_parents: false,
                files: vec![put],
            });
            self.send(request, None, PushTag::Commit { staged: i }, 0)
                .await?;
        }
        Ok(())
    }

    /// Takes in one answer. Errors of a whole request end the sync; a part's
    /// error only fails its file.
    fn settle(&mut self, landed: Landed<PushTag>) -> Result<(), SyncError> {
        let response = final_of(landed.result)?;
        let progress = Arc::clone(&self.run.progress);
        match landed.tag {
            PushTag::Batch(files) => {
                let report = applied(response, "a batch of files")?;
                self.run.report.files_sent += u64::from(report.done);
                add_problems(&mut self.run.report, &report.problems);
                let bytes: u64 = files.iter().map(|(_, size)| size).sum();
                progress
                    .files_done
                    .fetch_add(files.len() as u64, Ordering::Relaxed);
                progress.bytes_done.fetch_add(bytes, Ordering::Relaxed);
            }
            PushTag::Part { staged: i, len } => {
                self.staged[i].settled += 1;
                match response {
                    Response::Ack => {
                        self.staged[i].counted += len;
                        progress.bytes_done.fetch_add(len, Ordering::Relaxed);
                    }
                    Response::Error(e) => self.fail(i, &e.message),
                    other => return Err(unexpected("a part", &other).into()),
                }
                self.resolve(i);
            }
            PushTag::Commit { staged: i } => {
                let report = applied(response, "a commit")?;
                let staged = &mut self.staged[i];
                staged.committed = true;
                self.run.report.files_sent += u64::from(report.done);
                add_problems(&mut self.run.report, &report.problems);
                progress.files_done.fetch_add(1, Ordering::Relaxed);
                let rest = staged.change.src.size.saturating_sub(staged.counted);
                progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Marks a staged file failed (once) and reports why.
    fn fail(&mut self, i: usize, message: &str) {
        let staged = &mut self.staged[i];
        if !staged.failed {
            staged.failed = true;
            let line = problem(&staged.change.src.path, message);
            self.run.report.problems.push(line);
        }
        self.resolve(i);
    }

    /// Once a staged file has no part in flight and no more to send: queue
    /// its commit, or give its transfer up.
    fn resolve(&mut self, i: usize) {
        let staged = &mut self.staged[i];
        if !staged.is_settled() {
            return;
        }
        staged.resolved = true;
        if !staged.failed {
            self.ready.push_back(i);
            return;
        }
        let progress = &self.run.progress;
        progress.files_done.fetch_add(1, Ordering::Relaxed);
        let rest = staged.change.src.size.saturating_sub(staged.counted);
        progress.bytes_done.fetch_add(rest, Ordering::Relaxed);
        if staged.sent > 0 || staged.begun {
            self.aborts.push(staged.xfer);
        }
    }

    /// After a cancel or an error: let what is in flight land (a part still
    /// in flight could otherwise stage again after the abort), then end
    /// every uncommitted transfer. Committed files stay; so do the partial
    /// files of large ones, for the next sync to resume.
    async fn wind_down(&mut self) {
        while let Some(landed) = self.pipe.next().await {
            let _ = self.settle(landed);
        }
        let mut aborts = std::mem::take(&mut self.aborts);
        for staged in &self.staged {
            if (staged.sent > 0 || staged.begun)
                && !staged.committed
                && !aborts.contains(&staged.xfer)
            {
                aborts.push(staged.xfer);
            }
        }
        self.abort(&aborts).await;
    }

    async fn abort(&mut self, xfers: &[u64]) {
        // Not through `&self` across the await: the pipeline is not `Sync`.
        let (conn, root) = (self.pipe.conn.clone(), self.root.clone());
        abort_remote(&conn, &root, xfers).await;
    }
}

fn changes_size(changes: &[FileChange]) -> u64 {
    changes.iter().map(|c| c.src.size).sum()
}

fn applied(response: Response, what: &str) -> Result<ApplyReport, SyncError> {
    match response {
        Response::Applied(report) => Ok(report),
        Response::Error(e) => Err(CallError::Agent(e).into()),
        other => Err(unexpected(what, &other).into()),
    }
}
