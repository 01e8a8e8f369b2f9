//! One tree pushed to 8 hosts at once vs to one and rsync in a loop; and one
//! 1 GiB file through `outpost sync` vs the raw SSH channel.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use outpost_e2e::{Sshd, TempDir, noise, target_bin};

use crate::sync::seed_tree;
use crate::{FRESH_ROUNDS, median, ms, ssh_base, timed, write_config};

/// CPU time (user + system) of this process's waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time of the whole machine (all processes, all cores) so far.
fn machine_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(3) // user, nice, system
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// One tree pushed to 8 hosts at once vs to one (`outpost sync SRC
/// h0,…,h7:PATH`, cold CLI runs with the agents installed), and rsync to
/// one host and to 8 in a loop; wall time, the controller's CPU (rsync's
/// own processes and ssh clients for rsync) and the whole machine's CPU
/// (every sshd and agent here too: on a real fleet that half runs on the
/// hosts). Each sshd gives its sessions a HOME of their own, so the one
/// relative path is a tree of its own on each host.
pub(crate) fn fanout() {
    const HOSTS: usize = 8;
    let scratch = TempDir::new("bench-fanout");
    let home_dirs: Vec<TempDir> = (0..HOSTS)
        .map(|i| outpost_e2e::test_user_dir(&format!("bench-fanout-host{i}")))
        .collect();
    let homes: Vec<&Path> = home_dirs.iter().map(TempDir::path).collect();
    let hosts: Vec<Sshd> = homes.iter().map(|h| Sshd::start_with_home(h)).collect();
    let host_refs: Vec<&Sshd> = hosts.iter().collect();
    let config = write_config(scratch.path(), "fan", &host_refs);
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let src = scratch.path().join("src");
    seed_tree(&src);
    let src_arg = format!("{}/", src.display());
    let outpost = |to: String| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", "--no-default-excludes", &src_arg, &to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let rsync = |i: usize, dir: &str| {
        let sshd = &hosts[i];
        let mut cmd = Command::new("rsync");
        cmd.args(["-a", "-e"])
            .arg(format!(
                "ssh -i {} -p {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                sshd.client_key().display(),
                sshd.port()
            ))
            .arg(&src_arg)
            .arg(format!(
                "{}@{}:{}/{dir}/",
                sshd.user(),
                sshd.host(),
                homes[i].display()
            ));
        cmd
    };
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("fan{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let clean = || {
        for home in &homes {
            for entry in std::fs::read_dir(home).unwrap().flatten() {
                if entry.file_name() != ".outpost" {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let _ = Command::new("sync").status();
    };
    // Agents installed and host keys known before anything is timed.
    let empty = scratch.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut warm = Command::new(target_bin("outpost"));
    warm.args([
        "sync",
        &empty.display().to_string(),
        &format!("{}:warm", names(HOSTS)),
    ])
    .env_clear()
    .env("HOME", &home)
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .env("OUTPOST_CONFIG", &config);
    timed(warm);

    // (wall, controller CPU, machine CPU) of one run.
    let measure = |run: &mut dyn FnMut()| {
        clean();
        let (child, machine, t) = (children_cpu(), machine_cpu(), Instant::now());
        run();
        (
            t.elapsed(),
            children_cpu() - child,
            machine_cpu().saturating_sub(machine),
        )
    };
    // (wall, controller CPU, machine CPU) of each run, per row.
    type Runs = Vec<(Duration, Duration, Duration)>;
    let mut rows: Vec<(&str, Runs)> = vec![
        ("outpost, 1 host", Vec::new()),
        ("outpost, 8 hosts at once", Vec::new()),
        ("rsync, 1 host", Vec::new()),
        ("rsync, 8 hosts in a loop", Vec::new()),
    ];
    for _ in 0..FRESH_ROUNDS {
        rows[0].1.push(measure(&mut || {
            let (_, out) = timed(outpost(format!("{}:fan", names(1))));
            assert!(out.contains("2005 files sent"), "{out}");
        }));
        rows[1].1.push(measure(&mut || {
            let (_, out) = timed(outpost(format!("{}:fan", names(HOSTS))));
            assert_eq!(out.matches("2005 files sent").count(), HOSTS, "{out}");
        }));
        rows[2].1.push(measure(&mut || {
            timed(rsync(0, "fan"));
        }));
        rows[3].1.push(measure(&mut || {
            for i in 0..HOSTS {
                timed(rsync(i, "fan"));
            }
        }));
    }
    clean();
    let medians: Runs = rows
        .iter()
        .map(|(_, runs)| {
            (
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
                median(runs.iter().map(|r| r.2).collect()),
            )
        })
        .collect();
    println!();
    println!(
        "fan-out: the sync tree (2,000 files of 1–8 KB + 5 × 20 MB) pushed fresh, median of {FRESH_ROUNDS}; \
         every sshd and agent on this one machine"
    );
    println!(
        "  {:<26} {:>10} {:>8} {:>16} {:>14}",
        "", "wall", "× 1 host", "controller CPU", "machine CPU"
    );
    for (i, (label, _)) in rows.iter().enumerate() {
        let one = if i < 2 { medians[0].0 } else { medians[2].0 };
        let (wall, ctl, machine) = medians[i];
        println!(
            "  {label:<26} {:>10} {:>7.2}x {:>16} {:>14}",
            ms(wall),
            wall.as_secs_f64() / one.as_secs_f64(),
            ms(ctl),
            ms(machine)
        );
    }
    println!(
        "  8 hosts: outpost / rsync loop {:.2}x",
        medians[1].0.as_secs_f64() / medians[3].0.as_secs_f64()
    );
}

/// One 1 GiB file of incompressible data pushed with `outpost sync` (a
/// cold CLI run, the agent installed) vs the raw SSH channel: `cat >
/// file` over a warm ControlMaster connection, to the same sshd; median of
/// rounds, alternating, dirty pages flushed before each.
pub(crate) fn big_file() {
    const SIZE: usize = 1 << 30;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-big-file");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "box", &[&sshd]);
    let file = scratch.path().join("big.bin");
    {
        use std::io::Write as _;
        let mut out = std::fs::File::create(&file).unwrap();
        for i in 0..(SIZE >> 26) as u64 {
            out.write_all(&noise(1 << 26, 9_000 + i)).unwrap();
        }
    }
    let outpost_of = |from: &Path, to: String| {
        let mut cmd = Command::new(target_bin("outpost"));
        cmd.args(["sync", &from.display().to_string(), &to])
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTPOST_CONFIG", &config);
        cmd
    };
    let control = scratch.path().join("cm.sock");
    let mut master = ssh_base(&sshd, &control)
        .args(["-o", "ControlMaster=yes", "-N"])
        .spawn()
        .expect("ssh master");
    let ready = outpost_e2e::wait_until(Duration::from_secs(10), || control.exists());
    assert!(ready, "ControlMaster socket never appeared");
    let remote = |name: &str| sshd.remote_dir().join(name);
    let flush_and_clean = || {
        for name in ["o", "raw"] {
            let _ = std::fs::remove_dir_all(remote(name));
            let _ = std::fs::remove_file(remote(name));
        }
        let _ = Command::new("sync").status();
    };
    // The agent installed (and its connection warm) before anything is
    // timed: a tiny file, not the big one.
    let tiny = scratch.path().join("tiny");
    std::fs::write(&tiny, "x").unwrap();
    timed(outpost_of(
        &tiny,
        format!("box0:{}/", remote("warm").display()),
    ));
    let outpost = |to: String| outpost_of(&file, to);
    let (mut o_runs, mut raw_runs) = (Vec::new(), Vec::new());
    for _ in 0..FRESH_ROUNDS {
        flush_and_clean();
        o_runs.push(timed(outpost(format!("box0:{}/", remote("o").display()))).0);
        assert_eq!(
            std::fs::metadata(remote("o").join("big.bin"))
                .map(|m| m.len())
                .unwrap_or(0),
            SIZE as u64
        );
        flush_and_clean();
        let mut raw = ssh_base(&sshd, &control);
        raw.arg(format!("cat > {}", remote("raw").display()))
            .stdin(std::fs::File::open(&file).unwrap());
        raw_runs.push(timed(raw).0);
    }
    flush_and_clean();
    let _ = std::fs::remove_dir_all(remote("warm"));
    master.kill().ok();
    master.wait().ok();
    let (o, raw) = (median(o_runs), median(raw_runs));
    let rate = |d: Duration| SIZE as f64 / d.as_secs_f64() / 1e6;
    println!();
    println!("one 1 GiB file (incompressible), median of {FRESH_ROUNDS}");
    println!(
        "  outpost sync (hash-checked, flushed)  {:>10}  {:>7.1} MB/s",
        ms(o),
        rate(o)
    );
    println!(
        "  cat > file over ControlMaster          {:>10}  {:>7.1} MB/s",
        ms(raw),
        rate(raw)
    );
    println!(
        "  outpost at {:.0}% of the raw channel's throughput",
        100.0 * raw.as_secs_f64() / o.as_secs_f64()
    );
}
