//! `[sandbox.slurm]`: a configured host that is a cluster's login node.
//! `create_sandbox` on it asks Slurm for an allocation instead of making a
//! sandbox on the login node itself; these are the defaults of that request
//! and the checks every value passed to Slurm goes through (a tool argument
//! must never become an option of `sbatch`).

use serde::Deserialize;

/// A cluster's defaults, from the config file only.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmDefaults {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// The allocation's time limit when a call gives none, as Slurm writes
    /// it (`2:00:00`, `1-00:00:00`, `90`).
    pub time: String,
    /// How GPUs are asked for: `--gres=<gpu_gres>:N` (`gpu`, or with a type,
    /// `gpu:a100`).
    pub gpu_gres: String,
}

impl Default for SlurmDefaults {
    fn default() -> Self {
        SlurmDefaults {
            partition: None,
            account: None,
            qos: None,
            time: "1:00:00".into(),
            gpu_gres: "gpu".into(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlurm {
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    time: Option<String>,
    gpu_gres: Option<String>,
}

impl RawSlurm {
    pub(super) fn resolve(self) -> Result<SlurmDefaults, String> {
        let name = |field: &str, v: Option<String>| {
            v.map(|v| check_name(field, &v).map(|()| v)).transpose()
        };
        let defaults = SlurmDefaults::default();
        let time = self.time.unwrap_or(defaults.time);
        check_time(&time)?;
        let gpu_gres = self.gpu_gres.unwrap_or(defaults.gpu_gres);
        if gpu_gres.is_empty()
            || !gpu_gres
                .split(':')
                .all(|part| check_name("gpu_gres", part).is_ok())
        {
            return Err(format!(
                "slurm.gpu_gres {gpu_gres:?} must be a GRES name, optionally with a type (gpu, gpu:a100)"
            ));
        }
        Ok(SlurmDefaults {
            partition: name("partition", self.partition)?,
            account: name("account", self.account)?,
            qos: name("qos", self.qos)?,
            time,
            gpu_gres,
        })
    }
}

/// A partition, account or QOS name: letters, digits, `_ . -`, and `,`
/// between several partitions. Nothing that a shell or `sbatch` would read
/// as more than a name.
pub fn check_name(field: &str, value: &str) -> Result<(), String> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && !value.starts_with('-')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b','));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bad {field} {value:?}: letters, digits, _ . - and , only"
        ))
    }
}

/// A Slurm time limit: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M` or `D-H:M:S`
/// (`infinite` is refused: an allocation always ends).
pub fn check_time(time: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "bad time {time:?}: give Slurm's form, minutes (90), H:MM:SS (2:00:00) or D-HH:MM:SS (1-00:00:00)"
        )
    };
    let numbers = |s: &str| -> Option<usize> {
        let parts: Vec<&str> = s.split(':').collect();
        parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()))
            .then_some(parts.len())
    };
    let ok = match time.split_once('-') {
        Some((days, rest)) => {
            !days.is_empty()
                && days.len() <= 4
                && days.bytes().all(|b| b.is_ascii_digit())
                && numbers(rest).is_some_and(|n| (1..=3).contains(&n))
        }
        None => numbers(time).is_some_and(|n| (1..=3).contains(&n)),
    };
    if ok && time.bytes().any(|b| b != b'0' && b != b':' && b != b'-') {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_slurms_forms() {
        for good in ["90", "30:00", "2:00:00", "1-0", "1-12:00", "2-00:00:00"] {
            assert_eq!(check_time(good), Ok(()), "{good}");
        }
        for bad in [
            "", "0", "0:00", "infinite", "1h", "-1", "1-", "1:2:3:4", "1- 2", "--x", "1;id",
        ] {
            assert!(check_time(bad).unwrap_err().contains("bad time"), "{bad}");
        }
    }

    #[test]
    fn names_cannot_carry_options_or_shell() {
        for good in ["gpu", "gpu_a100", "debug,batch", "lab-1.x"] {
            assert_eq!(check_name("partition", good), Ok(()), "{good}");
        }
        for bad in ["", "-p", "--wrap=id", "a b", "a;b", "$(id)", "a'b"] {
            assert!(check_name("partition", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_fill_in_and_bad_values_are_named() {
        let d = RawSlurm::default().resolve().unwrap();
        assert_eq!(d, SlurmDefaults::default());
        let e = RawSlurm {
            gpu_gres: Some("gpu;id".into()),
            ..RawSlurm::default()
        }
        .resolve()
        .unwrap_err();
        assert!(e.contains("gpu_gres"), "{e}");
        let e = RawSlurm {
            account: Some("--x".into()),
            ..RawSlurm::default()
        }
        .resolve()
        .unwrap_err();
        assert!(e.contains("account"), "{e}");
    }
}
