//! Command policy: which commands may run on which sandbox.
//!
//! Rules come only from the config file (`[policy]` for every sandbox, plus
//! `policy = {…}` in a `[[sandbox]]` entry or `[policy.sandbox.NAME]` for one
//! sandbox, added to the global rules); never from a tool call. Both front ends
//! ask the same [`Policy`]: the MCP exec tools (`exec_bash`, each sandbox of a
//! fan-out, `exec_bash_background`'s command, resume and checkpoint commands)
//! and `outpost exec`; the code tools and `outpost code` /
//! `install-package` too, for the code's text (or `pip install PKG…`), but
//! allow patterns cannot vouch for code, so a sandbox that has any refuses
//! it ([`Policy::check_unmatchable`]).
//!
//! What a call passes beside its command is checked too: `stdin` by deny
//! and confirm rules, as data ([`Planned::data`]); a sandbox's `env` by
//! deny rules ([`Policy::check_env`]).
//!
//! - `deny`: a command matching any deny pattern (anywhere in it) is refused.
//!   Deny wins over everything else.
//! - `allow`: when a sandbox has allow patterns, a command must match one of
//!   them *whole* (the pattern is anchored at both ends), so `allow =
//!   ['nvidia-smi']` does not admit `nvidia-smi; curl … | sh`. A pattern with
//!   arguments should say which: `python train\.py[^;&|$`\n]*` rather than
//!   `python train\.py.*`, whose `.*` admits whatever follows on the line.
//!   An allow rule vouches for a command's text, so what could change what
//!   that text runs is refused on such a sandbox: writing its files (a new
//!   `train.py`), a sandbox `env` (a fake `ls` first on `PATH`)
//!   ([`Policy::check_writes`]); the person's own `outpost sync` still
//!   writes.
//! - `confirm`: a command matching a confirm pattern (anywhere) runs only after
//!   the person says yes: through MCP elicitation, or on the terminal for
//!   `outpost exec`. No answer, no support for asking, or a "no" refuses it.
//! - `checkpoint`: before a command matching a checkpoint pattern (anywhere)
//!   runs in an isolated sandbox, its work dir is checkpointed, so the
//!   agent or the person can restore it; the call's result names the
//!   checkpoint. Should the checkpoint fail, the command does not run.
//!   Configured hosts have no work dir to checkpoint; the rule does not
//!   apply there.
//!
//! Patterns are Rust `regex` syntax, case-sensitive unless `(?i)`. They are a
//! guard rail against mistakes and steered agents, not a sandbox: a shell
//! command can be spelled many ways, so an allow-list is the stronger tool.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use regex::Regex;

use crate::config::{PolicyRules, RawRules};

/// How long a confirmation question waits for the person by default.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a rule was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `[policy]`: every sandbox.
    Global,
    /// A sandbox's own `policy`.
    Sandbox(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("[policy]"),
            Scope::Sandbox(name) => write!(f, "policy of sandbox {name}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Rule {
    /// As written in the config file.
    pattern: String,
    regex: Regex,
    scope: Scope,
}

#[derive(Debug, Clone, Default)]
struct Rules {
    deny: Vec<Rule>,
    allow: Vec<Rule>,
    confirm: Vec<Rule>,
    checkpoint: Vec<Rule>,
}

impl Rules {
    fn compile(raw: &RawRules, scope: &Scope) -> Result<Rules> {
        let compile = |kind: &str, patterns: &[String], anchored: bool| -> Result<Vec<Rule>> {
            patterns
                .iter()
                .map(|p| {
                    let source = if anchored {
                        format!("^(?:{p})$")
                    } else {
                        p.clone()
                    };
                    match Regex::new(&source) {
                        Ok(regex) => Ok(Rule {
                            pattern: p.clone(),
                            regex,
                            scope: scope.clone(),
                        }),
                        Err(e) => bail!("{scope}: invalid {kind} pattern {p:?}: {e}"),
                    }
                })
                .collect()
        };
        Ok(Rules {
            deny: compile("deny", &raw.deny, false)?,
            allow: compile("allow", &raw.allow, true)?,
            confirm: compile("confirm", &raw.confirm, false)?,
            checkpoint: compile("checkpoint", &raw.checkpoint, false)?,
        })
    }
}

/// The command policy of every sandbox.
#[derive(Debug, Clone)]
pub struct Policy {
    global: Rules,
    sandboxes: BTreeMap<String, Rules>,
    /// Every configured host: an isolated sandbox `HOST/ID` is under
    /// the rules of HOST.
    configured: Vec<String>,
    /// The config file the rules came from, for messages.
    source: String,
    /// How long a confirmation question waits.
    pub confirm_timeout: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            global: Rules::default(),
            sandboxes: BTreeMap::new(),
            configured: Vec::new(),
            source: String::new(),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        }
    }
}

