//! Relative paths as raw bytes, joined to a root without escaping it.
//!
//! Paths on the wire are the bytes the kernel gave us: names may hold spaces,
//! newlines or bytes that are not UTF-8, and must come back out unchanged. The
//! only bytes a component can never hold are `/` and NUL.

use std::path::{Path, PathBuf};

use crate::sys;

/// Joins `rel` to `root`, refusing absolute paths, `..`, empty or NUL-bearing
/// components. Checking that no parent is a symlink is [`crate::apply`]'s job
/// (it opens parents without following links).
pub fn join(root: &Path, rel: &[u8]) -> Result<PathBuf, String> {
    components(rel)?;
    Ok(root.join(sys::path_of(rel)))
}

/// Splits `rel` into its components after the checks [`join`] makes: not
/// empty, not absolute, no empty, `.` or `..` component, no NUL byte.
pub fn components(rel: &[u8]) -> Result<Vec<&[u8]>, String> {
    if rel.is_empty() {
        return Err("empty path".to_string());
    }
    if rel[0] == b'/' {
        return Err(format!("absolute path refused: {}", display(rel)));
    }
    if rel.contains(&0) {
        return Err(format!("path contains a NUL byte: {}", display(rel)));
    }
    let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    for part in &parts {
        match *part {
            b"" => return Err(format!("path has an empty component: {}", display(rel))),
            b"." | b".." => {
                return Err(format!(
                    "path has a `{}` component: {}",
                    display(part),
                    display(rel)
                ));
            }
            _ => {}
        }
    }
    Ok(parts)
}

/// The parent of a relative path (empty for a top-level name).
pub fn parent(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => &rel[..i],
        None => b"",
    }
}

/// The last component of a relative path.
pub fn file_name(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
    }
}

/// Number of components (0 for the root's empty path).
pub fn depth(rel: &[u8]) -> usize {
    if rel.is_empty() {
        0
    } else {
        rel.iter().filter(|&&b| b == b'/').count() + 1
    }
}

/// Shows a raw path to people (invalid UTF-8 escaped).
///
/// Bytes that are not UTF-8 become `\xNN`, and control characters are escaped
/// too (`\n`, `\t`, `\r`, `\xNN`), so one path is always one line of a log.
pub fn display(rel: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(rel.len());
    for chunk in rel.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c == '\x7f' => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_refuses_escapes() {
        let root = Path::new("/r");
        for bad in [
            &b""[..],
            b"/etc/passwd",
            b"..",
            b"a/../b",
            b".",
            b"./a",
            b"a//b",
            b"a/",
            b"a/\0b",
        ] {
            assert!(join(root, bad).is_err(), "{:?} accepted", display(bad));
        }
        assert_eq!(join(root, b"a/b c").unwrap(), Path::new("/r/a/b c"));
        // Dots are only special as whole components.
        assert!(join(root, b"...").is_ok());
        assert!(join(root, b".hidden/..x").is_ok());
    }

    #[test]
    fn raw_bytes_round_trip() {
        use std::os::unix::ffi::OsStrExt;
        let rel = b"we ird/new\nline/\xff\xfe.bin";
        let joined = join(Path::new("/r"), rel).unwrap();
        assert_eq!(
            joined.as_os_str().as_bytes(),
            &b"/r/we ird/new\nline/\xff\xfe.bin"[..]
        );
    }

    #[test]
    fn display_escapes() {
        assert_eq!(display(b"a\xffb"), "a\\xffb");
        assert_eq!(display(b"new\nline"), "new\\nline");
        assert_eq!(display("caf\u{e9}".as_bytes()), "caf\u{e9}");
    }

    #[test]
    fn helpers() {
        assert_eq!(parent(b"a/b/c"), b"a/b");
        assert_eq!(parent(b"a"), b"");
        assert_eq!(file_name(b"a/b/c"), b"c");
        assert_eq!(depth(b"a/b/c"), 3);
        assert_eq!(depth(b""), 0);
    }
}
