//! Code contexts over the private sshd: execute_code warm vs `python3 -c`, a
//! context's first run, a bash context, and the worker's RSS.

use std::time::Instant;

use outpost_e2e::{Sshd, TempDir};
use rmcp::model::CallToolRequestParams;
use serde_json::json;

use crate::{Client, exec_true_in, mcp_client, median, ms, pct, tool, write_config};

/// execute_code's JSON (its first text block); panics on a tool error or
/// an exception.
async fn run_code(client: &Client, args: serde_json::Value) -> serde_json::Value {
    let result = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect("execute_code");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let text = result.content[0]
        .as_text()
        .expect("a text block")
        .text
        .clone();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(value.get("error").is_none(), "{value}");
    value
}

pub(crate) async fn code() {
    const ROUNDS: usize = 200;
    const COLD_ROUNDS: usize = 8;
    let sshd = Sshd::start();
    let scratch = TempDir::new("bench-code");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = write_config(scratch.path(), "bench", &[&sshd]);
    let client = mcp_client(&home, Some(&config)).await;
    // Warm: connection, agent, daemon, a context.
    exec_true_in(&client, "bench0", "true", 5).await;
    run_code(&client, json!({"code": "1+1", "sandbox_name": "bench0"})).await;

    let mut cold = Vec::new();
    for i in 0..COLD_ROUNDS {
        let t = Instant::now();
        run_code(
            &client,
            json!({"code": "1+1", "context": format!("cold{i}"), "sandbox_name": "bench0"}),
        )
        .await;
        cold.push(t.elapsed());
    }
    let (mut warm, mut python_c, mut bash, mut exec_true) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    run_code(
        &client,
        json!({"code": "true", "language": "bash", "context": "sh", "sandbox_name": "bench0"}),
    )
    .await;
    // Interleaved, so drift hits all alike.
    for _ in 0..ROUNDS / 10 {
        for _ in 0..10 {
            let t = Instant::now();
            let r = run_code(&client, json!({"code": "1+1", "sandbox_name": "bench0"})).await;
            warm.push(t.elapsed());
            assert_eq!(r["results"][0]["text/plain"], "2", "{r}");
        }
        for _ in 0..10 {
            let t = Instant::now();
            run_code(
                &client,
                json!({"code": "true", "language": "bash", "context": "sh", "sandbox_name": "bench0"}),
            )
            .await;
            bash.push(t.elapsed());
        }
        python_c.push(exec_true_in(&client, "bench0", "python3 -c 'print(1+1)'", 10).await);
        exec_true.push(exec_true_in(&client, "bench0", "true", 10).await);
    }
    let rss = |r: serde_json::Value| -> String {
        // The last result is the final expression's (a figure comes first).
        r["results"]
            .as_array()
            .and_then(|all| all.last())
            .and_then(|last| last["text/plain"].as_str())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or_else(|| "?".into(), |kb| format!("{:.1} MiB", kb / 1024.0))
    };
    let peak = "import resource; resource.getrusage(resource.RUSAGE_SELF).ru_maxrss";
    let bare = rss(run_code(
        &client,
        json!({"code": peak, "context": "cold0", "sandbox_name": "bench0"}),
    )
    .await);
    let plotted = rss(run_code(
        &client,
        json!({"code": format!("import numpy, matplotlib.pyplot as plt\nplt.plot([1, 2])\n{peak}"),
                   "context": "cold1", "sandbox_name": "bench0"}),
    )
    .await);
    // In a bwrap sandbox: the worker was started through `enter` once; a
    // warm run pays nothing for the isolation.
    let made = tool(
        &client,
        "create_sandbox",
        json!({"host": "bench0", "isolation": "bwrap", "network": false}),
    )
    .await;
    let sandbox = made["sandbox_name"].as_str().unwrap().to_string();
    let t = Instant::now();
    run_code(&client, json!({"code": "1+1", "sandbox_name": sandbox})).await;
    let sandbox_cold = t.elapsed();
    let mut in_sandbox = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        run_code(&client, json!({"code": "1+1", "sandbox_name": sandbox})).await;
        in_sandbox.push(t.elapsed());
    }
    tool(&client, "delete_sandbox", json!({"sandbox_name": sandbox})).await;
    client.cancel().await.ok();
    let (warm_med, python_med) = (median(warm.clone()), median(python_c));

    println!();
    println!("code contexts over SSH, warm client");
    println!(
        "  execute_code('1+1'), warm context        median {}  p90 {}  (target ≤ 5 ms)",
        ms(warm_med),
        ms(pct(warm, 0.9))
    );
    println!(
        "  exec_bash(\"python3 -c 'print(1+1)'\")    median {}  ({:.2}× execute_code)",
        ms(python_med),
        python_med.as_secs_f64() / warm_med.as_secs_f64()
    );
    println!(
        "  exec_bash('true')                        median {}",
        ms(median(exec_true))
    );
    println!(
        "  execute_code(bash 'true'), warm context  median {}",
        ms(median(bash))
    );
    println!(
        "  first run of a new context (worker start) median {}  p90 {}",
        ms(median(cold.clone())),
        ms(pct(cold, 0.9))
    );
    println!(
        "  execute_code('1+1') in a bwrap sandbox   median {}  (first run there {})",
        ms(median(in_sandbox)),
        ms(sandbox_cold)
    );
    println!(
        "  worker peak RSS: bare {bare}, after importing numpy + matplotlib and a plot {plotted}"
    );
}