/// What the policy says about a command that may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Run only after the person confirms; the confirm pattern that matched.
    Confirm {
        rule: String,
        scope: Scope,
    },
}

/// Why the policy refused a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub sandbox: String,
    /// Which command of the call: `command`, `resume_command`, …
    pub field: String,
    pub reason: RefusalReason,
    /// The config file, for the message.
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    Deny {
        rule: String,
        scope: Scope,
    },
    /// Allow patterns exist and none matches the whole command.
    NotAllowed {
        allow: Vec<String>,
    },
    /// Allow patterns exist, and what the call runs (`code`, `a package
    /// install`) is not a command they could match whole.
    Unmatchable {
        what: &'static str,
        allow: Vec<String>,
    },
    /// Allow patterns exist, and the call would change what the commands
    /// they vouch for run (`writing its files`, `a sandbox env`).
    ChangesAllowed {
        what: &'static str,
        allow: Vec<String>,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("refused by policy: ")?;
        if !self.field.is_empty() && self.field != "command" {
            write!(f, "{}: ", self.field)?;
        }
        match &self.reason {
            RefusalReason::Deny { rule, scope } => write!(
                f,
                "deny rule {rule:?} ({scope}) for sandbox {}",
                self.sandbox
            )?,
            RefusalReason::NotAllowed { allow } => write!(
                f,
                "the command matches no allow rule for sandbox {} (an allow pattern must match the whole command: {})",
                self.sandbox,
                shown(allow)
            )?,
            RefusalReason::Unmatchable { what, allow } => write!(
                f,
                "sandbox {} runs only commands its allow rules match ({}), and {what} cannot be checked against them; run an allowed command instead",
                self.sandbox,
                shown(allow)
            )?,
            RefusalReason::ChangesAllowed { what, allow } => write!(
                f,
                "sandbox {} runs only commands its allow rules match ({}), and {what} could change what they run",
                self.sandbox,
                shown(allow)
            )?,
        }
        write!(f, " (config: {})", self.source_label())
    }
}

/// The first few allow patterns, quoted, for a message.
fn shown(allow: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut list: Vec<String> = allow.iter().take(SHOWN).map(|p| format!("{p:?}")).collect();
    if allow.len() > SHOWN {
        list.push(format!("… {} more", allow.len() - SHOWN));
    }
    list.join(", ")
}

impl Refusal {
    fn source_label(&self) -> &str {
        if self.source.is_empty() {
            "no file"
        } else {
            &self.source
        }
    }
}

/// One command a call would run (or data it would feed one): on which
/// sandbox, in which parameter.
#[derive(Debug, Clone, Copy)]
pub struct Planned<'a> {
    pub sandbox: &'a str,
    pub field: &'a str,
    pub command: &'a str,
    /// Data (`stdin`), not a command: deny and confirm rules apply, allow
    /// rules do not (they say which commands may run, not what they read).
    pub data: bool,
}

impl<'a> Planned<'a> {
    pub fn command(sandbox: &'a str, field: &'a str, command: &'a str) -> Self {
        Planned {
            sandbox,
            field,
            command,
            data: false,
        }
    }

    pub fn data(sandbox: &'a str, field: &'a str, text: &'a str) -> Self {
        Planned {
            sandbox,
            field,
            command: text,
            data: true,
        }
    }
}

/// A planned command that needs the person's OK first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub sandbox: String,
    pub field: String,
    pub command: String,
    pub rule: String,
    pub scope: Scope,
}

impl Policy {
    /// Compiles the rules; an invalid pattern, a per-sandbox policy for a
    /// sandbox that does not exist, or a bad timeout is an error that names it.
    pub fn compile(rules: &PolicyRules, known_sandboxes: &[String]) -> Result<Policy> {
        Policy::compile_rules(
            &rules.global,
            &rules.sandboxes,
            known_sandboxes,
            rules.confirm_timeout_s,
            &rules.source,
        )
        .with_context(|| {
            if rules.source.is_empty() {
                "invalid policy".to_string()
            } else {
                format!("invalid [policy] in config file {}", rules.source)
            }
        })
    }

