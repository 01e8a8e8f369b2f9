//! Running a command on a sandbox, as both front ends do it: the request
//! from its parameters, the exit status a shell would report for the
//! result, and the outcomes of a fan-out grouped.

use outpost_protocol::{ExecRequest, ExecResult};

/// `exec_bash`'s default timeout, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;
/// `exec_bash`'s default output cap per stream, in bytes.
pub const DEFAULT_MAX_OUTPUT: i64 = 20_000;

/// What a caller asks to run.
#[derive(Debug, Clone, Default)]
pub struct Command<'a> {
    pub command: &'a str,
    pub cwd: Option<&'a str>,
    /// Seconds; `None` means no limit.
    pub timeout_s: Option<f64>,
    /// Bytes kept per stream (head and tail); 0 keeps everything.
    pub max_output: i64,
    /// Send output as it comes rather than with the result.
    pub stream: bool,
}

/// The agent request for `cmd`, or what is wrong with it.
pub fn request(cmd: &Command<'_>) -> Result<ExecRequest, String> {
    let timeout_ms = match cmd.timeout_s {
        Some(t) if t > 0.0 && t.is_finite() => Some((t * 1000.0).min(u64::MAX as f64 / 2.0) as u64),
        Some(t) => {
            return Err(format!(
                "timeout_s must be a positive number of seconds, got {t}"
            ));
        }
        None => None,
    };
    if cmd.max_output < 0 {
        return Err(format!(
            "max_output_chars must be 0 or more, got {}",
            cmd.max_output
        ));
    }
    if cmd.command.trim().is_empty() {
        return Err("command is empty".into());
    }
    Ok(ExecRequest {
        command: cmd.command.to_string(),
        cwd: cmd.cwd.filter(|c| !c.is_empty()).map(str::to_string),
        env: Vec::new(),
        stdin: None,
        timeout_ms,
        output_limit: cmd.max_output as u64,
        stream: cmd.stream,
        progress_ms: None,
    })
}

/// The status a shell reports for `result`: 124 on timeout (as `timeout(1)`),
/// 128+N when signal N killed it, else its exit code; -1 when there is none.
pub fn shell_status(result: &ExecResult) -> i32 {
    if result.timed_out {
        124
    } else {
        result
            .exit_code
            .or(result.signal.map(|s| 128 + s))
            .unwrap_or(-1)
    }
}

/// Outcomes of one command on several sandboxes, grouped: each distinct
/// outcome once, with the sandboxes that gave it, in the order first seen.
pub fn group_outcomes<T: PartialEq>(
    outcomes: impl IntoIterator<Item = (String, T)>,
) -> Vec<(Vec<String>, T)> {
    let mut groups: Vec<(Vec<String>, T)> = Vec::new();
    for (name, outcome) in outcomes {
        match groups.iter_mut().find(|(_, o)| *o == outcome) {
            Some((names, _)) => names.push(name),
            None => groups.push((vec![name], outcome)),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let cmd = |timeout_s, max_output| Command {
            command: "true",
            timeout_s,
            max_output,
            ..Command::default()
        };
        assert!(request(&cmd(Some(-1.0), 0)).is_err());
        assert!(request(&cmd(Some(f64::NAN), 0)).is_err());
        assert!(request(&cmd(Some(1.0), -1)).is_err());
        assert_eq!(request(&cmd(Some(1.5), 7)).unwrap().timeout_ms, Some(1500));
        assert_eq!(request(&cmd(None, 0)).unwrap().timeout_ms, None);
        let empty = Command {
            command: "  ",
            ..Command::default()
        };
        assert!(request(&empty).is_err());
    }

    #[test]
    fn outcomes_are_grouped_in_order() {
        let outcomes = [("a", 1), ("b", 2), ("c", 1)].map(|(n, o)| (n.to_string(), o));
        assert_eq!(
            group_outcomes(outcomes),
            vec![
                (vec!["a".to_string(), "c".to_string()], 1),
                (vec!["b".to_string()], 2)
            ]
        );
    }
}
