//! Tree sync vs rsync over the same sshd: cold (`outpost sync` CLI runs, against
//! the local floor too) and warm (the MCP server connected, rsync on a ControlMaster).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, TempDir, noise, target_bin};
use serde_json::json;

use crate::{FRESH_ROUNDS, mcp_client, median, ms, ssh_base, timed, tool, write_config};

/// remote-sandbox-mcp's sync scenario: 2,000 files of 1–8 KB in 40
/// directories plus 5 × 20 MB, under `src`.
pub(crate) fn seed_tree(src: &Path) {
    for i in 0..2000u64 {
        let dir = src.join(format!("pkg{:02}", i % 40));
        std::fs::create_dir_all(&dir).unwrap();
        let len = 1024 + (i as usize * 7919) % 7168;
        std::fs::write(dir.join(format!("f{i:04}.txt")), noise(len, i + 1)).unwrap();
    }
    for i in 0..5u64 {
        std::fs::write(
            src.join(format!("weights{i}.bin")),
            noise(20 << 20, 1000 + i),
        )
        .unwrap();
    }
}

/// 10 files of `src` changed (new content, seeded by `round`) and 100
/// touched (mtime only).
fn change_tree(src: &Path, round: u64) {
    for i in 0..10u64 {
        let path = src.join(format!("pkg{:02}/f{i:04}.txt", i % 40));
        std::fs::write(&path, noise(2048, 50_000 + i + 100 * round)).unwrap();
    }
    for i in 100..200u64 {
        let path = src.join(format!("pkg{:02}/f{i:04}.txt", i % 40));
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now()).unwrap();
    }
}

/// The case agents live in: the MCP server already connected, rsync over a
/// warm ControlMaster connection. Re-push after 10 changed + 100 touched
/// files, no-op push and no-op pull, each a median of rounds, dirty pages
/// flushed before each timed run.
pub(crate) async fn sync_warm() {
    const ROUNDS: usize = 5;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sync-warm");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let src = scratch.path().join("src");
    seed_tree(&src);
    let config = scratch.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "local_roots = [{:?}]\n{}",
            scratch.path().display().to_string(),
            sshd.sandbox_toml("box")
        ),
    )
    .unwrap();
    let client = mcp_client(&home, Some(&config)).await;
    let control = scratch.path().join("cm.sock");
    let mut master = ssh_base(&sshd, &control)
        .args(["-o", "ControlMaster=yes", "-N"])
        .spawn()
        .expect("ssh master");
    let ready = outpost_e2e::wait_until(Duration::from_secs(10), || control.exists());
    assert!(ready, "ControlMaster socket never appeared");
    let rsync = |from: String, to: String| {
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "--delete", "-e"])
            .arg(format!(
                "ssh -o ControlPath={} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                control.display(),
                sshd.port()
            ))
            .arg(from)
            .arg(to);
        cmd
    };
    let flush = || {
        let _ = Command::new("sync").status();
    };
    let user_host = format!("{}@{}", sshd.user(), sshd.host());
    let src_arg = format!("{}/", src.display());
    let (o_remote, r_remote) = (sshd.remote_dir().join("o"), sshd.remote_dir().join("r"));
    let r_remote_arg = format!("{user_host}:{}/", r_remote.display());
    let (o_back, r_back) = (scratch.path().join("o-back"), scratch.path().join("r-back"));
    let push = json!({"local_path": src, "remote_path": o_remote, "sandbox_name": "box"});
    let pull = json!({"remote_path": o_remote, "local_path": o_back, "sandbox_name": "box"});
    let timed_tool = |name: &'static str, args: serde_json::Value| {
        let client = &client;
        async move {
            flush();
            let t = Instant::now();
            let r = tool(client, name, args).await;
            (t.elapsed(), r)
        }
    };
    let timed_rsync = |from: String, to: String| {
        flush();
        timed(rsync(from, to)).0
    };
    // Fresh copies both ways first (not timed here: see the cold part).
    timed_tool("sync_local_to_remote", push.clone()).await;
    timed_rsync(src_arg.clone(), r_remote_arg.clone());
    timed_tool("sync_remote_to_local", pull.clone()).await;
    timed_rsync(r_remote_arg.clone(), format!("{}/", r_back.display()));

    let (mut re_o, mut re_r, mut noop_o, mut noop_r) = (vec![], vec![], vec![], vec![]);
    let (mut pull_o, mut pull_r, mut engine, mut pull_engine) = (vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        change_tree(&src, round as u64 + 1);
        let (took, r) = timed_tool("sync_local_to_remote", push.clone()).await;
        re_o.push(took);
        engine.push(Duration::from_secs_f64(
            r["duration_s"].as_f64().unwrap_or(0.0),
        ));
        re_r.push(timed_rsync(src_arg.clone(), r_remote_arg.clone()));
        noop_o.push(timed_tool("sync_local_to_remote", push.clone()).await.0);
        noop_r.push(timed_rsync(src_arg.clone(), r_remote_arg.clone()));
        // Pulls of what the pushes just made: the first brings the
        // changes, the second is the no-op timed here.
        timed_tool("sync_remote_to_local", pull.clone()).await;
        timed_rsync(r_remote_arg.clone(), format!("{}/", r_back.display()));
        let (took, r) = timed_tool("sync_remote_to_local", pull.clone()).await;
        pull_o.push(took);
        pull_engine.push(Duration::from_secs_f64(
            r["duration_s"].as_f64().unwrap_or(0.0),
        ));
        pull_r.push(timed_rsync(
            r_remote_arg.clone(),
            format!("{}/", r_back.display()),
        ));
    }
    // The same re-push while another program has 256 MiB not yet written
    // back on the same filesystem (a flush of the whole filesystem would
    // wait for it).
    let dirty = scratch.path().join("someone-elses.bin");
    let other_data = noise(256 << 20, 4242);
    let (mut dirty_o, mut dirty_r) = (vec![], vec![]);
    for round in 0..3u64 {
        change_tree(&src, 100 + round);
        flush();
        std::fs::write(&dirty, &other_data).unwrap();
        let t = Instant::now();
        tool(&client, "sync_local_to_remote", push.clone()).await;
        dirty_o.push(t.elapsed());
        flush();
        std::fs::write(&dirty, &other_data).unwrap();
        dirty_r.push(timed(rsync(src_arg.clone(), r_remote_arg.clone())).0);
    }
    let _ = std::fs::remove_file(&dirty);
    let _ = master.kill();
    let _ = master.wait();
    client.cancel().await.ok();
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!();
    println!(
        "sync, warm (MCP server connected; rsync over a ControlMaster), same tree; median of {ROUNDS}"
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>7}",
        "", "outpost", "rsync", "ratio"
    );
    for (label, o, r) in [
        (
            "re-push (10 changed, 100 touched)",
            median(re_o),
            median(re_r),
        ),
        ("no-op push", median(noop_o), median(noop_r)),
        ("no-op pull", median(pull_o), median(pull_r)),
        (
            "re-push, 256 MiB of others dirty",
            median(dirty_o),
            median(dirty_r),
        ),
    ] {
        println!(
            "  {label:<34} {:>10} {:>10} {:>6.2}x",
            ms(o),
            ms(r),
            ratio(o, r)
        );
    }
    println!(
        "  the engine's own duration_s: re-push {}, no-op pull {}",
        ms(median(engine)),
        ms(median(pull_engine))
    );
}