    fn compile_rules(
        global: &RawRules,
        per_sandbox: &[(String, RawRules)],
        known_sandboxes: &[String],
        confirm_timeout_s: Option<f64>,
        source: &str,
    ) -> Result<Policy> {
        let confirm_timeout = match confirm_timeout_s {
            None => DEFAULT_CONFIRM_TIMEOUT,
            Some(s) if s > 0.0 && s <= 86_400.0 => Duration::from_secs_f64(s),
            Some(s) => bail!(
                "[policy] confirm_timeout_s must be a number of seconds between 0 and 86400, got {s}"
            ),
        };
        let mut sandboxes: BTreeMap<String, Rules> = BTreeMap::new();
        for (name, raw) in per_sandbox {
            if !known_sandboxes.iter().any(|k| k == name) {
                bail!(
                    "[policy.sandbox.{name}]: there is no sandbox named {name:?} (sandboxes: {})",
                    known_sandboxes.join(", ")
                );
            }
            let rules = Rules::compile(raw, &Scope::Sandbox(name.clone()))?;
            let entry = sandboxes.entry(name.clone()).or_default();
            entry.deny.extend(rules.deny);
            entry.allow.extend(rules.allow);
            entry.confirm.extend(rules.confirm);
            entry.checkpoint.extend(rules.checkpoint);
        }
        Ok(Policy {
            global: Rules::compile(global, &Scope::Global)?,
            sandboxes,
            configured: known_sandboxes.to_vec(),
            source: source.to_string(),
            confirm_timeout,
        })
    }

    /// Whether no rule exists at all (every command may run).
    pub fn is_empty(&self) -> bool {
        let empty = |r: &Rules| {
            r.deny.is_empty()
                && r.allow.is_empty()
                && r.confirm.is_empty()
                && r.checkpoint.is_empty()
        };
        empty(&self.global) && self.sandboxes.values().all(empty)
    }

