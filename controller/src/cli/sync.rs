//! `outpost sync`: one side a local path, the other `SANDBOX:PATH`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use outpost::fleet::Fleet;
use outpost::ops::human_bytes;

/// `NAME:PATH` when NAME is a configured host, or `N1,N2,…:PATH` when
/// each is.
fn remote_spec<'a>(fleet: &Fleet, arg: &'a str) -> Option<(Vec<String>, &'a str)> {
    let (names, path) = arg.split_once(':')?;
    let names: Vec<String> = names.split(',').map(str::to_string).collect();
    // An empty name would be the active sandbox: never meant in a list.
    names
        .iter()
        .all(|name| !name.is_empty() && fleet.get(Some(name)).is_ok())
        .then_some((names, path))
}

pub(super) async fn sync(
    fleet: &Fleet,
    source: &str,
    target: &str,
    options: outpost::sync::SyncOptions,
) -> Result<ExitCode> {
    use outpost::sync::Progress;
    use std::sync::atomic::Ordering;
    let (push, names, remote, local) = match (
        remote_spec(fleet, source),
        remote_spec(fleet, target),
    ) {
        (None, Some((names, remote))) => (true, names, remote, source),
        (Some((names, remote)), None) => (false, names, remote, target),
        (Some(_), Some(_)) => anyhow::bail!("both sides are sandboxes; one must be a local path"),
        (None, None) => {
            // `gpu1/Bad_Id:x` (or `h1,gpu1/Bad_Id:x`) names a host and a
            // bad sandbox id.
            for arg in [source, target] {
                let Some((names, _)) = arg.split_once(':') else {
                    continue;
                };
                for name in names.split(',') {
                    if let Some((host, _)) = name.rsplit_once('/')
                        && fleet.names().iter().any(|n| n == host)
                        && let Err(e) = fleet.get(Some(name))
                    {
                        anyhow::bail!("{e}");
                    }
                }
            }
            let sandboxes = fleet.names().join(", ");
            // `nope:/x` most likely meant a sandbox, unless it is a local path.
            let meant = [source, target].into_iter().find_map(|arg| {
                let (name, _) = arg.split_once(':')?;
                let local = std::path::Path::new(arg).exists() || name.contains('/');
                (!local && !name.is_empty()).then_some(name)
            });
            // `h1,nope:x`: the one that is no sandbox.
            let meant = meant.map(|names| {
                names
                    .split(',')
                    .find(|n| n.is_empty() || fleet.get(Some(n)).is_err())
                    .unwrap_or(names)
            });
            match meant {
                Some(name) => anyhow::bail!(
                    "no sandbox named {name} (sandboxes: {sandboxes}); a local path with a colon needs ./ in front"
                ),
                None => anyhow::bail!(
                    "neither side names a sandbox; write one as NAME:PATH (sandboxes: {sandboxes})"
                ),
            }
        }
    };
    if !push && names.len() > 1 {
        anyhow::bail!("a pull comes from one sandbox; name one before the colon");
    }
    let sessions = names
        .iter()
        .map(|name| fleet.get(Some(name)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    for (i, session) in sessions.iter().enumerate() {
        if sessions[..i].iter().any(|s| s.name() == session.name()) {
            anyhow::bail!("{} is named twice", names[i]);
        }
    }
    let session = &sessions[0];
    // Relative: the home, or an isolated sandbox's work dir.
    let mut remote = if remote.is_empty() { "." } else { remote }.to_string();
    let mut local = local.to_string();
    let mut options = options;
    // A person typed the path: only a configured `local_roots` limits it.
    let roots = outpost::ops::localpath::configured_or(
        fleet.config.local_roots.as_deref(),
        outpost::ops::localpath::Roots::unrestricted,
    )
    .protecting(fleet.config.own_files());
    // One remote file: into a local directory, or to the path given.
    if !push
        && let Some(one) = outpost::ops::files::file_pull(session, &remote, &local, &roots)
            .await
            .map_err(anyhow::Error::msg)?
    {
        remote = one.remote_dir;
        local = one.local_dir;
        options.only = Some(one.name);
    }
    let intent = if push {
        outpost::ops::localpath::Intent::Read
    } else {
        outpost::ops::localpath::Intent::Dest {
            create: !options.dry_run,
        }
    };
    let local = roots.resolve(&local, intent).map_err(anyhow::Error::msg)?;
    options.excludes.extend(local.secret_excludes);
    if let Some(file) = &options.exclude_file {
        let file = roots.resolve(
            &file.to_string_lossy(),
            outpost::ops::localpath::Intent::Read,
        );
        options.exclude_file = Some(file.map_err(anyhow::Error::msg)?.path);
    }
    let local = local.path;
    let progress = Arc::new(Progress::default());
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ticker = {
        let (bar, progress) = (bar.clone(), progress.clone());
        tokio::spawn(async move {
            loop {
                bar.set_length(progress.bytes_total.load(Ordering::Relaxed));
                bar.set_position(progress.bytes_done.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{}/{} files",
                    progress.files_done.load(Ordering::Relaxed),
                    progress.files_total.load(Ordering::Relaxed)
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    if sessions.len() > 1 {
        let results =
            outpost::sync::push_many(&sessions, &local, &remote, &options, progress).await;
        ticker.abort();
        bar.finish_and_clear();
        let results = results.map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mut failed, mut problems) = (false, false);
        for (name, result) in names.iter().zip(results) {
            match result {
                Ok(report) => {
                    problems |= !report.problems.is_empty();
                    print_report(&format!("{name}: "), &report);
                }
                Err(e) => {
                    failed = true;
                    eprintln!("outpost: {name}: {e}");
                }
            }
        }
        return Ok(match (failed, problems) {
            (true, _) => ExitCode::FAILURE,
            (false, true) => ExitCode::from(23),
            (false, false) => ExitCode::SUCCESS,
        });
    }
    let result = if push {
        outpost::sync::push(session, &local, &remote, &options, progress).await
    } else {
        outpost::sync::pull(session, &remote, &local, &options, progress).await
    };
    ticker.abort();
    bar.finish_and_clear();
    let report = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    print_report("", &report);
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(23)
    })
}

/// A sync's report as lines; problems (prefixed too) on stderr.
fn print_report(prefix: &str, report: &outpost::sync::SyncReport) {
    println!(
        "{prefix}{}{} files sent ({} of content, {} on the wire{}), {} unchanged, {} dirs created, {} symlinks, {} attribute updates, {} deleted, {:.2} s",
        if report.dry_run {
            "dry run: would have "
        } else {
            ""
        },
        report.files_sent,
        human_bytes(report.bytes_total),
        human_bytes(report.bytes_sent),
        if report.bytes_resumed > 0 {
            format!(", {} resumed", human_bytes(report.bytes_resumed))
        } else {
            String::new()
        },
        report.files_unchanged,
        report.dirs_created,
        report.symlinks,
        report.attrs_updated,
        report.deleted,
        report.duration_s
    );
    // A dry run shows what it would do, the deletions above all.
    for path in &report.would_delete {
        println!("{prefix}would delete  {path}");
    }
    for path in &report.would_send {
        println!("{prefix}would send    {path}");
    }
    for problem in &report.problems {
        eprintln!("outpost: {prefix}{problem}");
    }
}