pub(crate) fn sync_vs_rsync() {
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-sync");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "box", &[&sshd]);
    let src = scratch.path().join("src");
    seed_tree(&src);
    let remote = |name: &str| sshd.remote_dir().join(name);
    let outpost = |from: &str, to: &str| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", "--no-default-excludes", from, to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let rsync = |from: String, to: String| {
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "--delete", "-e"])
            .arg(format!(
                "ssh -i {} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                sshd.client_key().display(),
                sshd.port()
            ))
            .arg(from)
            .arg(to);
        cmd
    };
    let user_host = format!("{}@{}", sshd.user(), sshd.host());
    let src_arg = format!("{}/", src.display());

    // Fresh transfers are repeated into new directories, alternating tools, and
    // the medians compared; dirty pages are flushed before each run (fresh or
    // not) so neither tool pays for the other's writeback: Outpost flushes
    // what it wrote before renaming it, which on a journaled filesystem also
    // waits for whatever rsync left unwritten just before.
    let flush = || {
        let _ = Command::new("sync").status();
    };
    let mut fresh_o = Vec::new();
    let mut fresh_r = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let dst = format!("box0:{}", remote(&format!("o{round}")).display());
        fresh_o.push(timed(outpost(&src_arg, &dst)).0);
        flush();
        let dst = format!("{user_host}:{}/", remote(&format!("r{round}")).display());
        fresh_r.push(timed(rsync(src_arg.clone(), dst)).0);
    }
    let (o_fresh, r_fresh) = (median(fresh_o), median(fresh_r));
    let o_remote = format!("box0:{}", remote("o0").display());
    let r_remote = format!("{user_host}:{}/", remote("r0").display());

    change_tree(&src, 0);
    flush();
    let (o_re, _) = timed(outpost(&src_arg, &o_remote));
    flush();
    let (r_re, _) = timed(rsync(src_arg.clone(), r_remote.clone()));
    flush();
    let (o_noop, _) = timed(outpost(&src_arg, &o_remote));
    flush();
    let (r_noop, _) = timed(rsync(src_arg.clone(), r_remote.clone()));

    let mut pull_o = Vec::new();
    let mut pull_r = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let back = scratch.path().join(format!("o-back{round}"));
        pull_o.push(timed(outpost(&o_remote, &back.display().to_string())).0);
        flush();
        let back = scratch.path().join(format!("r-back{round}"));
        pull_r.push(timed(rsync(r_remote.clone(), format!("{}/", back.display()))).0);
    }
    let (o_pull, r_pull) = (median(pull_o), median(pull_r));

    // The floor a fresh transfer can approach on this machine: the tree
    // copied within the same filesystem and flushed, with no network,
    // encryption or second process.
    let mut floor = Vec::new();
    for round in 0..FRESH_ROUNDS {
        flush();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", r#"cp -a "$1" "$2" && sync -f "$2""#, "sh"])
            .arg(&src)
            .arg(scratch.path().join(format!("floor{round}")));
        floor.push(timed(cmd).0);
    }
    let floor = median(floor);

    // A 4 KiB edit in a 20 MB file, at several places (what an edit costs
    // depends on the chunk it falls in): bytes each tool sends, and the
    // time of the middle one.
    let weights = src.join("weights0.bin");
    let mut content = std::fs::read(&weights).unwrap();
    let (mut o_bytes, mut r_bytes) = (Vec::new(), Vec::new());
    let (mut o_edit, mut r_edit) = (Duration::ZERO, Duration::ZERO);
    const EDITS: usize = 7;
    for k in 0..EDITS {
        let at = content.len() * (k + 1) / (EDITS + 1);
        content[at..at + 4096].copy_from_slice(&noise(4096, 77 + k as u64));
        std::fs::write(&weights, &content).unwrap();
        flush();
        let (o_took, o_out) = timed(outpost(&src_arg, &o_remote));
        let mut r_cmd = rsync(src_arg.clone(), r_remote.clone());
        r_cmd.arg("--stats");
        flush();
        let (r_took, r_out) = timed(r_cmd);
        if k == EDITS / 2 {
            (o_edit, r_edit) = (o_took, r_took);
        }
        o_bytes.push(wire_bytes(&o_out));
        let sent = r_out
            .lines()
            .find_map(|l| l.strip_prefix("Total bytes sent: "))
            .map(|n| n.replace(',', "").trim().parse::<f64>().unwrap_or(0.0));
        r_bytes.push(sent.unwrap_or(0.0));
    }
    let kib = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "median {:.1} KiB (range {:.1}–{:.1})",
            v[v.len() / 2] / 1024.0,
            v[0] / 1024.0,
            v[v.len() - 1] / 1024.0
        )
    };

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!();
    println!(
        "sync: 2,000 files of 1–8 KB + 5 × 20 MB, cold runs (connect included); fresh runs: median of {FRESH_ROUNDS}"
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>7}",
        "", "outpost", "rsync", "ratio"
    );
    for (label, o, r) in [
        ("fresh push", o_fresh, r_fresh),
        ("re-push (10 changed, 100 touched)", o_re, r_re),
        ("no-op push", o_noop, r_noop),
        ("fresh pull", o_pull, r_pull),
        ("4 KiB edit in a 20 MB file", o_edit, r_edit),
    ] {
        println!(
            "  {label:<34} {:>10} {:>10} {:>6.2}x",
            ms(o),
            ms(r),
            ratio(o, r)
        );
    }
    println!(
        "  floor (cp -a + sync -f, same filesystem): {}; fresh push {:.2}x it (rsync {:.2}x), fresh pull {:.2}x (rsync {:.2}x)",
        ms(floor),
        ratio(o_fresh, floor),
        ratio(r_fresh, floor),
        ratio(o_pull, floor),
        ratio(r_pull, floor)
    );
    println!(
        "  bytes sent for a 4 KiB edit at {EDITS} places: outpost: {} (content; its requests add ~1%)",
        kib(&mut o_bytes)
    );
    println!(
        "                                             rsync:   {} (its Total bytes sent)",
        kib(&mut r_bytes)
    );
}

/// "… (X KiB of content, Y KiB on the wire …" of `outpost sync`'s line, Y
/// in bytes.
fn wire_bytes(out: &str) -> f64 {
    let Some(before) = out.split(" on the wire").next() else {
        return 0.0;
    };
    let Some(amount) = before.rsplit(", ").next() else {
        return 0.0;
    };
    let mut parts = amount.split_whitespace();
    let number: f64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0.0);
    let unit = match parts.next() {
        Some("KiB") => 1024.0,
        Some("MiB") => 1024.0 * 1024.0,
        Some("GiB") => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    number * unit
}