    /// The rules that apply on `sandbox`: the global ones, then its own
    /// (for an isolated sandbox `HOST/ID`, those of HOST).
    fn rules<'a>(&'a self, sandbox: &str, pick: fn(&Rules) -> &Vec<Rule>) -> Vec<&'a Rule> {
        let mut rules: Vec<&Rule> = pick(&self.global).iter().collect();
        let host =
            crate::config::split_sandbox_name(sandbox, |n| self.configured.iter().any(|c| c == n))
                .map_or(sandbox, |(host, _)| host);
        if let Some(own) = self.sandboxes.get(host) {
            rules.extend(pick(own).iter());
        }
        rules
    }

    /// The checkpoint pattern that `command` on `sandbox` matches, if any:
    /// a checkpoint is due before it runs.
    pub fn checkpoint_rule(&self, sandbox: &str, command: &str) -> Option<&str> {
        self.rules(sandbox, |r| &r.checkpoint)
            .into_iter()
            .find(|r| r.regex.is_match(command))
            .map(|r| r.pattern.as_str())
    }

    /// What the policy says about running `command` on `sandbox`.
    pub fn check(&self, sandbox: &str, command: &str) -> Result<Verdict, Refusal> {
        self.check_field(&Planned::command(sandbox, "command", command))
    }

    fn check_field(&self, planned: &Planned<'_>) -> Result<Verdict, Refusal> {
        let Planned {
            sandbox,
            field,
            command,
            data,
        } = *planned;
        let refuse = |reason| Refusal {
            sandbox: sandbox.to_string(),
            field: field.to_string(),
            reason,
            source: self.source.clone(),
        };
        if let Some(rule) = self
            .rules(sandbox, |r| &r.deny)
            .into_iter()
            .find(|r| r.regex.is_match(command))
        {
            return Err(refuse(RefusalReason::Deny {
                rule: rule.pattern.clone(),
                scope: rule.scope.clone(),
            }));
        }
        let allow = self.rules(sandbox, |r| &r.allow);
        if !data && !allow.is_empty() && !allow.iter().any(|r| r.regex.is_match(command)) {
            return Err(refuse(RefusalReason::NotAllowed {
                allow: allow.iter().map(|r| r.pattern.clone()).collect(),
            }));
        }
        match self
            .rules(sandbox, |r| &r.confirm)
            .into_iter()
            .find(|r| r.regex.is_match(command))
        {
            Some(rule) => Ok(Verdict::Confirm {
                rule: rule.pattern.clone(),
                scope: rule.scope.clone(),
            }),
            None => Ok(Verdict::Allow),
        }
    }

    /// Refuses what no allow pattern can vouch for (code for an
    /// interpreter, a package install: `what`, in parameter `field`) on a
    /// sandbox that has allow patterns; elsewhere deny and confirm rules
    /// apply to its text as to a command's ([`Policy::review`]).
    pub fn check_unmatchable(
        &self,
        sandbox: &str,
        field: &str,
        what: &'static str,
    ) -> Result<(), Refusal> {
        let allow = self.rules(sandbox, |r| &r.allow);
        if allow.is_empty() {
            return Ok(());
        }
        Err(Refusal {
            sandbox: sandbox.to_string(),
            field: field.to_string(),
            reason: RefusalReason::Unmatchable {
                what,
                allow: allow.iter().map(|r| r.pattern.clone()).collect(),
            },
            source: self.source.clone(),
        })
    }

    /// Refuses `what` (a file write, a sandbox env) on a sandbox whose allow
    /// rules vouch for command text: it could change what that text runs.
    pub fn check_writes(&self, sandbox: &str, what: &'static str) -> Result<(), Refusal> {
        let allow = self.rules(sandbox, |r| &r.allow);
        if allow.is_empty() {
            return Ok(());
        }
        Err(Refusal {
            sandbox: sandbox.to_string(),
            field: String::new(),
            reason: RefusalReason::ChangesAllowed {
                what,
                allow: allow.iter().map(|r| r.pattern.clone()).collect(),
            },
            source: self.source.clone(),
        })
    }

    /// A sandbox's `env` on `host`: refused where allow rules are (see
    /// [`Self::check_writes`]) or a deny rule matches an assignment.
    pub fn check_env<'e>(
        &self,
        host: &str,
        env: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Result<(), Refusal> {
        let env: Vec<_> = env.into_iter().collect();
        if env.is_empty() {
            return Ok(());
        }
        self.check_writes(host, "a sandbox env")?;
        let text = policy_text(env, "");
        let deny = self
            .rules(host, |r| &r.deny)
            .into_iter()
            .find(|r| r.regex.is_match(&text));
        match deny {
            Some(rule) => Err(Refusal {
                sandbox: host.to_string(),
                field: "env".into(),
                reason: RefusalReason::Deny {
                    rule: rule.pattern.clone(),
                    scope: rule.scope.clone(),
                },
                source: self.source.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Checks every command a call would run. The first refusal refuses the
    /// whole call (nothing runs); otherwise the commands that need the
    /// person's OK, none when all may simply run.
    pub fn review(&self, planned: &[Planned<'_>]) -> Result<Vec<Pending>, Refusal> {
        let mut pending = Vec::new();
        for p in planned {
            if let Verdict::Confirm { rule, scope } = self.check_field(p)? {
                pending.push(Pending {
                    sandbox: p.sandbox.to_string(),
                    field: p.field.to_string(),
                    command: p.command.to_string(),
                    rule,
                    scope,
                });
            }
        }
        Ok(pending)
    }

    /// The config file named in messages.
    pub fn source(&self) -> &str {
        if self.source.is_empty() {
            "no file"
        } else {
            &self.source
        }
    }
}

/// The text the policy checks for `body` run with the caller's `env`: the
/// assignments first, as a shell would read them, so rules see every byte
/// the caller chose.
pub fn policy_text<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>, body: &str) -> String {
    let mut text = String::new();
    for (name, value) in env {
        text.push_str(&format!("{name}='{}' ", value.replace('\'', "'\\''")));
    }
    text.push_str(body);
    text
}

/// The commands a background job would run, by parameter: its command, its
/// resume command (also the one inside `resume_plan_json`, which the host runs
/// when `resume_command` is not set) and its checkpoint command.
pub fn job_commands(spec: &outpost_protocol::JobSpec) -> Vec<(&'static str, String)> {
    let w = &spec.watch;
    let plan = w
        .resume_plan_json
        .as_deref()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .and_then(|plan| Some(plan.get("resume_command")?.as_str()?.to_string()));
    [
        ("command", Some(spec.command.clone())),
        ("resume_command", w.resume_command.clone()),
        ("resume_plan_json", plan),
        ("checkpoint_command", w.checkpoint_command.clone()),
    ]
    .into_iter()
    .filter_map(|(field, command)| Some((field, command?)))
    .collect()
}

/// The question put to the person for commands that need their OK; `who`
/// says who wants them run ("An agent", "You").
pub fn confirm_question(pending: &[Pending], policy: &Policy, who: &str) -> String {
    const SHOWN: usize = 2000;
    let mut text =
        format!("{who} asked to run a command that your Outpost policy asks you to confirm.\n");
    for p in pending {
        let command = if p.command.len() > SHOWN {
            let mut end = SHOWN;
            while !p.command.is_char_boundary(end) {
                end -= 1;
            }
            format!(
                "{}… [{} more bytes]",
                &p.command[..end],
                p.command.len() - end
            )
        } else {
            p.command.clone()
        };
        text.push_str(&format!(
            "\nSandbox: {}\n{}: {}\nConfirm rule: {:?} ({})\n",
            p.sandbox,
            if p.field == "command" {
                "Command"
            } else {
                &p.field
            },
            command,
            p.rule,
            p.scope
        ));
    }
    text.push_str(&format!("\n(config: {})\nRun it?", policy.source()));
    text
}

/// The tool error for confirm rules that could not be confirmed.
pub fn not_confirmed(pending: &[Pending], why: &str) -> String {
    let rules: Vec<String> = pending
        .iter()
        .map(|p| format!("confirm rule {:?} for sandbox {}", p.rule, p.sandbox))
        .collect();
    format!(
        "refused: {} needs the user's confirmation, and {why}",
        rules.join(", ")
    )
}

#[cfg(test)]
mod tests;
