//! Undo and branch through MCP over stdio, on the `local` host: a
//! checkpoint of a 10,000-file, 1 GiB work dir, its diff, a restore of one
//! path and of the whole tree (byte-identical), later checkpoints that share
//! what did not change, copy-on-write where the filesystem can, a
//! checkpoint taken while a process writes, pause and resume, and a fork
//! that goes its own way.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::mcp_client::{call, start};
use serde_json::{Value, json};

/// The checkpoint's tree on the host: `<sandbox>/meta/checkpoints/N/tree`.
fn checkpoint_tree(work_dir: &str, checkpoint: &str) -> PathBuf {
    let n = checkpoint.rsplit('@').next().unwrap();
    Path::new(work_dir)
        .parent()
        .unwrap()
        .join(format!("meta/checkpoints/{n}/tree"))
}

async fn exec(client: &common::mcp_client::Client, name: &str, command: &str) -> Value {
    let (err, r) = call(
        client,
        "exec_bash",
        json!({"sandbox_name": name, "command": command, "timeout_s": 300}),
    )
    .await;
    assert!(!err, "{command}: {r}");
    assert_eq!(r["exit_code"], 0, "{command}: {r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_restores_a_big_work_dir_exactly_and_names_what_changed() {
    let (client, _home) = start(&[]).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 900}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let work = made["work_dir"].as_str().unwrap().to_string();

    // 10,000 small text files in 100 directories, and 1 GiB in 4 files.
    exec(
        &client,
        &name,
        "python3 - <<'EOF'\nimport os\nfor d in range(100):\n    os.makedirs(f'd{d}', exist_ok=True)\n    for f in range(100):\n        with open(f'd{d}/f{f}.txt', 'w') as out:\n            out.write(''.join(f'line {i} of {d}/{f}\\n' for i in range(40)))\nEOF\nfor i in 0 1 2 3; do head -c 268435456 /dev/zero > big$i; done\nln -s d0/f0.txt link",
    )
    .await;
    let before = common::snapshot(Path::new(&work));
    assert_eq!(
        before.keys().filter(|k| k.ends_with(b".txt")).count(),
        10_000
    );

    let started = Instant::now();
    let (err, ckpt) = call(
        &client,
        "checkpoint_sandbox",
        json!({"sandbox_name": name, "label": "base"}),
    )
    .await;
    assert!(!err, "{ckpt}");
    eprintln!(
        "checkpoint of 10,000 files + 1 GiB: {} ms in the agent, {:?} in all: {ckpt}",
        ckpt["took_ms"],
        started.elapsed()
    );
    let id = ckpt["checkpoint"].as_str().unwrap().to_string();
    assert!(id.starts_with(&format!("{name}@")), "{ckpt}");
    assert_eq!(ckpt["files"], 10_005, "{ckpt}");
    assert!(ckpt["bytes"].as_u64().unwrap() > 1 << 30, "{ckpt}");
    assert_eq!(common::snapshot(&checkpoint_tree(&work, &id)), before);

    // Half the small files removed, the other half and every big one
    // changed, one added.
    exec(
        &client,
        &name,
        "for d in $(seq 0 99); do for f in $(seq 0 2 98); do rm d$d/f$f.txt; echo more >> d$d/f$((f+1)).txt; done; done\nfor i in 0 1 2 3; do printf x | dd of=big$i bs=1 seek=12345 conv=notrunc status=none; done\necho new > added.txt",
    )
    .await;
    let (err, diff) = call(&client, "diff_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{diff}");
    let changes = diff["changes"].as_array().unwrap();
    let more = diff["more"].as_u64().unwrap_or(0);
    assert_eq!(changes.len() as u64 + more, 10_005, "{}", more);
    assert_eq!(changes[0]["path"], "added.txt", "{}", changes[0]);
    assert_eq!(changes[0]["change"], "added");
    assert_eq!(changes[1]["path"], "big0");
    assert_eq!(changes[1]["change"], "changed");
    let first_text = changes
        .iter()
        .find(|c| c["path"] == "d0/f1.txt")
        .expect("d0/f1.txt changed");
    let text = first_text["diff"]
        .as_str()
        .expect("a diff of a small text file");
    assert!(text.contains("+more"), "{text}");
    assert!(
        changes
            .iter()
            .any(|c| c["path"] == "d0/f0.txt" && c["change"] == "removed")
    );

    // One named path back, the rest as it is.
    let (err, r) = call(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": id, "paths": ["d0/f0.txt"]}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["files"], 1, "{r}");
    let now = common::snapshot(Path::new(&work));
    assert_eq!(now.get(&b"d0/f0.txt"[..]), before.get(&b"d0/f0.txt"[..]));
    assert!(!now.contains_key(&b"d0/f2.txt"[..]));

    // Everything back, byte for byte; a second restore writes nothing.
    let started = Instant::now();
    let (err, r) = call(&client, "restore_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    eprintln!(
        "restore: {} ms in the agent, {:?} in all: {r}",
        r["took_ms"],
        started.elapsed()
    );
    assert_eq!(common::snapshot(Path::new(&work)), before);
    let (err, r) = call(&client, "diff_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    assert_eq!(r["changes"], json!([]), "{r}");

    // Exactly what changed, by name.
    exec(
        &client,
        &name,
        "echo x >> d5/f5.txt; rm d6/f6.txt; mkdir -p n/m; echo y > n/m/z; chmod 600 d7/f7.txt",
    )
    .await;
    let (err, r) = call(&client, "diff_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    let named: Vec<(String, String)> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("d5/f5.txt", "changed"),
        ("d6/f6.txt", "removed"),
        ("d7/f7.txt", "changed"),
        ("n", "added"),
    ]
    .iter()
    .map(|(p, c)| (p.to_string(), c.to_string()))
    .collect();
    assert_eq!(named, want, "{r}");

    // A checkpoint after a few edits shares every file unchanged since the
    // one before (the pauses keep the edits clear of the file clock's
    // slack); each still restores exactly.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (err, second) = call(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{second}");
    let at_second = common::snapshot(Path::new(&work));
    tokio::time::sleep(Duration::from_millis(100)).await;
    exec(&client, &name, "echo z >> d8/f8.txt; echo new > d9/new.txt").await;
    let started = Instant::now();
    let (err, third) = call(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{third}");
    eprintln!(
        "checkpoint after 2 edits: {} ms in the agent, {:?} in all: {third}",
        third["took_ms"],
        started.elapsed()
    );
    assert_eq!(third["files"], 10_006, "{third}");
    // All but the symlink and the two edited files.
    assert_eq!(third["unchanged"], 10_003, "{third}");
    let third_id = third["checkpoint"].as_str().unwrap();
    assert_eq!(
        common::snapshot(&checkpoint_tree(&work, third_id)),
        common::snapshot(Path::new(&work))
    );
    let second_id = second["checkpoint"].as_str().unwrap();
    assert_eq!(
        common::snapshot(&checkpoint_tree(&work, second_id)),
        at_second
    );
    let (err, r) = call(
        &client,
        "restore_checkpoint",
        json!({"checkpoint": second_id}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(common::snapshot(Path::new(&work)), at_second);

    let (err, r) = call(&client, "list_checkpoints", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert_eq!(r["checkpoints"][0]["checkpoint"], id.as_str(), "{r}");
    assert_eq!(r["checkpoints"][0]["label"], "base", "{r}");
    for (args, wanted) in [
        (
            json!({"checkpoint": format!("{name}@9")}),
            "no checkpoint 9",
        ),
        (json!({"checkpoint": name.clone()}), "HOST/ID@N"),
        (
            json!({"checkpoint": id, "paths": ["../x"]}),
            "relative to the work dir",
        ),
    ] {
        let (err, r) = call(&client, "restore_checkpoint", args.clone()).await;
        assert!(err, "{args}: {r}");
        assert!(r.to_string().contains(wanted), "{args}: {r}");
    }
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}

/// Where the filesystem shares extents (the XFS scripts/test mounts): a
/// checkpoint shares every file copy-on-write, the next one every file
/// unchanged since, and a restore puts back exactly what changed, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_share_blocks_where_the_filesystem_can() {
    let Some(root) = outpost_e2e::reflink_dir() else {
        return;
    };
    let state = root.join(format!("outpost-checkpoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(state.clone());
    let (client, _home) = start(&[("OUTPOST_STATE_DIR", state.display().to_string())]).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 600}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let work = made["work_dir"].as_str().unwrap().to_string();
    assert!(work.starts_with(&state.display().to_string()), "{made}");
    exec(
        &client,
        &name,
        "for i in $(seq 100); do echo file $i > f$i; done; head -c 67108864 /dev/urandom > big",
    )
    .await;
    let before = common::snapshot(Path::new(&work));

    let (err, first) = call(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{first}");
    assert_eq!(first["files"], 101, "{first}");
    assert_eq!(first["copy_on_write"], 101, "{first}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    exec(
        &client,
        &name,
        "echo more >> f1; printf y | dd of=big bs=1 seek=5 conv=notrunc status=none",
    )
    .await;
    let (err, second) = call(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{second}");
    assert_eq!(second["unchanged"], 99, "{second}");
    assert_eq!(second["copy_on_write"], 2, "{second}");

    let id = first["checkpoint"].as_str().unwrap();
    let (err, r) = call(&client, "restore_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    assert_eq!(r["files"], 2, "{r}");
    assert_eq!(common::snapshot(Path::new(&work)), before);
    // What that restore wrote back shares the checkpoint's blocks: the same.
    let (err, r) = call(&client, "restore_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    assert_eq!(r["files"], 0, "{r}");
    let (err, r) = call(&client, "diff_checkpoint", json!({"checkpoint": id})).await;
    assert!(!err, "{r}");
    assert_eq!(r["changes"], json!([]), "{r}");
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}

/// A checkpoint is of one moment, though a process writes throughout; a
/// pause freezes it, refuses new commands and stops the clock on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_and_pauses_freeze_a_writing_process() {
    let (client, _home) = start(&[]).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "none", "ttl_s": 600}),
    )
    .await;
    assert!(!err, "{made}");
    let name = made["sandbox_name"].as_str().unwrap().to_string();
    let work = made["work_dir"].as_str().unwrap().to_string();
    // Each number goes to `log` (one write), then to `last`.
    exec(
        &client,
        &name,
        "nohup setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i >> log; echo $i > last; done' >/dev/null 2>&1 &\nsleep 0.3",
    )
    .await;
    let lines = |dir: &Path| -> Vec<u64> {
        std::fs::read_to_string(dir.join("log"))
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    };
    for _ in 0..3 {
        let (err, ckpt) = call(&client, "checkpoint_sandbox", json!({"sandbox_name": name})).await;
        assert!(!err, "{ckpt}");
        let tree = checkpoint_tree(&work, ckpt["checkpoint"].as_str().unwrap());
        let log = lines(&tree);
        let n = log.len() as u64;
        assert!(n > 0);
        assert_eq!(log, (1..=n).collect::<Vec<_>>(), "a torn or reordered log");
        // `last` is written after `log`, truncated first: at one moment it
        // holds n, n - 1, or nothing yet.
        let last = std::fs::read_to_string(tree.join("last")).unwrap();
        assert!(
            [String::new(), format!("{n}\n"), format!("{}\n", n - 1)].contains(&last),
            "log ends at {n} but last says {last:?}: not one moment"
        );
    }
    let grows = |at: &Path| {
        let before = std::fs::metadata(at.join("log")).unwrap().len();
        std::thread::sleep(Duration::from_millis(300));
        std::fs::metadata(at.join("log")).unwrap().len() > before
    };
    assert!(grows(Path::new(&work)), "the writer did not go on");

    let (err, r) = call(
        &client,
        "pause_sandbox",
        json!({"sandbox_name": name, "stop_clock": true}),
    )
    .await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "paused", "{r}");
    assert!(!grows(Path::new(&work)), "paused, yet it writes");
    let (err, r) = call(
        &client,
        "exec_bash",
        json!({"sandbox_name": name, "command": "true"}),
    )
    .await;
    assert!(err && r.to_string().contains("resume_sandbox"), "{r}");
    let (err, r) = call(&client, "resume_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    assert_eq!(r["state"], "running", "{r}");
    assert!(grows(Path::new(&work)), "resumed, yet it does not write");
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": name})).await;
    assert!(!err, "{r}");
    client.cancel().await.unwrap();
}

/// A fork has the original's settings and files; each then changes alone,
/// and deleting one leaves the other. In bwrap, so that as root each runs
/// as its own uid and the fork's files are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_goes_its_own_way() {
    let (client, _home) = start(&[]).await;
    let (err, made) = call(
        &client,
        "create_sandbox",
        json!({"host": "local", "isolation": "bwrap", "ttl_s": 600, "env": {"WHO": "sandbox"}}),
    )
    .await;
    assert!(!err, "{made}");
    let original = made["sandbox_name"].as_str().unwrap().to_string();
    exec(
        &client,
        &original,
        "mkdir -p src && echo one > src/a && ln -s src/a link",
    )
    .await;
    let started = Instant::now();
    let (err, fork) = call(&client, "fork_sandbox", json!({"sandbox_name": original})).await;
    assert!(!err, "{fork}");
    eprintln!("fork: {:?}", started.elapsed());
    let forked = fork["sandbox_name"].as_str().unwrap().to_string();
    assert_ne!(forked, original);
    let (err, status) = call(
        &client,
        "get_sandbox_status",
        json!({"sandbox_name": forked}),
    )
    .await;
    assert!(!err, "{status}");
    assert_eq!(status["isolation"], "bwrap", "{status}");
    assert_eq!(status["work_dir"], fork["work_dir"], "{status}");
    let r = exec(
        &client,
        &forked,
        "cat link; echo $WHO; [ $(stat -c %u src/a) = $(id -u) ] && echo own",
    )
    .await;
    assert_eq!(r["stdout"], "one\nsandbox\nown\n", "{r}");
    exec(&client, &forked, "echo fork > src/b").await;
    exec(&client, &original, "echo orig > src/c; echo two > src/a").await;
    let r = exec(&client, &forked, "ls src; cat src/a").await;
    assert_eq!(r["stdout"], "a\nb\none\n", "{r}");
    let r = exec(&client, &original, "ls src").await;
    assert_eq!(r["stdout"], "a\nc\n", "{r}");
    let (err, r) = call(&client, "delete_sandbox", json!({"sandbox_name": original})).await;
    assert!(!err, "{r}");
    let r = exec(&client, &forked, "cat src/b").await;
    assert_eq!(r["stdout"], "fork\n", "{r}");
    client.cancel().await.unwrap();
}
