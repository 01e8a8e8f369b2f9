//! This machine's side of a sync before anything moves: the local root,
//! checked and made absolute, and the local scan with its stat cache file
//! (under `$OUTPOST_HOME/cache`) so unchanged files are not hashed again.
//! Local writes go through the applier, in `run` and `pull`.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use outpost_protocol::{FilterSpec, RelPath, TreeEntry};
use outpost_treesync::apply::describe_files;
use outpost_treesync::cache::{StatCache, Written};
use outpost_treesync::scan::{self, ScanOptions, ScanOutput};

use super::types::SyncError;

/// Scans a local tree on a blocking thread, with the stat cache so unchanged
/// files are not hashed again. Without `chunk_lists` (a pull's destination,
/// see [`describe_local`]), a large file a pull wrote is not read again for
/// a chunk list its cache record lacks.
pub(super) async fn scan_local(
    root: PathBuf,
    filter: FilterSpec,
    chunk_lists: bool,
) -> Result<ScanOutput, SyncError> {
    tokio::task::spawn_blocking(move || {
        let cache_file = local_cache_file(&root);
        let mut cache = cache_file.as_deref().map(StatCache::load_kept);
        let options = ScanOptions {
            hashes: true,
            chunk_lists,
            recursive: true,
            max_entries: 0,
            reap_stale_temps: true,
        };
        let output = scan::scan(&root, &filter, &options, cache.as_mut());
        // Rewritten (whole) only when the scan learnt something.
        if let (Some(cache), Some(file)) = (cache, cache_file)
            && output.summary.root_exists
        {
            keep_cache(cache, &file);
        }
        output
    })
    .await
    .map_err(|_| SyncError::Invalid("the local scan failed unexpectedly".into()))
}

/// Saves a stat cache file if it changed, and keeps it for the next scan.
fn keep_cache(cache: StatCache, file: &Path) {
    // A cache that cannot be saved only costs hashing again next time.
    if let Err(e) = cache.keep(file) {
        tracing::debug!("cannot save {}: {e}", file.display());
    }
}

/// The hash and chunk list of each of `paths` under the local `root` (large
/// files a pull replaces, whose chunk lists its scan left out), from the
/// stat cache where it has them, else read once: what a delta can reuse
/// here. A file that cannot be described is left out (it travels whole).
pub(super) async fn describe_local(root: &Path, paths: Vec<RelPath>) -> Vec<TreeEntry> {
    if paths.is_empty() {
        return Vec::new();
    }
    let root = root.to_path_buf();
    let described = tokio::task::spawn_blocking(move || {
        let cache_file = local_cache_file(&root);
        let mut cache = cache_file.as_deref().map(StatCache::load_kept);
        let described = describe_files(&root, &paths, cache.as_mut());
        if let (Some(cache), Some(file)) = (cache, cache_file) {
            keep_cache(cache, &file);
        }
        described.entries
    })
    .await;
    // A panic describes nothing: the files travel whole.
    described.unwrap_or_default()
}

/// Records the files a pull wrote into `root`'s stat cache, so the next
/// scan here does not read back what was just written and checked.
pub(super) async fn record_written(root: PathBuf, written: Vec<Written>) {
    if written.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        let Some(file) = local_cache_file(&root) else {
            return;
        };
        let mut cache = StatCache::load_kept(&file);
        cache.record_written(&written);
        keep_cache(cache, &file);
    })
    .await;
}

/// `$OUTPOST_HOME` (else `~/.outpost`) `/cache/local-scan-<first 16 hex
/// digits of BLAKE3(root)>`.
fn local_cache_file(root: &Path) -> Option<PathBuf> {
    let nonempty = |v: std::ffi::OsString| (!v.is_empty()).then(|| PathBuf::from(v));
    let home = std::env::var_os("OUTPOST_HOME")
        .and_then(nonempty)
        .or_else(|| {
            Some(
                std::env::var_os("HOME")
                    .and_then(nonempty)?
                    .join(".outpost"),
            )
        })?;
    // As its components: `dir/` and `dir` share one cache.
    let root: PathBuf = root.components().collect();
    let hex = blake3::hash(root.as_os_str().as_bytes()).to_hex();
    Some(
        home.join("cache")
            .join(format!("local-scan-{}", &hex[..16])),
    )
}

/// The local root as an absolute path. A push needs an existing directory; a
/// pull creates a missing one.
pub(super) fn local_dir(local: &Path, must_exist: bool) -> Result<PathBuf, SyncError> {
    let invalid = SyncError::Invalid;
    if local.as_os_str().is_empty() {
        return Err(invalid("the local path is empty".into()));
    }
    let abs = std::path::absolute(local)
        .map_err(|e| invalid(format!("cannot resolve {}: {e}", local.display())))?;
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => Ok(abs),
        Ok(m) => Err(invalid(match special_kind(&m.file_type()) {
            Some(kind) => format!(
                "local path {} is {kind}, not a file or directory",
                local.display()
            ),
            None => format!("local path is not a directory: {}", local.display()),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if must_exist {
                Err(invalid(format!(
                    "local path not found: {}",
                    local.display()
                )))
            } else {
                Ok(abs)
            }
        }
        Err(e) => Err(invalid(format!("cannot read {}: {e}", local.display()))),
    }
}

/// What a path that is neither a file nor a directory is, if it is that.
fn special_kind(kind: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_fifo() {
        Some("a fifo")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cache_per_root_however_spelled() {
        let a = local_cache_file(Path::new("/srv/a"));
        assert!(a.is_some());
        for same in ["/srv/a/", "/srv//a", "/srv/./a/"] {
            assert_eq!(local_cache_file(Path::new(same)), a, "{same}");
        }
        assert_ne!(local_cache_file(Path::new("/srv/b")), a);
    }
}
