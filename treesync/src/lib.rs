//! Outpost's file-tree engine, used by both ends of a sync: the agent on the
//! host and the controller on the user's machine run the same code, so a push
//! and a pull behave alike.
//!
//! * [`scan`]: describe a tree (kinds, modes, sizes, mtimes, BLAKE3 hashes and
//!   FastCDC chunk lists of large files), skipping excluded paths, with a
//!   [`cache::StatCache`] so unchanged files are not hashed again.
//! * [`known`]: a rescan answered against the scan the other side keeps
//!   (its digest alone, or what changed since).
//! * [`plan`]: compare a source and a destination description and decide what
//!   to create, send, update and remove.
//! * [`apply`]: carry a plan out on the receiving side, safely: every file is
//!   written to a temporary name in its directory, checked against its hash,
//!   flushed, checked against what the plan expected to replace, and renamed.
//! * [`relpath`]: relative paths as raw bytes, checked so nothing escapes the root.
//! * [`filter`]: gitignore-syntax excludes.
//! * [`codec`]: content on the wire, zstd-compressed or stored.
//! * [`mirror`]: one local tree made the same as another (restores, forks).
//! * [`snapshot`]: a checkpoint's copy, sharing unchanged files with the last.

pub mod apply;
pub mod cache;
pub mod chunk;
pub mod codec;
pub mod filter;
pub mod known;
pub mod mirror;
mod parallel;
pub mod plan;
pub mod relpath;
pub mod scan;
pub mod snapshot;
mod sys;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;
